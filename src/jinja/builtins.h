// The built-in library a template can reach: filters (x | name), tests (x is name), the
// methods of str / dict / list values (x.name(...)), the global functions (range, dict,
// namespace, cycler, joiner, raise_exception, strftime_now) and the attribute and item
// access rules of jinja2's immutable sandbox.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace step35::jinja {

// The entry named `name` of one of the builtin tables (filters, tests, str methods), or null.
template <typename Entry, size_t N>
const Entry* find_named(const Entry (&table)[N], std::string_view name) {
  for (const Entry& entry : table)
    if (entry.name == name) return &entry;
  return nullptr;
}

bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);

// Throws jinja::Error for an unknown name (jinja2 defers unknown filters in conditionals
// to here).
Value apply_filter(Interpreter& interp, std::string_view name, const Value& input, Arguments& args);
bool apply_test(Interpreter& interp, std::string_view name, const Value& input, Arguments& args);

// Whether a value has a method of that name, and whether the sandbox lets it be used.
enum class MethodAccess : uint8_t { None, Safe, Unsafe };
MethodAccess find_method(const Value& self, std::string_view name);
// Calls a method that find_method reported Safe.
Value call_method(Interpreter& interp, const Value& self, std::string_view name, Arguments& args);

// The global function of that name (range, dict, ...), or an undefined value.
Value global_function(std::string_view name);

// Python's iter(value) made into a list (str yields characters, dict its keys, an
// undefined value nothing); a one-shot iterator is consumed. The characters of a string
// count as steps before they are made (one value each: 16 MiB of text would be a GiB).
std::vector<Value> iterate(Interpreter& interp, const Value& v);

// The sandbox's getattr(obj, name) (methods first, then dict keys) and getitem(obj, key)
// (the item first, then an attribute of that name); a miss is an undefined value saying
// what was missing.
Value get_attribute(const Value& object, const std::shared_ptr<const std::string>& name);
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step]; null pointers are omitted bounds.
Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step);

// Binds call arguments to a signature with defaults, as Python does for the built-in
// filters ("do_join() got an unexpected keyword argument ...").
struct Parameter {
  const char* name;
  std::optional<Value> default_value;  // nullopt: required
};
std::vector<Value> bind_arguments(std::string_view function, const Arguments& args,
                                  const std::vector<Parameter>& parameters);

}  // namespace step35::jinja
