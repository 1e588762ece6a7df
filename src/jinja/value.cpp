#include "jinja/value.h"

#include <cmath>

#include "jinja/error.h"
#include "jinja/format.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

[[noreturn]] void too_deep() {
  throw Error(ErrorKind::Limit, "values nested more than " + std::to_string(kMaxValueNesting) + " levels deep");
}

uint32_t deepest(const std::vector<Value>& items) {
  uint32_t depth = 0;
  for (const Value& v : items) {
    const uint32_t d = nesting_of(v);
    if (d > depth) depth = d;
  }
  return depth;
}

// Guards the recursion of printing and comparing (a namespace can hold itself).
struct NestingGuard {
  explicit NestingGuard(uint32_t& depth) : depth_(depth) {
    if (++depth_ > kMaxValueNesting) {
      --depth_;
      too_deep();
    }
  }
  ~NestingGuard() { --depth_; }
  uint32_t& depth_;
};

thread_local uint32_t g_print_depth = 0;
thread_local uint32_t g_compare_depth = 0;

}  // namespace

uint32_t nesting_of(const Value& v) {
  switch (v.kind()) {
    case ValueKind::List: return v.list_data().depth;
    case ValueKind::Dict: return v.dict_value().depth();
    case ValueKind::Iterator: return v.iterator_data().depth;
    case ValueKind::Object: return v.object_value().nesting();
    default: return 0;
  }
}

// --- construction ---------------------------------------------------------------------------

Value Value::holding(ValueKind kind, uint8_t flags, std::shared_ptr<void> heap) {
  Value v;
  v.kind_ = kind;
  v.flags_ = flags;
  v.heap_ = std::move(heap);
  return v;
}

Value Value::undefined_because(UndefinedReason reason, const char* object_type, std::shared_ptr<std::string> text) {
  Value v = holding(ValueKind::Undefined, static_cast<uint8_t>(reason), std::move(text));
  if (object_type) v.object_type_ = object_type;
  return v;
}

Value Value::undefined_missing(std::shared_ptr<const std::string> name) {
  return undefined_because(UndefinedReason::Missing, nullptr, std::const_pointer_cast<std::string>(std::move(name)));
}

Value Value::undefined_attribute(const char* object_type, std::shared_ptr<const std::string> name) {
  return undefined_because(UndefinedReason::Attribute, object_type,
                           std::const_pointer_cast<std::string>(std::move(name)));
}

Value Value::undefined_element(const char* object_type, std::string key_repr) {
  return undefined_because(UndefinedReason::Element, object_type, std::make_shared<std::string>(std::move(key_repr)));
}

Value Value::undefined_unsafe(const char* python_type, std::string name) {
  return undefined_because(UndefinedReason::Unsafe, python_type, std::make_shared<std::string>(std::move(name)));
}

Value Value::undefined_hint(std::string message) {
  return undefined_because(UndefinedReason::Hint, nullptr, std::make_shared<std::string>(std::move(message)));
}

Value Value::none() {
  Value v;
  v.kind_ = ValueKind::None;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = ValueKind::Bool;
  v.int_ = 0;
  v.bool_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = ValueKind::Int;
  v.int_ = i;
  return v;
}

Value Value::wide_integer(uint64_t u) {
  Value v;
  v.kind_ = ValueKind::Int;
  v.flags_ = 1;
  v.int_ = static_cast<int64_t>(u);
  return v;
}

void Value::wide_int_used() const {
  type_error("the integer " + std::to_string(wide_int_value()) +
             " is above 2**63-1: step35 prints and compares it but computes with 64-bit integers");
}

Value Value::number(double f) {
  Value v;
  v.kind_ = ValueKind::Float;
  v.float_ = f;
  return v;
}

Value Value::string(std::string s) { return holding(ValueKind::String, 0, std::make_shared<std::string>(std::move(s))); }

Value Value::string(std::shared_ptr<const std::string> s) {
  return holding(ValueKind::String, 0, std::const_pointer_cast<std::string>(std::move(s)));
}

Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.flags_ = 1;
  return v;
}

Value Value::string_like(const Value& like, std::string s) {
  return like.is_markup() ? markup(std::move(s)) : string(std::move(s));
}

Value Value::list(std::vector<Value> items, ListFlavor flavor) {
  const uint32_t depth = deepest(items) + 1;
  if (depth > kMaxValueNesting) too_deep();
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->depth = depth;
  return holding(ValueKind::List, static_cast<uint8_t>(flavor), std::move(data));
}

