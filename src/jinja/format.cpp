#include "jinja/format.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/error.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

void check_width(int64_t width) {
  if (width > kMaxFormatWidth) {
    throw Error(ErrorKind::Limit, "format width or precision " + std::to_string(width) + " is above the limit of " +
                                      std::to_string(kMaxFormatWidth));
  }
}

// Reads decimal digits at s[pos...]; -1 when there are none.
int64_t read_number(std::string_view s, size_t& pos) {
  if (pos >= s.size() || s[pos] < '0' || s[pos] > '9') return -1;
  int64_t n = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    n = n * 10 + (s[pos] - '0');
    check_width(n);
    ++pos;
  }
  return n;
}

// Pads text to `width` code points: align '<', '>', '^' or '=' (after a sign or prefix of
// `sign_length` bytes).
std::string pad(const std::string& body, int64_t width, char align, const std::string& fill, size_t sign_length = 0) {
  const int64_t length = static_cast<int64_t>(text::length(body));
  if (width <= length) return body;
  const int64_t missing = width - length;
  const auto repeat = [&](int64_t n) {
    std::string s;
    for (int64_t i = 0; i < n; ++i) s += fill;
    return s;
  };
  switch (align) {
    case '<': return body + repeat(missing);
    case '^': return repeat(missing / 2) + body + repeat(missing - missing / 2);
    case '=': return body.substr(0, sign_length) + repeat(missing) + body.substr(sign_length);
    default: return repeat(missing) + body;
  }
}


std::string digits_in_base(uint64_t magnitude, int base, bool upper) {
  if (magnitude == 0) return "0";
  std::string s;
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  while (magnitude != 0) {
    s += digits[magnitude % static_cast<uint64_t>(base)];
    magnitude /= static_cast<uint64_t>(base);
  }
  return std::string(s.rbegin(), s.rend());
}

uint64_t magnitude_of(int64_t v) { return v < 0 ? uint64_t(0) - static_cast<uint64_t>(v) : static_cast<uint64_t>(v); }

// Inserts a separator every three digits of the integer part of a number's text.
std::string group_digits(const std::string& number, char separator) {
  size_t start = 0;
  while (start < number.size() && (number[start] < '0' || number[start] > '9')) ++start;
  size_t end = start;
  while (end < number.size() && number[end] >= '0' && number[end] <= '9') ++end;
  const std::string digits = number.substr(start, end - start);
  std::string grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) grouped += separator;
    grouped += digits[i];
  }
  return number.substr(0, start) + grouped + number.substr(end);
}

std::string c_format_double(const char* conversion, int precision, double x, bool alternate = false) {
  char spec[16];
  std::snprintf(spec, sizeof spec, "%%%s.%d%s", alternate ? "#" : "", precision, conversion);
  const int n = std::snprintf(nullptr, 0, spec, x);
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, spec, x);
  return out;
}

const Value& positional_arg(const Arguments& args, size_t index) {
  if (index >= args.positional.size()) {
    throw Error(ErrorKind::Type, "Replacement index " + std::to_string(index) + " out of range for positional args tuple");
  }
  return args.positional[index];
}

}  // namespace

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(result.ptr - buf));
  // sci is [-]d[.ddd]e(+|-)dd: split into sign, significant digits and exponent.
  const bool negative = sci[0] == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += exponent < 0 ? "e-" : "e+";
    const int magnitude = exponent < 0 ? -exponent : exponent;
    if (magnitude < 10) out += '0';
    out += std::to_string(magnitude);
  } else if (exponent >= 0) {
    const size_t int_digits = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_digits) {
      out += digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  } else {
    out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  }
  return out;
}

// --- printf-style ------------------------------------------------------------------------

