#include "jinja/operators.h"

#include <cmath>

#include "jinja/error.h"
#include "jinja/format.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  type_error("unsupported operand type(s) for " + std::string(op) + ": '" + a.python_type() + "' and '" +
             b.python_type() + "'");
}

[[noreturn]] void overflow() { type_error("integer overflow (step35 keeps integers in 64 bits)"); }

void check_size(size_t size, size_t max_size) {
  if (size > max_size) {
    throw Error(ErrorKind::Limit, "a value of " + std::to_string(size) + " bytes or items is above the limit of " +
                                      std::to_string(max_size));
  }
}

// A list's size counts in bytes of its values (a value is 32 bytes).
void check_list_size(size_t items, size_t max_size) {
  if (items > max_size / sizeof(Value)) {
    throw Error(ErrorKind::Limit, "a list of " + std::to_string(items) + " items (" + std::to_string(sizeof(Value)) +
                                      " bytes each) is above the limit of " + std::to_string(max_size) + " bytes");
  }
}

bool is_integral(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t integral(const Value& v) { return v.is_bool() ? (v.bool_value() ? 1 : 0) : v.int_value(); }

int64_t int_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1) {
      if (__builtin_mul_overflow(result, base, &result)) overflow();
    }
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return result;
}

double python_float_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0.0) {
    if ((r < 0) != (b < 0)) r += b;
  } else {
    r = std::copysign(0.0, b);
  }
  return r;
}

double python_float_floordiv(double a, double b) {
  const double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0.0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div != 0.0) {
    const double floor_div = std::floor(div);
    if (div - floor_div > 0.5) return floor_div + 1.0;
    return floor_div;
  }
  return std::copysign(0.0, a / b);
}

Value repeat(const Value& sequence, int64_t times, size_t max_size) {
  if (times < 0) times = 0;
  if (sequence.is_string()) {
    const std::string& s = sequence.string_value();
    size_t total;
    if (__builtin_mul_overflow(s.size(), static_cast<size_t>(times), &total)) check_size(SIZE_MAX, max_size);
    check_size(total, max_size);
    std::string out;
    out.reserve(total);
    for (int64_t i = 0; i < times; ++i) out += s;
    return sequence.is_markup() ? Value::markup(std::move(out)) : Value::string(std::move(out));
  }
  const auto& items = sequence.items();
  size_t total;
  if (__builtin_mul_overflow(items.size(), static_cast<size_t>(times), &total)) check_size(SIZE_MAX, max_size);
  check_list_size(total, max_size);
  std::vector<Value> out;
  out.reserve(total);
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), sequence.list_flavor());
}

bool is_sequence_list(const Value& v) {
  return v.is_list() && (v.list_flavor() == ListFlavor::List || v.list_flavor() == ListFlavor::Tuple);
}

}  // namespace

void raise_undefined(const Value& undefined) {
  throw Error(undefined.undefined_reason() == UndefinedReason::Unsafe ? ErrorKind::Security : ErrorKind::Undefined,
              undefined.undefined_message());
}

std::string html_escape_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out += c; break;
    }
  }
  return out;
}

Value html_escape(const Value& v) {
  if (v.is_markup()) return v;
  return Value::markup(html_escape_text(v.str()));
}