Value Value::range(int64_t start, int64_t stop, int64_t step, std::vector<Value> items) {
  Value v = list(std::move(items), ListFlavor::Range);
  auto& data = *static_cast<ListData*>(v.heap_.get());
  data.range_start = start;
  data.range_stop = stop;
  data.range_step = step;
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) { return holding(ValueKind::Dict, 0, std::move(d)); }

Value Value::namespace_of(std::shared_ptr<Dict> attributes) {
  return holding(ValueKind::Namespace, 0, std::move(attributes));
}

Value Value::iterator(std::vector<Value> items, const char* python_type) {
  const uint32_t depth = deepest(items) + 1;
  if (depth > kMaxValueNesting) too_deep();
  auto data = std::make_shared<IteratorData>();
  data->items = std::move(items);
  data->python_type = python_type;
  data->depth = depth;
  return holding(ValueKind::Iterator, 0, std::move(data));
}

Value Value::object(std::shared_ptr<Object> o) { return holding(ValueKind::Object, 0, std::move(o)); }

namespace {

Value from_json_at(const nlohmann::ordered_json& json, uint32_t depth) {
  if (depth > kMaxValueNesting) too_deep();
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      // Python keeps integers exact at any size; JSON numbers above uint64 arrive as floats.
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::wide_integer(u);
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& element : json) items.push_back(from_json_at(element, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->reserve(json.size());
      for (const auto& [key, element] : json.items()) {
        d->append(Value::string(key), from_json_at(element, depth + 1));
      }
      return Value::dict(std::move(d));
    }
    case nlohmann::ordered_json::value_t::binary:
    case nlohmann::ordered_json::value_t::discarded: break;
  }
  return Value::none();
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& json) { return from_json_at(json, 1); }

// --- access ---------------------------------------------------------------------------------

bool Value::is_callable() const { return kind_ == ValueKind::Object && object_value().is_callable(); }

double Value::as_double() const {
  switch (kind_) {
    case ValueKind::Bool: return bool_ ? 1.0 : 0.0;
    case ValueKind::Int: return flags_ != 0 ? static_cast<double>(wide_int_value()) : static_cast<double>(int_);
    case ValueKind::Float: return float_;
    default: return 0.0;
  }
}

const std::string& Value::string_value() const { return *static_cast<const std::string*>(heap_.get()); }

std::shared_ptr<const std::string> Value::shared_string() const {
  return std::static_pointer_cast<const std::string>(heap_);
}

const ListData& Value::list_data() const { return *static_cast<const ListData*>(heap_.get()); }
const std::vector<Value>& Value::items() const { return list_data().items; }
const Dict& Value::dict_value() const { return *static_cast<const Dict*>(heap_.get()); }
Dict& Value::namespace_attributes() const { return *static_cast<Dict*>(heap_.get()); }
IteratorData& Value::iterator_data() const { return *static_cast<IteratorData*>(heap_.get()); }
Object& Value::object_value() const { return *static_cast<Object*>(heap_.get()); }
std::shared_ptr<Object> Value::shared_object() const { return std::static_pointer_cast<Object>(heap_); }

bool Value::truthy() const {
  switch (kind_) {
    case ValueKind::Undefined:
    case ValueKind::None: return false;
    case ValueKind::Bool: return bool_;
    case ValueKind::Int: return int_ != 0;
    case ValueKind::Float: return float_ != 0.0;
    case ValueKind::String: return !string_value().empty();
    case ValueKind::List: return !items().empty();
    case ValueKind::Dict: return !dict_value().empty();
    case ValueKind::Namespace:
    case ValueKind::Iterator:
    case ValueKind::Object: return true;
  }
  return false;
}

const char* Value::python_type() const {
  switch (kind_) {
    case ValueKind::Undefined: return "Undefined";
    case ValueKind::None: return "NoneType";
    case ValueKind::Bool: return "bool";
    case ValueKind::Int: return "int";
    case ValueKind::Float: return "float";
    case ValueKind::String: return is_markup() ? "Markup" : "str";
    case ValueKind::List:
      switch (list_flavor()) {
        case ListFlavor::List: return "list";
        case ListFlavor::Tuple: return "tuple";
        case ListFlavor::Range: return "range";
        case ListFlavor::DictItems: return "dict_items";
        case ListFlavor::DictKeys: return "dict_keys";
        case ListFlavor::DictValues: return "dict_values";
      }
      return "list";
    case ValueKind::Dict: return "dict";
    case ValueKind::Namespace: return "Namespace";
    case ValueKind::Iterator: return iterator_data().python_type;
    case ValueKind::Object: return object_value().python_type();
  }
  return "object";
}