namespace {

// The right operand of str % args, as the conversions take their values from it.
struct PercentArguments {
  explicit PercentArguments(const Value& args) {
    if (args.is_list() && args.list_flavor() == ListFlavor::Tuple) {
      values = args.items();
      return;
    }
    values.push_back(args);
    if (args.is_dict()) mapping = &args;
    subscriptable = args.is_dict() || args.is_undefined() ||
                    (args.is_list() && (args.list_flavor() == ListFlavor::List || args.list_flavor() == ListFlavor::Range));
  }

  std::vector<Value> values;
  const Value* mapping = nullptr;  // a dict operand serves %(key)s conversions
  // Python skips the "not all arguments converted" check when the right operand supports
  // subscripting (PyMapping_Check: dicts, but also lists and ranges) and is not a tuple.
  bool subscriptable = false;
  size_t next = 0;  // the next of values a conversion without a key takes
};

// One conversion after its '%' (and its "(key)"): flags, width, precision, type.
struct PercentSpec {
  bool left = false, plus = false, space = false, alternate = false, zero = false;
  int64_t width = -1;
  int64_t precision = -1;
  char conversion = 0;
  size_t conversion_index = 0;  // where the type character is in the format, for errors
};

// A conversion's text before padding: the sign (with a 0x / 0o prefix) and the body.
struct PercentText {
  std::string sign;
  std::string body;
  bool numeric = false;
};

// Reads "(key)" at format[pos] when there is one: the mapping's value for the key.
const Value* read_mapping_key(std::string_view format, size_t& pos, const PercentArguments& arguments) {
  if (format[pos] != '(') return nullptr;
  const size_t close = format.find(')', pos);
  if (close == std::string_view::npos) type_error("incomplete format key");
  if (arguments.mapping == nullptr) type_error("format requires a mapping");
  const std::string key(format.substr(pos + 1, close - pos - 1));
  const Value* value = arguments.mapping->dict_value().find(key);
  if (value == nullptr) type_error("KeyError: " + text::repr(key));
  pos = close + 1;
  return value;
}

PercentSpec read_percent_spec(std::string_view format, size_t& pos) {
  PercentSpec spec;
  while (pos < format.size() && std::string_view("-+ #0").find(format[pos]) != std::string_view::npos) {
    switch (format[pos]) {
      case '-': spec.left = true; break;
      case '+': spec.plus = true; break;
      case ' ': spec.space = true; break;
      case '#': spec.alternate = true; break;
      default: spec.zero = true; break;
    }
    ++pos;
  }
  if (pos < format.size() && format[pos] == '*') type_error("* wants int");
  spec.width = read_number(format, pos);
  if (pos < format.size() && format[pos] == '.') {
    ++pos;
    spec.precision = read_number(format, pos);
    if (spec.precision < 0) spec.precision = 0;
  }
  while (pos < format.size() && (format[pos] == 'l' || format[pos] == 'h' || format[pos] == 'L')) ++pos;
  if (pos >= format.size()) type_error("incomplete format");
  spec.conversion_index = pos;
  spec.conversion = format[pos++];
  return spec;
}

std::string percent_char(const Value& value) {
  std::string body;
  if (value.is_int()) {
    if (value.int_value() < 0 || value.int_value() > 0x10FFFF) type_error("%c arg not in range(0x110000)");
    text::append_utf8(body, static_cast<uint32_t>(value.int_value()));
  } else if (value.is_string() && text::length(value.string_value()) == 1) {
    body = value.string_value();
  } else {
    type_error("%c requires an int or a unicode character, not " + std::string(value.python_type()));
  }
  return body;
}

// %d %i %u %x %X %o; %d %i %u also take a float (truncated).
PercentText percent_integer(const PercentSpec& spec, const Value& value) {
  const char conversion = spec.conversion;
  int64_t v;
  if (value.is_int() || value.is_bool()) {
    v = value.is_bool() ? value.bool_value() : value.int_value();
  } else if (value.is_float() && (conversion == 'd' || conversion == 'i' || conversion == 'u')) {
    const double f = value.float_value();
    if (!std::isfinite(f)) type_error("cannot convert float " + float_repr(f) + " to integer");
    if (std::fabs(f) >= 9.2e18) type_error("integer too large to format");
    v = static_cast<int64_t>(f);
  } else {
    type_error(std::string("%") + conversion + " format: " +
               (conversion == 'x' || conversion == 'X' || conversion == 'o' ? "an integer" : "a real number") +
               " is required, not " + value.python_type());
  }
  PercentText out;
  out.numeric = true;
  const int base = conversion == 'x' || conversion == 'X' ? 16 : conversion == 'o' ? 8 : 10;
  out.body = digits_in_base(magnitude_of(v), base, conversion == 'X');
  if (spec.precision > static_cast<int64_t>(out.body.size())) {
    out.body = std::string(spec.precision - out.body.size(), '0') + out.body;
  }
  if (spec.alternate && base == 16) out.sign = conversion == 'X' ? "0X" : "0x";
  if (spec.alternate && base == 8) out.sign = "0o";
  out.sign = (v < 0 ? "-" : spec.plus ? "+" : spec.space ? " " : "") + out.sign;
  return out;
}

// %f %F %e %E %g %G.
PercentText percent_float(const PercentSpec& spec, const Value& value) {
  if (!value.is_number()) type_error(std::string("must be real number, not ") + value.python_type());
  PercentText out;
  out.numeric = true;
  const double f = value.as_double();
  const char conv[2] = {spec.conversion, '\0'};
  out.body = c_format_double(conv, spec.precision < 0 ? 6 : static_cast<int>(spec.precision), std::fabs(f),
                             spec.alternate);
  out.sign = std::signbit(f) && !std::isnan(f) ? "-" : spec.plus ? "+" : spec.space ? " " : "";
  return out;
}

PercentText percent_text(const PercentSpec& spec, const Value& value) {
  const char conversion = spec.conversion;
  if (value.is_undefined() && conversion != 's' && conversion != 'r' && conversion != 'a') {
    throw Error(ErrorKind::Undefined, value.undefined_message());
  }
  switch (conversion) {
    case 's': return {"", value.str(), false};
    case 'r':
    case 'a': return {"", value.repr(), false};
    case 'c': return {"", percent_char(value), false};
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o': return percent_integer(spec, value);
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G': return percent_float(spec, value);
    default: {
      char hex[8];
      std::snprintf(hex, sizeof hex, "%#x", static_cast<unsigned>(static_cast<uint8_t>(conversion)));
      type_error(std::string("unsupported format character '") + conversion + "' (" + hex + ") at index " +
                 std::to_string(spec.conversion_index));
    }
  }
}

// One conversion's field: the text cut to the precision (strings) and padded to the width.
std::string render_percent_field(const PercentSpec& spec, const Value& value) {
  PercentText converted = percent_text(spec, value);
  std::string& body = converted.body;
  if (!converted.numeric && spec.precision >= 0 && spec.conversion != 'c') {
    const std::vector<size_t> offsets = text::code_point_offsets(body);
    if (static_cast<size_t>(spec.precision) + 1 < offsets.size()) body.resize(offsets[static_cast<size_t>(spec.precision)]);
  }
  std::string field = converted.sign + body;
  const int64_t length = static_cast<int64_t>(text::length(field));
  if (spec.width > length) {
    if (spec.left) {
      field += std::string(static_cast<size_t>(spec.width - length), ' ');
    } else if (spec.zero && converted.numeric) {
      field = converted.sign + std::string(static_cast<size_t>(spec.width - length), '0') + body;
    } else {
      field = std::string(static_cast<size_t>(spec.width - length), ' ') + field;
    }
  }
  return field;
}

}  // namespace

