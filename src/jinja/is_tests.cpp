// jinja2's built-in tests (x is name), jinja2/tests.py being the specification.
#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/operators.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

using TestFn = bool (*)(Interpreter& interp, const Value& v, const std::vector<Value>& args);

const Value& one_argument(const char* test, const std::vector<Value>& args) {
  if (args.size() != 1) {
    type_error(std::string("test_") + test + "() takes 2 positional arguments but " + std::to_string(args.size() + 1) +
               " were given");
  }
  return args[0];
}

void no_arguments(std::string_view test, const std::vector<Value>& args) {
  if (!args.empty()) {
    type_error("test_" + std::string(test) + "() takes 1 positional argument but " + std::to_string(args.size() + 1) +
               " were given");
  }
}

bool modulo_is(Interpreter& interp, const Value& v, const Value& divisor, int64_t expected) {
  const Value r = binary_operation("%", v, divisor, interp.limits().max_value_size);
  return equals(r, Value::integer(expected));
}

bool t_odd(Interpreter& interp, const Value& v, const std::vector<Value>& a) {
  no_arguments("odd", a);
  return modulo_is(interp, v, Value::integer(2), 1);
}
bool t_even(Interpreter& interp, const Value& v, const std::vector<Value>& a) {
  no_arguments("even", a);
  return modulo_is(interp, v, Value::integer(2), 0);
}
bool t_divisibleby(Interpreter& interp, const Value& v, const std::vector<Value>& a) {
  return modulo_is(interp, v, one_argument("divisibleby", a), 0);
}
bool t_defined(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("defined", a);
  return !v.is_undefined();
}
bool t_filter(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("filter", a);
  return v.is_string() && is_filter_name(v.string_value());
}
bool t_test(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("test", a);
  return v.is_string() && is_test_name(v.string_value());
}
bool t_false(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("false", a);
  return v.is_bool() && !v.bool_value();
}
bool t_true(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("true", a);
  return v.is_bool() && v.bool_value();
}
bool has_case(const std::string& s, bool upper) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = text::next_code_point(s, pos);
    if (text::is_upper_cp(cp)) {
      if (!upper) return false;
      cased = true;
    } else if (text::is_lower_cp(cp)) {
      if (upper) return false;
      cased = true;
    }
  }
  return cased;
}
bool t_lower(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("lower", a);
  return has_case(v.str(), false);
}
bool t_upper(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("upper", a);
  return has_case(v.str(), true);
}
bool t_sequence(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("sequence", a);
  if (v.is_undefined() || v.is_string() || v.is_dict()) return true;
  if (!v.is_list()) return false;
  const ListFlavor f = v.list_flavor();
  return f == ListFlavor::List || f == ListFlavor::Tuple || f == ListFlavor::Range;
}
bool t_iterable(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("iterable", a);
  if (v.is_object()) return std::string_view(v.python_type()) == "LoopContext";
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() || v.is_iterator();
}
bool t_callable(Interpreter&, const Value& v, const std::vector<Value>& a) {
  no_arguments("callable", a);
  return v.is_undefined() || v.is_callable();
}
bool t_sameas(Interpreter&, const Value& v, const std::vector<Value>& a) {
  const Value& other = one_argument("sameas", a);
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case ValueKind::None: return true;
    case ValueKind::Bool: return v.bool_value() == other.bool_value();
    // CPython shares the int objects -5..256; other numbers are distinct objects.
    case ValueKind::Int:
      if (v.is_wide_int() || other.is_wide_int()) return false;
      return v.int_value() == other.int_value() && v.int_value() >= -5 && v.int_value() <= 256;
    case ValueKind::String: return &v.string_value() == &other.string_value();
    case ValueKind::List: return &v.list_data() == &other.list_data();
    case ValueKind::Dict:
    case ValueKind::Namespace: return &v.dict_value() == &other.dict_value();
    case ValueKind::Object: return &v.object_value() == &other.object_value();
    case ValueKind::Iterator: return &v.iterator_data() == &other.iterator_data();
    default: return false;
  }
}
bool t_in(Interpreter&, const Value& v, const std::vector<Value>& a) { return contains(one_argument("in", a), v); }
bool t_eq(Interpreter&, const Value& v, const std::vector<Value>& a) { return equals(v, one_argument("eq", a)); }
bool t_ne(Interpreter&, const Value& v, const std::vector<Value>& a) { return !equals(v, one_argument("ne", a)); }
bool t_gt(Interpreter&, const Value& v, const std::vector<Value>& a) { return compare(">", v, one_argument("gt", a)); }
bool t_ge(Interpreter&, const Value& v, const std::vector<Value>& a) { return compare(">=", v, one_argument("ge", a)); }
bool t_lt(Interpreter&, const Value& v, const std::vector<Value>& a) { return compare("<", v, one_argument("lt", a)); }
bool t_le(Interpreter&, const Value& v, const std::vector<Value>& a) { return compare("<=", v, one_argument("le", a)); }

// A test is a function, or for the tests without arguments that only ask the value's kind,
// that question.
struct TestEntry {
  std::string_view name;
  TestFn fn;
  bool (Value::*is)() const = nullptr;
};

constexpr TestEntry kTests[] = {
    {"odd", t_odd},         {"even", t_even},         {"divisibleby", t_divisibleby}, {"defined", t_defined},
    {"undefined", nullptr, &Value::is_undefined},     {"filter", t_filter},           {"test", t_test},
    {"none", nullptr, &Value::is_none},               {"boolean", nullptr, &Value::is_bool},
    {"false", t_false},     {"true", t_true},         {"integer", nullptr, &Value::is_int},
    {"float", nullptr, &Value::is_float},             {"lower", t_lower},             {"upper", t_upper},
    {"string", nullptr, &Value::is_string},           {"mapping", nullptr, &Value::is_dict},
    {"number", nullptr, &Value::is_number},           {"sequence", t_sequence},       {"iterable", t_iterable},
    {"callable", t_callable}, {"sameas", t_sameas},   {"escaped", nullptr, &Value::is_markup},
    {"in", t_in},           {"==", t_eq},             {"eq", t_eq},                   {"equalto", t_eq},
    {"!=", t_ne},           {"ne", t_ne},             {">", t_gt},                    {"gt", t_gt},
    {"greaterthan", t_gt},  {"ge", t_ge},             {">=", t_ge},                   {"<", t_lt},
    {"lt", t_lt},           {"lessthan", t_lt},       {"<=", t_le},                   {"le", t_le},
};

}  // namespace

bool is_test_name(std::string_view name) { return find_named(kTests, name) != nullptr; }

bool apply_test(Interpreter& interp, std::string_view name, const Value& input, Arguments& args) {
  const TestEntry* entry = find_named(kTests, name);
  if (entry == nullptr) type_error("No test named '" + std::string(name) + "' found.");
  if (!args.keyword.empty()) {
    type_error("test_" + std::string(name) + "() got an unexpected keyword argument '" + args.keyword[0].first + "'");
  }
  if (entry->is != nullptr) {
    no_arguments(entry->name, args.positional);
    return (input.*entry->is)();
  }
  return entry->fn(interp, input, args.positional);
}

}  // namespace step35::jinja