const char* Value::object_type() const {
  switch (kind_) {
    case ValueKind::Undefined: return "jinja2.runtime.Undefined object";
    case ValueKind::None: return "None";
    case ValueKind::Bool: return "bool object";
    case ValueKind::Int: return "int object";
    case ValueKind::Float: return "float object";
    case ValueKind::String: return is_markup() ? "markupsafe.Markup object" : "str object";
    case ValueKind::List:
      switch (list_flavor()) {
        case ListFlavor::List: return "list object";
        case ListFlavor::Tuple: return "tuple object";
        case ListFlavor::Range: return "range object";
        case ListFlavor::DictItems: return "dict_items object";
        case ListFlavor::DictKeys: return "dict_keys object";
        case ListFlavor::DictValues: return "dict_values object";
      }
      return "list object";
    case ValueKind::Dict: return "dict object";
    case ValueKind::Namespace: return "jinja2.utils.Namespace object";
    case ValueKind::Iterator: {
      const std::string_view type = iterator_data().python_type;
      if (type == "list_reverseiterator") return "list_reverseiterator object";
      if (type == "reversed") return "reversed object";
      return "generator object";
    }
    case ValueKind::Object: return object_value().object_type();
  }
  return "object";
}

std::string Value::undefined_message() const {
  const std::string* name = static_cast<const std::string*>(heap_.get());
  switch (undefined_reason()) {
    case UndefinedReason::Missing:
      return name == nullptr ? std::string("value is undefined") : text::repr(*name) + " is undefined";
    case UndefinedReason::Attribute:
      return text::repr(object_type_) + " has no attribute " + text::repr(*name);
    case UndefinedReason::Element: return std::string(object_type_) + " has no element " + *name;
    case UndefinedReason::Unsafe:
      return "access to attribute " + text::repr(*name) + " of " + text::repr(object_type_) + " object is unsafe.";
    case UndefinedReason::Hint: return *name;
  }
  return "value is undefined";
}

// --- printing -------------------------------------------------------------------------------

void Value::append_str(std::string& out) const {
  switch (kind_) {
    case ValueKind::Undefined: return;
    case ValueKind::String: out += string_value(); return;
    case ValueKind::Int: out += flags_ != 0 ? std::to_string(wide_int_value()) : std::to_string(int_); return;
    default: append_repr(out); return;
  }
}

void Value::append_repr(std::string& out) const {
  switch (kind_) {
    case ValueKind::Undefined: out += "Undefined"; return;  // repr(Undefined()); str() is ""
    case ValueKind::None: out += "None"; return;
    case ValueKind::Bool: out += bool_ ? "True" : "False"; return;
    case ValueKind::Int: out += flags_ != 0 ? std::to_string(wide_int_value()) : std::to_string(int_); return;
    case ValueKind::Float: out += float_repr(float_); return;
    case ValueKind::String:
      if (is_markup()) {
        out += "Markup(" + text::repr(string_value()) + ")";
      } else {
        out += text::repr(string_value());
      }
      return;
    case ValueKind::List: {
      NestingGuard guard(g_print_depth);
      const ListData& data = list_data();
      const auto append_items = [&](const char* open, const char* close) {
        out += open;
        for (size_t i = 0; i < data.items.size(); ++i) {
          if (i != 0) out += ", ";
          data.items[i].append_repr(out);
        }
        out += close;
      };
      switch (list_flavor()) {
        case ListFlavor::List: append_items("[", "]"); return;
        case ListFlavor::Tuple:
          append_items("(", data.items.size() == 1 ? ",)" : ")");
          return;
        case ListFlavor::Range:
          out += "range(" + std::to_string(data.range_start) + ", " + std::to_string(data.range_stop);
          if (data.range_step != 1) out += ", " + std::to_string(data.range_step);
          out += ")";
          return;
        case ListFlavor::DictItems: append_items("dict_items([", "])"); return;
        case ListFlavor::DictKeys: append_items("dict_keys([", "])"); return;
        case ListFlavor::DictValues: append_items("dict_values([", "])"); return;
      }
      return;
    }
    case ValueKind::Dict:
    case ValueKind::Namespace: {
      NestingGuard guard(g_print_depth);
      if (kind_ == ValueKind::Namespace) out += "<Namespace ";
      out += "{";
      bool first = true;
      for (const auto& [key, value] : dict_value().entries()) {
        if (!first) out += ", ";
        first = false;
        key.append_repr(out);
        out += ": ";
        value.append_repr(out);
      }
      out += "}";
      if (kind_ == ValueKind::Namespace) out += ">";
      return;
    }
    case ValueKind::Iterator:
      out += "<";
      out += iterator_data().python_type;
      out += " object>";
      return;
    case ValueKind::Object: out += object_value().repr(); return;
  }
}

