// jinja2's built-in filters (jinja2/filters.py is the specification), with transformers'
// tojson. Filters that jinja2 returns as generators (map, select, reject, selectattr,
// rejectattr, items, unique, batch, reverse of a list) return one-shot iterators here too,
// so that they print, test true and refuse len() as they do there.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/format.h"
#include "jinja/interpreter.h"
#include "jinja/json.h"
#include "jinja/operators.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

// jinja2's soft_str: Markup stays Markup, everything else becomes str(value).
Value soft_str(const Value& v) {
  if (v.is_string()) return v;
  return Value::string(v.str());
}

int64_t int_argument(const char* filter, const Value& v) {
  if (v.is_int()) return v.int_value();
  if (v.is_bool()) return v.bool_value();
  type_error(std::string(filter) + ": '" + v.python_type() + "' object cannot be interpreted as an integer");
}

// An attribute path "a.b.0" as make_attrgetter splits it: digit parts are integers.
std::vector<Value> attribute_path(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) {
    parts.push_back(attribute);
    return parts;
  }
  const std::string& s = attribute.string_value();
  size_t begin = 0;
  while (true) {
    const size_t dot = s.find('.', begin);
    const std::string part = s.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    if (digits && part.size() < 19) {
      parts.push_back(Value::integer(std::strtoll(part.c_str(), nullptr, 10)));
    } else {
      parts.push_back(Value::string(part));
    }
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  return parts;
}

Value lookup_path(Value item, const std::vector<Value>& path, const Value* default_value = nullptr) {
  for (const Value& part : path) {
    item = get_item(item, part);
    if (default_value != nullptr && !default_value->is_none() && item.is_undefined()) item = *default_value;
  }
  return item;
}

Value lowered(const Value& v) { return v.is_string() ? Value::string(text::lower(v.string_value())) : v; }

// Sort keys as jinja2 builds them: the item or its attribute(s), strings lowered unless
// case_sensitive; a comma-separated attribute list gives a list of keys.
std::vector<Value> sort_keys_of(const std::vector<Value>& items, const Value& attribute, bool case_sensitive, bool multi) {
  std::vector<std::vector<Value>> paths;
  if (multi && attribute.is_string()) {
    const std::string& s = attribute.string_value();
    size_t begin = 0;
    while (true) {
      const size_t comma = s.find(',', begin);
      paths.push_back(attribute_path(Value::string(s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin))));
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
  } else {
    paths.push_back(attribute_path(attribute));
  }
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    if (multi) {
      std::vector<Value> parts;
      for (const auto& path : paths) {
        const Value v = lookup_path(item, path);
        parts.push_back(case_sensitive ? v : lowered(v));
      }
      keys.push_back(Value::list(std::move(parts)));
    } else {
      const Value v = lookup_path(item, paths[0]);
      keys.push_back(case_sensitive ? v : lowered(v));
    }
  }
  return keys;
}

std::vector<Value> sorted(Interpreter& interp, std::vector<Value> items, const std::vector<Value>& keys, bool reverse) {
  interp.charge(items.size() * 4 + 1);
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? compare("<", keys[b], keys[a]) : compare("<", keys[a], keys[b]);
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

std::string join_strings(Interpreter& interp, const std::vector<Value>& items, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i != 0) out += separator;
    items[i].append_str(out);
    interp.check_value_size(out.size());
  }
  return out;
}

