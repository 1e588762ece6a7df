// The values a template computes with, modelled on the Python objects jinja2 sees:
// None, bool, int, float, str (and Markup), list / tuple / range / dict views, dict (keys
// kept in insertion order, as Python's), jinja2's Undefined, Namespace, one-shot iterators
// (what jinja2's select/map/items filters return: generators) and callable objects
// (macros, built-in functions, bound methods, the loop object).
//
// Values are cheap to copy: scalars inline, everything else shared. Strings, lists and
// dicts are never changed once built (the immutable sandbox forbids it); a Namespace is
// the one mutable container, shared by reference as in Python.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace step35::jinja {

class Interpreter;
class Value;
class Dict;
class Object;
struct ListData;
struct IteratorData;

enum class ValueKind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Iterator, Object };

// What Python type a List value stands for: it decides how it prints, whether it can be
// subscripted and whether tojson accepts it.
enum class ListFlavor : uint8_t { List, Tuple, Range, DictItems, DictKeys, DictValues };

// Why a value is undefined; it decides the message when the value is then used.
enum class UndefinedReason : uint8_t {
  Missing,    // 'name' is undefined
  Attribute,  // 'T object' has no attribute 'name'
  Element,    // T object has no element key
  Unsafe,     // access to attribute 'name' of 'T' object is unsafe. (the sandbox)
  Hint,       // a message of its own ("No first item, sequence was empty.")
};

// Positional and keyword arguments of a call, a filter or a test.
struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Value {
 public:
  Value() = default;  // undefined, no name

  // --- construction ---
  static Value undefined_missing(std::shared_ptr<const std::string> name);
  static Value undefined_attribute(const char* object_type, std::shared_ptr<const std::string> name);
  static Value undefined_element(const char* object_type, std::string key_repr);
  static Value undefined_unsafe(const char* python_type, std::string name);
  static Value undefined_hint(std::string message);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  // An integer above INT64_MAX that JSON held exactly (an unsigned 64-bit number): it prints,
  // serialises, compares and orders exactly, as Python's int does; arithmetic, indexing and
  // formatting with it raise a TypeError (step35 computes with 64-bit integers).
  static Value wide_integer(uint64_t u);
  static Value number(double f);
  static Value string(std::string s);
  static Value string(std::shared_ptr<const std::string> s);
  static Value markup(std::string s);  // jinja2's Markup: a str marked safe
  // Text derived from `like` (cut, cased, replaced): a Markup when `like` is one, else a str,
  // as Markup's str methods keep the mark.
  static Value string_like(const Value& like, std::string s);
  static Value list(std::vector<Value> items, ListFlavor flavor = ListFlavor::List);
  static Value tuple(std::vector<Value> items) { return list(std::move(items), ListFlavor::Tuple); }
  static Value range(int64_t start, int64_t stop, int64_t step, std::vector<Value> items);
  static Value dict(std::shared_ptr<Dict> d);
  static Value namespace_of(std::shared_ptr<Dict> attributes);
  static Value iterator(std::vector<Value> items, const char* python_type);
  static Value object(std::shared_ptr<Object> o);
  // JSON in client order: objects become dicts with keys in the order they came.
  static Value from_json(const nlohmann::ordered_json& json);

  // --- inspection ---
  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::Undefined; }
  bool is_none() const { return kind_ == ValueKind::None; }
  bool is_bool() const { return kind_ == ValueKind::Bool; }
  bool is_int() const { return kind_ == ValueKind::Int; }
  bool is_wide_int() const { return kind_ == ValueKind::Int && flags_ != 0; }
  bool is_float() const { return kind_ == ValueKind::Float; }
  bool is_number() const { return kind_ == ValueKind::Int || kind_ == ValueKind::Float || kind_ == ValueKind::Bool; }
  bool is_string() const { return kind_ == ValueKind::String; }
  bool is_markup() const { return kind_ == ValueKind::String && flags_ != 0; }
  bool is_list() const { return kind_ == ValueKind::List; }
  bool is_dict() const { return kind_ == ValueKind::Dict; }
  bool is_namespace() const { return kind_ == ValueKind::Namespace; }
  bool is_iterator() const { return kind_ == ValueKind::Iterator; }
  bool is_object() const { return kind_ == ValueKind::Object; }
  bool is_callable() const;

  bool bool_value() const { return bool_; }
  // An Int's value; a wide integer raises (see wide_integer).
  int64_t int_value() const {
    if (flags_ != 0) wide_int_used();
    return int_;
  }
  // A wide integer's value.
  uint64_t wide_int_value() const { return static_cast<uint64_t>(int_); }
  double float_value() const { return float_; }
  // Int, Float or Bool as a double.
  double as_double() const;
  const std::string& string_value() const;
  std::shared_ptr<const std::string> shared_string() const;
  ListFlavor list_flavor() const { return static_cast<ListFlavor>(flags_); }
  const ListData& list_data() const;
  const std::vector<Value>& items() const;
  const Dict& dict_value() const;  // Dict or Namespace
  Dict& namespace_attributes() const;
  IteratorData& iterator_data() const;
  Object& object_value() const;
  std::shared_ptr<Object> shared_object() const;
  UndefinedReason undefined_reason() const { return static_cast<UndefinedReason>(flags_); }

  // Python's bool(x).
  bool truthy() const;
  // Python's type(x).__name__ ("str", "int", "list", "dict", "NoneType", "generator", ...).
  const char* python_type() const;
  // jinja2's object_type_repr: "dict object", "str object", "None", ...
  const char* object_type() const;
  // The message of jinja2's UndefinedError (or SecurityError) for an undefined value.
  std::string undefined_message() const;
  // Python's str(x) and repr(x); undefined prints as "".
  std::string str() const;
  std::string repr() const;
  void append_str(std::string& out) const;
  void append_repr(std::string& out) const;

 private:
  ValueKind kind_ = ValueKind::Undefined;
  [[noreturn]] void wide_int_used() const;
  // A value of `kind` with `flags` (see flags_) and its heap part.
  static Value holding(ValueKind kind, uint8_t flags, std::shared_ptr<void> heap);
  // An undefined value for `reason` holding its name, key or message, and (unless null)
  // the type of the object it was looked up in.
  static Value undefined_because(UndefinedReason reason, const char* object_type, std::shared_ptr<std::string> text);

  uint8_t flags_ = 0;  // String: markup; List: ListFlavor; Undefined: UndefinedReason; Int: wide
  union {
    bool bool_;
    int64_t int_ = 0;
    double float_;
    const char* object_type_;  // Undefined: the type its owner had
  };
  std::shared_ptr<void> heap_;  // the text, list, dict, iterator or object; an undefined's name
};