std::string percent_format(std::string_view format, const Value& args) {
  PercentArguments arguments(args);
  std::string out;
  out.reserve(format.size());
  size_t pos = 0;
  while (pos < format.size()) {
    const size_t percent = format.find('%', pos);
    if (percent == std::string_view::npos) {
      out.append(format.substr(pos));
      break;
    }
    out.append(format.substr(pos, percent - pos));
    pos = percent + 1;
    if (pos >= format.size()) type_error("incomplete format");
    const Value* value = read_mapping_key(format, pos, arguments);
    const PercentSpec spec = read_percent_spec(format, pos);
    if (spec.conversion == '%') {
      out += '%';
      continue;
    }
    if (value == nullptr) {
      if (arguments.next >= arguments.values.size()) type_error("not enough arguments for format string");
      value = &arguments.values[arguments.next++];
    }
    out += render_percent_field(spec, *value);
  }
  if (!arguments.subscriptable && arguments.next < arguments.values.size()) {
    type_error("not all arguments converted during string formatting");
  }
  return out;
}

// --- format-spec mini-language -------------------------------------------------------------

namespace {

struct FormatSpec {
  std::string fill = " ";
  char align = 0;
  char sign = '-';
  bool alternate = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

FormatSpec parse_spec(std::string_view spec) {
  FormatSpec f;
  size_t pos = 0;
  const auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (!spec.empty()) {
    size_t after_first = 0;
    text::next_code_point(spec, after_first);
    if (after_first < spec.size() && is_align(spec[after_first])) {
      f.fill = std::string(spec.substr(0, after_first));
      f.align = spec[after_first];
      pos = after_first + 1;
    } else if (is_align(spec[0])) {
      f.align = spec[0];
      pos = 1;
    }
  }
  if (pos < spec.size() && (spec[pos] == '+' || spec[pos] == '-' || spec[pos] == ' ')) f.sign = spec[pos++];
  if (pos < spec.size() && spec[pos] == '#') {
    f.alternate = true;
    ++pos;
  }
  if (pos < spec.size() && spec[pos] == '0') {
    f.zero = true;
    ++pos;
  }
  f.width = read_number(spec, pos);
  if (pos < spec.size() && (spec[pos] == ',' || spec[pos] == '_')) f.grouping = spec[pos++];
  if (pos < spec.size() && spec[pos] == '.') {
    ++pos;
    f.precision = read_number(spec, pos);
    if (f.precision < 0) type_error("Format specifier missing precision");
  }
  if (pos < spec.size()) f.type = spec[pos++];
  if (pos != spec.size()) {
    std::string message = "Invalid format specifier '";
    message += spec;
    message += "'";
    type_error(message);
  }
  if (f.zero && f.align == 0) {
    f.fill = std::string(1, '0');  // not = "0": GCC 12 warns falsely (-Wrestrict) on that assignment
    f.align = '=';
  }
  return f;
}

std::string sign_text(bool negative, char sign) {
  if (negative) return "-";
  if (sign == '+') return "+";
  if (sign == ' ') return " ";
  return "";
}

std::string format_float(double x, const FormatSpec& f) {
  const double magnitude = std::fabs(x);
  const bool negative = std::signbit(x) && !std::isnan(x);
  std::string body;
  const int precision = f.precision < 0 ? 6 : static_cast<int>(f.precision);
  switch (f.type) {
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G': {
      const char conv[2] = {f.type, '\0'};
      body = c_format_double(conv, precision, magnitude, f.alternate);
      break;
    }
    case '%':
      body = c_format_double("f", precision, magnitude * 100.0, f.alternate) + "%";
      break;
    case 0:
    case 'n':
      if (f.precision < 0) {
        body = float_repr(magnitude);
      } else if (f.precision == 0) {
        body = c_format_double("e", 0, magnitude);
      } else {
        body = c_format_double("g", precision, magnitude);
        if (std::isfinite(magnitude) && body.find_first_of(".e") == std::string::npos) body += ".0";
      }
      break;
    default:
      type_error(std::string("Unknown format code '") + f.type + "' for object of type 'float'");
  }
  if (f.grouping != 0) body = group_digits(body, f.grouping);
  const std::string sign = sign_text(negative, f.sign);
  return pad(sign + body, f.width, f.align == 0 ? '>' : f.align, f.fill, sign.size());
}

std::string format_int(int64_t v, const FormatSpec& f) {
  if (f.type == 'e' || f.type == 'E' || f.type == 'f' || f.type == 'F' || f.type == 'g' || f.type == 'G' ||
      f.type == '%') {
    return format_float(static_cast<double>(v), f);
  }
  if (f.precision >= 0) type_error("Precision not allowed in integer format specifier");
  std::string body;
  std::string prefix;
  switch (f.type) {
    case 0:
    case 'd':
    case 'n': body = digits_in_base(magnitude_of(v), 10, false); break;
    case 'x':
    case 'X':
      body = digits_in_base(magnitude_of(v), 16, f.type == 'X');
      if (f.alternate) prefix = f.type == 'X' ? "0X" : "0x";
      break;
    case 'o':
      body = digits_in_base(magnitude_of(v), 8, false);
      if (f.alternate) prefix = "0o";
      break;
    case 'b':
      body = digits_in_base(magnitude_of(v), 2, false);
      if (f.alternate) prefix = "0b";
      break;
    case 'c':
      if (v < 0 || v > 0x10FFFF) type_error("%c arg not in range(0x110000)");
      text::append_utf8(body, static_cast<uint32_t>(v));
      return pad(body, f.width, f.align == 0 ? '<' : f.align, f.fill);
    default: type_error(std::string("Unknown format code '") + f.type + "' for object of type 'int'");
  }
  if (f.grouping != 0) body = group_digits(body, f.grouping);
  const std::string sign = sign_text(v < 0, f.sign) + prefix;
  return pad(sign + body, f.width, f.align == 0 ? '>' : f.align, f.fill, sign.size());
}

}  // namespace