// Python's int(str, base): optional sign and whitespace, underscores between digits, a
// 0b/0o/0x prefix when it matches the base (or base 0).
bool parse_python_int(std::string_view s, int64_t base, int64_t& out) {
  s = text::strip(s, true, true);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.size() >= 2 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    const int64_t prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      base = prefixed;
      s.remove_prefix(2);
      if (!s.empty() && s[0] == '_') s.remove_prefix(1);
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || s.empty()) return false;
  uint64_t value = 0;
  bool previous_digit = false;
  for (char c : s) {
    if (c == '_') {
      if (!previous_digit) return false;
      previous_digit = false;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') {
      d = (c | 0x20) - 'a' + 10;
    } else {
      return false;
    }
    if (d >= base) return false;
    if (__builtin_mul_overflow(value, static_cast<uint64_t>(base), &value) ||
        __builtin_add_overflow(value, static_cast<uint64_t>(d), &value)) {
      return false;
    }
    previous_digit = true;
  }
  if (!previous_digit) return false;
  if (value > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return false;
  out = negative ? static_cast<int64_t>(uint64_t(0) - value) : static_cast<int64_t>(value);
  return true;
}

// Python's float(str): decimal or exponent forms, inf/nan, underscores between digits.
bool parse_python_float(std::string_view s, double& out) {
  s = text::strip(s, true, true);
  std::string cleaned;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
        return false;
      }
      continue;
    }
    cleaned += s[i];
  }
  if (cleaned.empty()) return false;
  const std::string lower = text::lower(cleaned);
  const std::string_view body = std::string_view(lower).substr(lower[0] == '+' || lower[0] == '-' ? 1 : 0);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double v = body == "nan" ? std::nan("") : INFINITY;
    out = lower[0] == '-' ? -v : v;
    return true;
  }
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-')) return false;
  char* end = nullptr;
  out = std::strtod(cleaned.c_str(), &end);
  return end == cleaned.c_str() + cleaned.size();
}

// Python's round(x, n) for floats: correctly rounded, ties to even on the exact value.
double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits >= 0) {
    if (digits > 400) return x;  // beyond the smallest subnormal's digits: nothing to round
    const int precision = static_cast<int>(digits);
    std::string text(static_cast<size_t>(std::snprintf(nullptr, 0, "%.*f", precision, x)), '\0');
    std::snprintf(text.data(), text.size() + 1, "%.*f", precision, x);
    return std::strtod(text.c_str(), nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(x / scale) * scale;
}

// --- the filters ------------------------------------------------------------------------------

using FilterFn = Value (*)(Interpreter& interp, const Value& input, Arguments& args);

Value f_abs(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("abs", args, {});
  if (v.is_wide_int()) return v;  // above 2**63-1: already its own absolute value
  if (v.is_int() || v.is_bool()) {
    const int64_t i = v.is_bool() ? v.bool_value() : v.int_value();
    if (i == INT64_MIN) type_error("integer overflow (step35 keeps integers in 64 bits)");
    return Value::integer(i < 0 ? -i : i);
  }
  if (v.is_float()) return Value::number(std::fabs(v.float_value()));
  type_error(std::string("bad operand type for abs(): '") + v.python_type() + "'");
}

Value f_attr(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_attr", args, {{"name", std::nullopt}});
  if (!a[0].is_string()) type_error("attribute name must be a string");
  auto name = std::make_shared<const std::string>(a[0].string_value());
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_dict()) {
    if (find_method(v, *name) == MethodAccess::None) return Value::undefined_attribute(v.object_type(), name);
  }
  return get_attribute(v, name);
}

Value f_batch(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_batch", args, {{"linecount", std::nullopt}, {"fill_with", Value::none()}});
  const int64_t count = int_argument("batch", a[0]);
  const std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  std::vector<Value> batches;
  std::vector<Value> current;
  for (const Value& item : items) {
    if (static_cast<int64_t>(current.size()) == count) {
      batches.push_back(Value::list(std::move(current)));
      current.clear();
    }
    current.push_back(item);
  }
  if (!current.empty()) {
    if (!a[1].is_none() && static_cast<int64_t>(current.size()) < count) {
      interp.check_list_size(static_cast<size_t>(count));
      current.resize(static_cast<size_t>(count), a[1]);
    }
    batches.push_back(Value::list(std::move(current)));
  }
  return Value::iterator(std::move(batches), "generator");
}