namespace {

// a + b: numbers add, strings and same-flavoured sequences concatenate.
Value add_values(const Value& a, const Value& b, size_t max_size) {
  if (is_integral(a) && is_integral(b)) {
    int64_t r;
    if (__builtin_add_overflow(integral(a), integral(b), &r)) overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_double() + b.as_double());
  if (a.is_string() && b.is_string()) {
    check_size(a.string_value().size() + b.string_value().size(), max_size);
    if (a.is_markup() || b.is_markup()) {
      const std::string left = a.is_markup() ? a.string_value() : html_escape_text(a.string_value());
      const std::string right = b.is_markup() ? b.string_value() : html_escape_text(b.string_value());
      return Value::markup(left + right);
    }
    std::string out;
    out.reserve(a.string_value().size() + b.string_value().size());
    out += a.string_value();
    out += b.string_value();
    return Value::string(std::move(out));
  }
  if (is_sequence_list(a) && is_sequence_list(b) && a.list_flavor() == b.list_flavor()) {
    check_list_size(a.items().size() + b.items().size(), max_size);
    std::vector<Value> out = a.items();
    out.insert(out.end(), b.items().begin(), b.items().end());
    return Value::list(std::move(out), a.list_flavor());
  }
  if (a.is_string() || is_sequence_list(a)) {
    type_error(std::string("can only concatenate ") + a.python_type() + " (not \"" + b.python_type() + "\") to " +
               a.python_type());
  }
  unsupported("+", a, b);
}

Value subtract_values(const Value& a, const Value& b) {
  if (is_integral(a) && is_integral(b)) {
    int64_t r;
    if (__builtin_sub_overflow(integral(a), integral(b), &r)) overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_double() - b.as_double());
  unsupported("-", a, b);
}

// a * b: numbers multiply, a sequence times an integer repeats.
Value multiply_values(const Value& a, const Value& b, size_t max_size) {
  if (is_integral(a) && is_integral(b)) {
    int64_t r;
    if (__builtin_mul_overflow(integral(a), integral(b), &r)) overflow();
    return Value::integer(r);
  }
  if (a.is_number() && b.is_number()) return Value::number(a.as_double() * b.as_double());
  const bool a_seq = a.is_string() || is_sequence_list(a);
  const bool b_seq = b.is_string() || is_sequence_list(b);
  if (a_seq && is_integral(b)) return repeat(a, integral(b), max_size);
  if (b_seq && is_integral(a)) return repeat(b, integral(a), max_size);
  if (a_seq || b_seq) {
    type_error(std::string("can't multiply sequence by non-int of type '") + (a_seq ? b : a).python_type() + "'");
  }
  unsupported("*", a, b);
}

Value divide_values(const Value& a, const Value& b) {
  if (!(a.is_number() && b.is_number())) unsupported("/", a, b);
  if (b.as_double() == 0.0) type_error(is_integral(a) && is_integral(b) ? "division by zero" : "float division by zero");
  return Value::number(a.as_double() / b.as_double());
}

// a // b, rounding towards negative infinity as Python does.
Value floor_divide_values(const Value& a, const Value& b) {
  if (!(a.is_number() && b.is_number())) unsupported("//", a, b);
  if (is_integral(a) && is_integral(b)) {
    const int64_t x = integral(a), y = integral(b);
    if (y == 0) type_error("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) overflow();
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::integer(q);
  }
  if (b.as_double() == 0.0) type_error("float floor division by zero");
  return Value::number(python_float_floordiv(a.as_double(), b.as_double()));
}

// str % args: printf-style formatting; Markup % args escapes the arguments.
Value format_with_percent(const Value& format, const Value& args, size_t max_size) {
  if (format.is_markup()) {
    Value escaped = args;
    if (args.is_list() && args.list_flavor() == ListFlavor::Tuple) {
      std::vector<Value> items;
      for (const Value& item : args.items()) items.push_back(item.is_string() ? html_escape(item) : item);
      escaped = Value::tuple(std::move(items));
    } else if (args.is_string()) {
      escaped = html_escape(args);
    }
    return Value::markup(percent_format(format.string_value(), escaped));
  }
  std::string out = percent_format(format.string_value(), args);
  check_size(out.size(), max_size);
  return Value::string(std::move(out));
}

// a % b: formatting when a is a string, else Python's modulo (the sign of the divisor).
Value modulo_values(const Value& a, const Value& b, size_t max_size) {
  if (a.is_string()) return format_with_percent(a, b, max_size);
  if (!(a.is_number() && b.is_number())) unsupported("%", a, b);
  if (is_integral(a) && is_integral(b)) {
    const int64_t x = integral(a), y = integral(b);
    if (y == 0) type_error("integer modulo by zero");
    if (y == -1) return Value::integer(0);
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::integer(r);
  }
  if (b.as_double() == 0.0) type_error("float modulo");
  return Value::number(python_float_mod(a.as_double(), b.as_double()));
}

Value power_values(const Value& a, const Value& b) {
  if (!(a.is_number() && b.is_number())) unsupported("** or pow()", a, b);
  if (is_integral(a) && is_integral(b) && integral(b) >= 0) return Value::integer(int_power(integral(a), integral(b)));
  const double x = a.as_double(), y = b.as_double();
  if (x == 0.0 && y < 0) type_error("0.0 cannot be raised to a negative power");
  if (x < 0 && y != std::floor(y)) type_error("a negative number raised to a fractional power is complex");
  return Value::number(std::pow(x, y));
}

}  // namespace

Value binary_operation(std::string_view op, const Value& a, const Value& b, size_t max_size) {
  if (a.is_undefined()) raise_undefined(a);
  // str % undefined is formatting: '%s' prints it as "" (percent_format decides).
  if (b.is_undefined() && !(op == "%" && a.is_string())) raise_undefined(b);
  if (op == "+") return add_values(a, b, max_size);
  if (op == "-") return subtract_values(a, b);
  if (op == "*") return multiply_values(a, b, max_size);
  if (op == "/") return divide_values(a, b);
  if (op == "//") return floor_divide_values(a, b);
  if (op == "%") return modulo_values(a, b, max_size);
  if (op == "**") return power_values(a, b);
  type_error("unknown operator " + std::string(op));
}

Value negate(const Value& a) {
  if (a.is_undefined()) raise_undefined(a);
  if (is_integral(a)) {
    if (integral(a) == INT64_MIN) overflow();
    return Value::integer(-integral(a));
  }
  if (a.is_float()) return Value::number(-a.float_value());
  type_error(std::string("bad operand type for unary -: '") + a.python_type() + "'");
}

Value unary_plus(const Value& a) {
  if (a.is_undefined()) raise_undefined(a);
  if (is_integral(a)) return Value::integer(integral(a));
  if (a.is_float()) return a;
  type_error(std::string("bad operand type for unary +: '") + a.python_type() + "'");
}

namespace {

// -1, 0, 1 like Python's ordering, or a TypeError for types that do not order.
int order(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) {
      const __int128 x = exact_integer(a), y = exact_integer(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const long double x = a.is_float() ? static_cast<long double>(a.float_value()) : static_cast<long double>(exact_integer(a));
    const long double y = b.is_float() ? static_cast<long double>(b.float_value()) : static_cast<long double>(exact_integer(b));
    if (std::isnan(x) || std::isnan(y)) return 2;  // every ordering comparison with NaN is false
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.string_value().compare(b.string_value());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (is_sequence_list(a) && is_sequence_list(b) && a.list_flavor() == b.list_flavor()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return order(op, x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  std::string message = "'";
  message += op;
  message += "' not supported between instances of '";
  message += a.python_type();
  message += "' and '";
  message += b.python_type();
  message += "'";
  type_error(message);
}

}  // namespace

bool compare(std::string_view op, const Value& a, const Value& b) {
  const int c = order(op, a, b);
  if (c == 2) return false;
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  if (op == ">=") return c >= 0;
  type_error("unknown comparison " + std::string(op));
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case ValueKind::Undefined: return false;
    case ValueKind::String:
      if (!item.is_string()) {
        type_error(std::string("'in <string>' requires string as left operand, not ") + item.python_type());
      }
      return container.string_value().find(item.string_value()) != std::string::npos;
    case ValueKind::List:
      for (const Value& v : container.items())
        if (equals(v, item)) return true;
      return false;
    case ValueKind::Dict:
      if (!is_hashable(item)) type_error(std::string("unhashable type: '") + item.python_type() + "'");
      return container.dict_value().find(item) != nullptr;
    case ValueKind::Iterator: {
      IteratorData& it = container.iterator_data();
      while (it.position < it.items.size()) {
        if (equals(it.items[it.position++], item)) return true;
      }
      return false;
    }
    default:
      type_error(std::string("argument of type '") + container.python_type() + "' is not iterable");
  }
}

}  // namespace step35::jinja