std::string format_value(const Value& v, std::string_view spec) {
  if (spec.empty()) return v.str();
  const FormatSpec f = parse_spec(spec);
  check_width(f.width);
  check_width(f.precision);
  if (v.is_int() || v.is_bool()) return format_int(v.is_bool() ? v.bool_value() : v.int_value(), f);
  if (v.is_float()) return format_float(v.float_value(), f);
  if (v.is_string()) {
    if (f.type != 0 && f.type != 's') {
      type_error(std::string("Unknown format code '") + f.type + "' for object of type 'str'");
    }
    if (f.sign != '-') type_error("Sign not allowed in string format specifier");
    if (f.align == '=') type_error("'=' alignment not allowed in string format specifier");
    std::string body = v.string_value();
    if (f.precision >= 0) {
      const std::vector<size_t> offsets = text::code_point_offsets(body);
      if (static_cast<size_t>(f.precision) + 1 < offsets.size()) body.resize(offsets[static_cast<size_t>(f.precision)]);
    }
    return pad(body, f.width, f.align == 0 ? '<' : f.align, f.fill);
  }
  type_error(std::string("unsupported format string passed to ") + v.python_type() + ".__format__");
}

// --- str.format ----------------------------------------------------------------------------

namespace {

// A replacement field "{argument.attribute[key]!conversion:spec}" in its parts.
struct ReplacementField {
  std::string_view argument;  // empty (the next positional), digits (a positional index) or a name
  std::string_view path;      // the .attribute and [key] parts
  char conversion = 0;
  std::string_view spec;
};

ReplacementField parse_replacement_field(std::string_view field) {
  ReplacementField parsed;
  const size_t colon = field.find(':');
  if (colon != std::string_view::npos) {
    parsed.spec = field.substr(colon + 1);
    field = field.substr(0, colon);
  }
  const size_t bang = field.find('!');
  if (bang != std::string_view::npos) {
    if (bang + 2 != field.size()) type_error("expected ':' after conversion specifier");
    parsed.conversion = field[bang + 1];
    field = field.substr(0, bang);
  }
  size_t name_end = 0;
  while (name_end < field.size() && field[name_end] != '.' && field[name_end] != '[') ++name_end;
  parsed.argument = field.substr(0, name_end);
  parsed.path = field.substr(name_end);
  return parsed;
}

// The arguments the fields name. Python refuses to mix automatic numbering ("{}") with
// manual numbering ("{0}") in one format.
class FormatArguments {
 public:
  explicit FormatArguments(const Arguments& args) : args_(args) {}