Value f_capitalize(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("do_capitalize", args, {});
  const Value s = soft_str(v);
  return Value::string_like(s, text::python_capitalize(s.string_value()));
}

Value f_center(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_center", args, {{"width", Value::integer(80)}});
  Arguments method_args;
  method_args.positional.push_back(a[0]);
  return call_method(interp, Value::string(v.str()), "center", method_args);
}

Value f_default(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_default", args, {{"default_value", Value::string("")}, {"boolean", Value::boolean(false)}});
  if (v.is_undefined() || (a[1].truthy() && !v.truthy())) return a[0];
  return v;
}

Value f_dictsort(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_dictsort", args,
                                {{"case_sensitive", Value::boolean(false)}, {"by", Value::string("key")}, {"reverse", Value::boolean(false)}});
  size_t position;
  if (a[1].is_string() && a[1].string_value() == "key") {
    position = 0;
  } else if (a[1].is_string() && a[1].string_value() == "value") {
    position = 1;
  } else {
    type_error("You can only sort by either \"key\" or \"value\"");
  }
  if (v.is_undefined()) raise_undefined(v);
  if (!v.is_dict()) type_error(std::string("'") + v.python_type() + "' object has no attribute 'items'");
  std::vector<Value> pairs;
  std::vector<Value> keys;
  for (const auto& [key, value] : v.dict_value().entries()) {
    pairs.push_back(Value::tuple({key, value}));
    const Value& k = position == 0 ? key : value;
    keys.push_back(a[0].truthy() ? k : lowered(k));
  }
  return Value::list(sorted(interp, std::move(pairs), keys, a[2].truthy()));
}

Value f_escape(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("escape", args, {});
  return html_escape(v);
}

Value f_first(Interpreter& interp, const Value& v, Arguments& args) {
  bind_arguments("do_first", args, {});
  if (v.is_iterator()) {
    IteratorData& it = v.iterator_data();
    if (it.position < it.items.size()) return it.items[it.position++];
    return Value::undefined_hint("No first item, sequence was empty.");
  }
  if (v.is_list() && !v.items().empty()) return v.items().front();
  const std::vector<Value> items = iterate(interp, v);
  if (items.empty()) return Value::undefined_hint("No first item, sequence was empty.");
  return items.front();
}

Value f_float(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_float", args, {{"default", Value::number(0.0)}});
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_float()) return v;
  if (v.is_int() || v.is_bool()) return Value::number(v.as_double());
  if (v.is_string()) {
    double d;
    if (parse_python_float(v.string_value(), d)) return Value::number(d);
  }
  return a[0];
}

Value f_format(Interpreter& interp, const Value& v, Arguments& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    type_error("can't handle positional and keyword arguments at the same time");
  }
  Value operand;
  if (!args.keyword.empty()) {
    auto d = std::make_shared<Dict>();
    for (const auto& [key, value] : args.keyword) d->set(std::string_view(key), value);
    operand = Value::dict(std::move(d));
  } else {
    operand = Value::tuple(args.positional);
  }
  const Value format = soft_str(v);
  Value result = binary_operation("%", format, operand, interp.limits().max_value_size);
  return result;
}

Value f_indent(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_indent", args,
                                {{"width", Value::integer(4)}, {"first", Value::boolean(false)}, {"blank", Value::boolean(false)}});
  std::string indention;
  if (a[0].is_string()) {
    indention = a[0].string_value();
  } else {
    const int64_t width = int_argument("indent", a[0]);
    interp.check_value_size(static_cast<size_t>(std::max<int64_t>(width, 0)));
    indention = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  }
  // jinja2 appends "\n" to the value itself: anything but a string fails there.
  if (v.is_undefined()) raise_undefined(v);
  if (!v.is_string()) {
    type_error(std::string("unsupported operand type(s) for +=: '") + v.python_type() + "' and 'str'");
  }
  const Value& s = v;
  const std::vector<std::string> lines = text::split_lines(s.string_value() + "\n", false);
  interp.charge(lines.size());
  std::string out;
  if (a[2].truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i != 0) out += "\n" + indention;
      out += lines[i];
      interp.check_value_size(out.size());
    }
  } else {
    out = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += indention;
      out += lines[i];
      interp.check_value_size(out.size());
    }
  }
  if (a[1].truthy()) out = indention + out;
  return Value::string_like(s, std::move(out));
}