std::string Value::str() const {
  if (kind_ == ValueKind::String) return string_value();
  std::string out;
  append_str(out);
  return out;
}

std::string Value::repr() const {
  std::string out;
  append_repr(out);
  return out;
}

// --- Dict -----------------------------------------------------------------------------------

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.string_value()));
  for (const auto& [k, v] : entries_)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries_)
    if (k.is_string() && k.string_value() == key) return &v;
  return nullptr;
}

void Dict::note_depth(const Value& key, const Value& value) {
  const uint32_t d = std::max(nesting_of(key), nesting_of(value)) + 1;
  if (d > kMaxValueNesting) too_deep();
  if (d > depth_) depth_ = d;
}

void Dict::set(const Value& key, Value value) {
  note_depth(key, value);
  for (auto& [k, v] : entries_) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(key, std::move(value));
}

void Dict::set(std::string_view key, Value value) {
  note_depth(Value(), value);
  for (auto& [k, v] : entries_) {
    if (k.is_string() && k.string_value() == key) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(Value::string(std::string(key)), std::move(value));
}

void Dict::append(Value key, Value value) {
  note_depth(key, value);
  entries_.emplace_back(std::move(key), std::move(value));
}

// --- Object ---------------------------------------------------------------------------------

Value Object::call(Interpreter&, Arguments&) {
  throw Error(ErrorKind::Type, "'" + std::string(python_type()) + "' object is not callable");
}

Value Object::attribute(std::string_view name) const {
  return Value::undefined_attribute(object_type(), std::make_shared<const std::string>(name));
}

// --- equality -------------------------------------------------------------------------------

namespace {

// An integer against a double, exactly (long double holds every int64 and uint64).
bool int_equals_double(__int128 i, double d) { return static_cast<long double>(i) == static_cast<long double>(d); }

}  // namespace

__int128 exact_integer(const Value& v) {
  if (v.is_bool()) return v.bool_value() ? 1 : 0;
  return v.is_wide_int() ? static_cast<__int128>(v.wide_int_value()) : static_cast<__int128>(v.int_value());
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() && b.is_float()) return a.float_value() == b.float_value();
    if (a.is_float()) return int_equals_double(exact_integer(b), a.float_value());
    if (b.is_float()) return int_equals_double(exact_integer(a), b.float_value());
    return exact_integer(a) == exact_integer(b);
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::Undefined:
    case ValueKind::None: return true;
    case ValueKind::String: return a.string_value() == b.string_value();
    case ValueKind::List: {
      if (a.list_flavor() != b.list_flavor()) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      NestingGuard guard(g_compare_depth);
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case ValueKind::Dict: {
      const Dict& x = a.dict_value();
      const Dict& y = b.dict_value();
      if (x.size() != y.size()) return false;
      NestingGuard guard(g_compare_depth);
      for (const auto& [key, value] : x.entries()) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    case ValueKind::Namespace: return &a.dict_value() == &b.dict_value();
    case ValueKind::Iterator: return &a.iterator_data() == &b.iterator_data();
    case ValueKind::Object: return &a.object_value() == &b.object_value();
    default: return false;
  }
}

bool is_hashable(const Value& v) {
  switch (v.kind()) {
    case ValueKind::List:
      if (v.list_flavor() == ListFlavor::Range) return true;
      if (v.list_flavor() != ListFlavor::Tuple) return false;
      for (const Value& item : v.items())
        if (!is_hashable(item)) return false;
      return true;
    case ValueKind::Dict: return false;
    default: return true;
  }
}

}  // namespace step35::jinja