  Value find(std::string_view name) {
    if (name.empty()) {
      if (used_manual_) type_error("cannot switch from manual field specification to automatic field numbering");
      used_auto_ = true;
      return positional_arg(args_, auto_index_++);
    }
    if (name.find_first_not_of("0123456789") == std::string_view::npos) {
      if (used_auto_) type_error("cannot switch from automatic field numbering to manual field specification");
      used_manual_ = true;
      size_t p = 0;
      return positional_arg(args_, static_cast<size_t>(read_number(name, p)));
    }
    for (const auto& [key, v] : args_.keyword) {
      if (key == name) return v;
    }
    type_error("KeyError: " + text::repr(name));
  }

 private:
  const Arguments& args_;
  size_t auto_index_ = 0;
  bool used_auto_ = false, used_manual_ = false;
};

// Applies a field's .attribute and [key] parts to the argument.
Value follow_field_path(Value value, std::string_view path, FieldLookup lookup) {
  size_t p = 0;
  while (p < path.size()) {
    if (path[p] == '.') {
      size_t end = p + 1;
      while (end < path.size() && path[end] != '.' && path[end] != '[') ++end;
      value = lookup(value, Value::string(std::string(path.substr(p + 1, end - p - 1))), true);
      p = end;
    } else {
      const size_t end = path.find(']', p);
      if (end == std::string_view::npos) type_error("Missing ']' in format string");
      const std::string_view key = path.substr(p + 1, end - p - 1);
      size_t digits = 0;
      const bool numeric = !key.empty() && key.find_first_not_of("0123456789") == std::string_view::npos;
      value = lookup(value, numeric ? Value::integer(read_number(key, digits)) : Value::string(std::string(key)), false);
      p = end + 1;
    }
  }
  return value;
}

std::string render_replacement_field(const ReplacementField& field, FormatArguments& arguments, FieldLookup lookup) {
  Value value = follow_field_path(arguments.find(field.argument), field.path, lookup);
  if (value.is_undefined() && value.undefined_reason() != UndefinedReason::Missing) {
    throw Error(ErrorKind::Undefined, value.undefined_message());
  }
  if (field.conversion == 'r' || field.conversion == 'a') {
    value = Value::string(value.repr());
  } else if (field.conversion == 's') {
    value = Value::string(value.str());
  } else if (field.conversion != 0) {
    type_error(std::string("Unknown conversion specifier ") + field.conversion);
  }
  return format_value(value, field.spec);
}

}  // namespace

std::string str_format(std::string_view format, const Arguments& args, FieldLookup lookup) {
  FormatArguments arguments(args);
  std::string out;
  out.reserve(format.size());
  size_t pos = 0;
  while (pos < format.size()) {
    const char c = format[pos];
    if (c == '}') {
      if (pos + 1 < format.size() && format[pos + 1] == '}') {
        out += '}';
        pos += 2;
        continue;
      }
      type_error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++pos;
      continue;
    }
    if (pos + 1 < format.size() && format[pos + 1] == '{') {
      out += '{';
      pos += 2;
      continue;
    }
    // A replacement field: find its closing brace (nested braces are not supported).
    const size_t close = format.find('}', pos + 1);
    if (close == std::string_view::npos) type_error("expected '}' before end of string");
    const std::string_view field = format.substr(pos + 1, close - pos - 1);
    if (field.find('{') != std::string_view::npos) type_error("nested replacement fields are not supported");
    pos = close + 1;
    out += render_replacement_field(parse_replacement_field(field), arguments, lookup);
  }
  return out;
}

}  // namespace step35::jinja