// How deeply values may nest (lists in lists, dicts in dicts): a deeper value is refused
// when it is built, so that printing, comparing and freeing it cannot exhaust the stack.
inline constexpr uint32_t kMaxValueNesting = 512;

// Nesting depth of a value: 0 for scalars, 1 + its deepest element for containers.
uint32_t nesting_of(const Value& v);

struct ListData {
  std::vector<Value> items;
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // Range only: printed by repr
  uint32_t depth = 1;
};

// A one-shot iterator (a Python generator): iterating consumes it, copies share it.
struct IteratorData {
  std::vector<Value> items;
  size_t position = 0;
  const char* python_type = "generator";
  uint32_t depth = 1;
};

// An insertion-ordered dict with Python's key equality (1, 1.0 and True are one key).
class Dict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Adds or replaces (a replaced entry keeps its first key and its place, as in Python).
  void set(const Value& key, Value value);
  void set(std::string_view key, Value value);
  // Adds a key known not to be there yet (JSON objects, namespace() arguments).
  void append(Value key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  void reserve(size_t n) { entries_.reserve(n); }
  void clear() { entries_.clear(); }
  uint32_t depth() const { return depth_; }

 private:
  void note_depth(const Value& key, const Value& value);

  std::vector<std::pair<Value, Value>> entries_;
  uint32_t depth_ = 1;
};

// Something with behaviour of its own: macros, built-in functions, bound methods, loop.
class Object {
 public:
  virtual ~Object() = default;
  virtual const char* python_type() const = 0;
  // jinja2's object_type_repr of it ("jinja2.runtime.LoopContext object").
  virtual const char* object_type() const = 0;
  virtual std::string repr() const = 0;
  virtual bool is_callable() const { return false; }
  virtual Value call(Interpreter& interp, Arguments& args);
  // An attribute, or an undefined value when there is none.
  virtual Value attribute(std::string_view name) const;
  // Nesting depth of the values it holds (see kMaxValueNesting).
  virtual uint32_t nesting() const { return 0; }
};

// A method bound to its object (loop.cycle, cycler.next, ...): Python's "method" type.
class BoundMethod : public Object {
 public:
  const char* python_type() const override { return "method"; }
  const char* object_type() const override { return "method object"; }
  bool is_callable() const override { return true; }
};

// Python's == (numbers compare across int/float/bool; tuples never equal lists).
bool equals(const Value& a, const Value& b);
// A Bool or Int (wide ones included) as an exact integer.
__int128 exact_integer(const Value& v);
// Whether a value can be a dict key (Python's hashable); lists, dicts are not.
bool is_hashable(const Value& v);

}  // namespace step35::jinja