Value f_int(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_int", args, {{"default", Value::integer(0)}, {"base", Value::integer(10)}});
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_int()) return v;
  if (v.is_bool()) return Value::integer(v.bool_value());
  if (v.is_float()) {
    const double d = v.float_value();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return a[0];
    return Value::integer(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    int64_t i;
    if (parse_python_int(v.string_value(), a[1].is_int() ? a[1].int_value() : 10, i)) return Value::integer(i);
    double d;
    if (parse_python_float(v.string_value(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(d));
    }
  }
  return a[0];
}

Value f_items(Interpreter& interp, const Value& v, Arguments& args) {
  bind_arguments("do_items", args, {});
  if (v.is_undefined()) return Value::iterator({}, "generator");
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  interp.charge(v.dict_value().size());
  std::vector<Value> pairs;
  pairs.reserve(v.dict_value().size());
  for (const auto& [key, value] : v.dict_value().entries()) pairs.push_back(Value::tuple({key, value}));
  return Value::iterator(std::move(pairs), "generator");
}

Value f_join(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_join", args, {{"d", Value::string("")}, {"attribute", Value::none()}});
  std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  if (!a[1].is_none()) {
    const std::vector<Value> path = attribute_path(a[1]);
    for (Value& item : items) item = lookup_path(item, path);
  }
  return Value::string(join_strings(interp, items, a[0].str()));
}

Value f_last(Interpreter& interp, const Value& v, Arguments& args) {
  bind_arguments("do_last", args, {});
  if (v.is_iterator()) type_error(std::string("'") + v.python_type() + "' object is not reversible");
  if (v.is_list() && !v.items().empty()) return v.items().back();
  const std::vector<Value> items = iterate(interp, v);
  if (items.empty()) return Value::undefined_hint("No last item, sequence was empty.");
  return items.back();
}

Value f_length(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("len", args, {});
  switch (v.kind()) {
    case ValueKind::Undefined: return Value::integer(0);
    case ValueKind::String: return Value::integer(static_cast<int64_t>(text::length(v.string_value())));
    case ValueKind::List: return Value::integer(static_cast<int64_t>(v.items().size()));
    case ValueKind::Dict: return Value::integer(static_cast<int64_t>(v.dict_value().size()));
    default: type_error(std::string("object of type '") + v.python_type() + "' has no len()");
  }
}

Value f_list(Interpreter& interp, const Value& v, Arguments& args) {
  bind_arguments("do_list", args, {});
  std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  return Value::list(std::move(items));
}

Value f_lower(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("do_lower", args, {});
  const Value s = soft_str(v);
  return Value::string_like(s, text::lower(s.string_value()));
}

Value f_map(Interpreter& interp, const Value& v, Arguments& args) {
  std::vector<Value> out;
  if (!v.truthy()) return Value::iterator(std::move(out), "generator");
  const std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  const Value* attribute = nullptr;
  const Value* default_value = nullptr;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") attribute = &value;
    if (key == "default") default_value = &value;
  }
  if (args.positional.empty() && attribute != nullptr) {
    for (const auto& [key, value] : args.keyword) {
      if (key != "attribute" && key != "default") type_error("Unexpected keyword argument " + text::repr(key));
    }
    const std::vector<Value> path = attribute_path(*attribute);
    for (const Value& item : items) out.push_back(lookup_path(item, path, default_value));
    return Value::iterator(std::move(out), "generator");
  }
  if (args.positional.empty()) type_error("map requires a filter argument");
  const Value name = args.positional[0];
  if (!name.is_string()) type_error("map: the filter name must be a string");
  Arguments rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    Arguments call_args = rest;
    out.push_back(apply_filter(interp, name.string_value(), item, call_args));
  }
  return Value::iterator(std::move(out), "generator");
}

Value min_or_max(Interpreter& interp, const Value& v, Arguments& args, bool is_max) {
  const auto a = bind_arguments(is_max ? "do_max" : "do_min", args,
                                {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  const std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  if (items.empty()) return Value::undefined_hint("No aggregated item, sequence was empty.");
  const std::vector<Value> keys = sort_keys_of(items, a[1], a[0].truthy(), false);
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    if (is_max ? compare(">", keys[i], keys[best]) : compare("<", keys[i], keys[best])) best = i;
  }
  return items[best];
}

Value f_max(Interpreter& interp, const Value& v, Arguments& args) { return min_or_max(interp, v, args, true); }
Value f_min(Interpreter& interp, const Value& v, Arguments& args) { return min_or_max(interp, v, args, false); }

Value f_replace(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_replace", args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value::none()}});
  Arguments method_args;
  method_args.positional = {Value::string(a[0].str()), Value::string(a[1].str())};
  if (!a[2].is_none()) method_args.positional.push_back(a[2]);
  return call_method(interp, Value::string(v.str()), "replace", method_args);
}

Value f_reverse(Interpreter& interp, const Value& v, Arguments& args) {
  bind_arguments("do_reverse", args, {});
  if (v.is_string()) {
    const Value step = Value::integer(-1);
    return get_slice(v, nullptr, nullptr, &step);
  }
  if (v.is_iterator()) {
    std::vector<Value> items = iterate(interp, v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (v.is_undefined() || v.is_list() || v.is_dict()) {
    std::vector<Value> items = iterate(interp, v);
    interp.charge(items.size());
    std::reverse(items.begin(), items.end());
    return Value::iterator(std::move(items), v.is_list() && v.list_flavor() == ListFlavor::List ? "list_reverseiterator" : "reversed");
  }
  type_error("argument must be iterable");
}

Value f_round(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_round", args, {{"precision", Value::integer(0)}, {"method", Value::string("common")}});
  const std::string method = a[1].str();
  if (method != "common" && method != "ceil" && method != "floor") type_error("method must be common, ceil or floor");
  const int64_t precision = int_argument("round", a[0]);
  if (!v.is_number()) type_error(std::string("type ") + v.python_type() + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_wide_int() && precision >= 0) return v;
    if (v.is_int() || v.is_bool()) {
      const int64_t i = v.is_bool() ? v.bool_value() : v.int_value();
      if (precision >= 0) return Value::integer(i);
      return Value::integer(static_cast<int64_t>(python_round(static_cast<double>(i), precision)));
    }
    return Value::number(python_round(v.float_value(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("do_mark_safe", args, {});
  if (v.is_markup()) return v;
  return Value::markup(v.str());
}

// select / reject / selectattr / rejectattr.
Value select_or_reject(Interpreter& interp, const Value& v, Arguments& args, bool keep_when, bool by_attribute) {
  std::vector<Value> out;
  if (!v.truthy()) return Value::iterator(std::move(out), "generator");
  std::vector<Value> path;
  size_t offset = 0;
  if (by_attribute) {
    if (args.positional.empty()) type_error("Missing parameter for attribute name");
    path = attribute_path(args.positional[0]);
    offset = 1;
  }
  const bool has_test = args.positional.size() > offset;
  std::string test_name;
  Arguments test_args;
  if (has_test) {
    if (!args.positional[offset].is_string()) type_error("the test name must be a string");
    test_name = args.positional[offset].string_value();
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(offset) + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  const std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  for (const Value& item : items) {
    const Value subject = by_attribute ? lookup_path(item, path) : item;
    bool result;
    if (has_test) {
      Arguments call_args = test_args;
      result = apply_test(interp, test_name, subject, call_args);
    } else {
      result = subject.truthy();
    }
    if (result == keep_when) out.push_back(item);
  }
  return Value::iterator(std::move(out), "generator");
}

Value f_select(Interpreter& interp, const Value& v, Arguments& args) { return select_or_reject(interp, v, args, true, false); }
Value f_reject(Interpreter& interp, const Value& v, Arguments& args) { return select_or_reject(interp, v, args, false, false); }
Value f_selectattr(Interpreter& interp, const Value& v, Arguments& args) { return select_or_reject(interp, v, args, true, true); }
Value f_rejectattr(Interpreter& interp, const Value& v, Arguments& args) { return select_or_reject(interp, v, args, false, true); }

Value f_sort(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_sort", args,
                                {{"reverse", Value::boolean(false)}, {"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  std::vector<Value> items = iterate(interp, v);
  const std::vector<Value> keys = sort_keys_of(items, a[2], a[1].truthy(), true);
  // make_multi_attrgetter compares lists of keys; with one key, compare the keys themselves.
  std::vector<Value> single;
  single.reserve(keys.size());
  for (const Value& k : keys) single.push_back(k.items().size() == 1 ? k.items()[0] : k);
  return Value::list(sorted(interp, std::move(items), single, a[0].truthy()));
}

Value f_string(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("soft_str", args, {});
  return soft_str(v);
}

Value f_sum(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_sum", args, {{"attribute", Value::none()}, {"start", Value::integer(0)}});
  std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size());
  if (a[1].is_string()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
  const std::vector<Value> path = attribute_path(a[0]);
  Value total = a[1];
  for (const Value& item : items) {
    total = binary_operation("+", total, a[0].is_none() ? item : lookup_path(item, path), interp.limits().max_value_size);
  }
  return total;
}

Value f_title(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("do_title", args, {});
  const Value s = soft_str(v);
  return Value::string_like(s, text::jinja_title(s.string_value()));
}

Value f_tojson(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("tojson", args,
                                {{"ensure_ascii", Value::boolean(false)},
                                 {"indent", Value::none()},
                                 {"separators", Value::none()},
                                 {"sort_keys", Value::boolean(false)}});
  JsonDumpOptions options;
  options.ensure_ascii = a[0].truthy();
  if (a[1].is_string()) {
    options.indent = a[1].string_value();
  } else if (!a[1].is_none()) {
    const int64_t width = int_argument("tojson", a[1]);
    interp.check_value_size(static_cast<size_t>(std::max<int64_t>(width, 0)));
    options.indent = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
  }
  if (!a[2].is_none()) {
    const std::vector<Value> parts = iterate(interp, a[2]);
    if (parts.size() != 2) type_error("separators must be a pair (item separator, key separator)");
    if (!parts[0].is_string() || !parts[1].is_string()) type_error("separators must be strings");
    options.item_separator = parts[0].string_value();
    options.key_separator = parts[1].string_value();
  }
  options.sort_keys = a[3].truthy();
  std::string out;
  json_dumps(v, options, out, interp.limits().max_value_size);
  interp.charge(out.size() / 64 + 1);
  return Value::string(std::move(out));
}

Value f_trim(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_trim", args, {{"chars", Value::none()}});
  const Value s = soft_str(v);
  if (a[0].is_none()) return Value::string_like(s, std::string(text::strip(s.string_value(), true, true)));
  if (!a[0].is_string()) type_error(std::string("strip arg must be None or str, not ") + a[0].python_type());
  return Value::string_like(s, std::string(text::strip_chars(s.string_value(), a[0].string_value(), true, true)));
}

Value f_truncate(Interpreter&, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_truncate", args,
                                {{"length", Value::integer(255)},
                                 {"killwords", Value::boolean(false)},
                                 {"end", Value::string("...")},
                                 {"leeway", Value::none()}});
  const int64_t length = int_argument("truncate", a[0]);
  const std::string end = a[2].str();
  const int64_t leeway = a[3].is_none() ? 5 : int_argument("truncate", a[3]);
  const int64_t end_length = static_cast<int64_t>(text::length(end));
  if (length < end_length) type_error("expected length >= " + std::to_string(end_length) + ", got " + std::to_string(length));
  if (leeway < 0) type_error("expected leeway >= 0, got " + std::to_string(leeway));
  if (!v.is_string()) {
    // jinja2 measures the value as it is: a short enough sequence comes back unchanged,
    // anything else fails as Python's len() or slicing would.
    size_t size = 0;
    if (v.is_undefined()) return v;
    if (v.is_list()) {
      size = v.items().size();
    } else if (v.is_dict()) {
      size = v.dict_value().size();
    } else {
      type_error(std::string("object of type '") + v.python_type() + "' has no len()");
    }
    if (static_cast<int64_t>(size) <= length + leeway) return v;
    type_error(std::string("can only concatenate ") + v.python_type() + " (not \"str\") to " + v.python_type());
  }
  const std::string& s = v.string_value();
  const std::vector<size_t> offsets = text::code_point_offsets(s);
  const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
  if (n <= length + leeway) return v;
  const std::string head = s.substr(0, offsets[static_cast<size_t>(length - end_length)]);
  if (a[1].truthy()) return Value::string(head + end);
  const size_t space = head.rfind(' ');
  return Value::string((space == std::string::npos ? head : head.substr(0, space)) + end);
}

Value f_unique(Interpreter& interp, const Value& v, Arguments& args) {
  const auto a = bind_arguments("do_unique", args, {{"case_sensitive", Value::boolean(false)}, {"attribute", Value::none()}});
  const std::vector<Value> items = iterate(interp, v);
  interp.charge(items.size() * items.size() / 16 + items.size());
  const std::vector<Value> keys = sort_keys_of(items, a[1], a[0].truthy(), false);
  std::vector<Value> seen;
  std::vector<Value> out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!is_hashable(keys[i])) type_error(std::string("unhashable type: '") + keys[i].python_type() + "'");
    bool found = false;
    for (const Value& s : seen) {
      if (equals(s, keys[i])) {
        found = true;
        break;
      }
    }
    if (found) continue;
    seen.push_back(keys[i]);
    out.push_back(items[i]);
  }
  return Value::iterator(std::move(out), "generator");
}

Value f_upper(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("do_upper", args, {});
  const Value s = soft_str(v);
  return Value::string_like(s, text::upper(s.string_value()));
}

Value f_wordcount(Interpreter&, const Value& v, Arguments& args) {
  bind_arguments("do_wordcount", args, {});
  const std::string s = v.str();
  int64_t words = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s.size();) {
    const bool word = text::is_word(text::next_code_point(s, pos));
    if (word && !in_word) ++words;
    in_word = word;
  }
  return Value::integer(words);
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;  // null: a jinja2 filter step35 does not implement
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"filesizeformat", nullptr},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", nullptr},
    {"format", f_format},
    {"groupby", nullptr},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"pprint", nullptr},
    {"random", nullptr},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", nullptr},
    {"sort", f_sort},
    {"string", f_string},
    {"striptags", nullptr},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"urlencode", nullptr},
    {"urlize", nullptr},
    {"wordcount", f_wordcount},
    {"wordwrap", nullptr},
    {"xmlattr", nullptr},
};

}  // namespace

bool is_filter_name(std::string_view name) { return find_named(kFilters, name) != nullptr; }

Value apply_filter(Interpreter& interp, std::string_view name, const Value& input, Arguments& args) {
  const FilterEntry* entry = find_named(kFilters, name);
  if (entry == nullptr) type_error("No filter named '" + std::string(name) + "' found.");
  if (entry->fn == nullptr) type_error("the filter '" + std::string(name) + "' is not supported by step35");
  interp.charge(1);
  return entry->fn(interp, input, args);
}

}  // namespace step35::jinja
