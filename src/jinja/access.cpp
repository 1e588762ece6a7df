// Attribute and item access with the immutable sandbox's rules, Python's iter() and
// slicing, and argument binding for the built-in functions.
#include <algorithm>
#include <optional>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/native_function.h"
#include "jinja/operators.h"
#include "jinja/text.h"

namespace step35::jinja {

namespace {

Value invoke_bound_method(Interpreter& interp, const NativeFunction& self, Arguments& args) {
  return call_method(interp, self.bound_to(), self.name(), args);
}

Value bound_method(const Value& object, std::string_view name) {
  return Value::object(std::make_shared<NativeFunction>(std::string(name), invoke_bound_method, object));
}

// Attribute lookup by method name only (no fallback to items).
Value method_attribute(const Value& object, const std::shared_ptr<const std::string>& name, bool* found) {
  *found = true;
  switch (find_method(object, *name)) {
    case MethodAccess::Safe: return bound_method(object, *name);
    case MethodAccess::Unsafe: return Value::undefined_unsafe(object.python_type(), *name);
    case MethodAccess::None: break;
  }
  if (name->size() > 1 && (*name)[0] == '_' && (*name)[1] == '_') {
    return Value::undefined_unsafe(object.python_type(), *name);  // dunder attributes: the sandbox refuses them
  }
  *found = false;
  return Value();
}

// Python index into a sequence of `size`: negative counts from the end; -1 when out of range.
int64_t normalize_index(int64_t index, size_t size) {
  const int64_t n = static_cast<int64_t>(size);
  if (index < 0) index += n;
  return index < 0 || index >= n ? -1 : index;
}

}  // namespace

std::vector<Value> iterate(Interpreter& interp, const Value& v) {
  switch (v.kind()) {
    case ValueKind::Undefined: return {};
    case ValueKind::List: return v.items();
    case ValueKind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_value().size());
      for (const auto& entry : v.dict_value().entries()) keys.push_back(entry.first);
      return keys;
    }
    case ValueKind::String: {
      const std::string& s = v.string_value();
      interp.charge(text::length(s));
      std::vector<Value> chars;
      chars.reserve(s.size());
      for (size_t pos = 0; pos < s.size();) {
        const size_t start = pos;
        text::next_code_point(s, pos);
        chars.push_back(Value::string(s.substr(start, pos - start)));  // iterating a Markup yields plain str
      }
      return chars;
    }
    case ValueKind::Iterator: {
      IteratorData& it = v.iterator_data();
      std::vector<Value> rest(it.items.begin() + static_cast<std::ptrdiff_t>(it.position), it.items.end());
      it.position = it.items.size();
      return rest;
    }
    default: type_error(std::string("'") + v.python_type() + "' object is not iterable");
  }
}

Value get_attribute(const Value& object, const std::shared_ptr<const std::string>& name) {
  switch (object.kind()) {
    case ValueKind::Undefined: raise_undefined(object);
    case ValueKind::Dict: {
      bool found;
      Value method = method_attribute(object, name, &found);
      if (found) return method;
      if (const Value* v = object.dict_value().find(std::string_view(*name))) return *v;
      return Value::undefined_attribute(object.object_type(), name);
    }
    case ValueKind::Namespace:
      if (const Value* v = object.dict_value().find(std::string_view(*name))) return *v;
      return Value::undefined_attribute(object.object_type(), name);
    case ValueKind::Object: {
      if (name->size() > 1 && (*name)[0] == '_' && (*name)[1] == '_') {
        return Value::undefined_unsafe(object.python_type(), *name);
      }
      return object.object_value().attribute(*name);
    }
    default: {
      bool found;
      Value method = method_attribute(object, name, &found);
      if (found) return method;
      return Value::undefined_attribute(object.object_type(), name);
    }
  }
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) raise_undefined(object);
  // The item itself.
  switch (object.kind()) {
    case ValueKind::Dict:
      if (is_hashable(key)) {
        if (const Value* v = object.dict_value().find(key)) return *v;
      }
      break;
    case ValueKind::Namespace:
      if (key.is_string()) {
        if (const Value* v = object.dict_value().find(std::string_view(key.string_value()))) return *v;
      }
      break;
    case ValueKind::List: {
      const ListFlavor flavor = object.list_flavor();
      const bool subscriptable = flavor == ListFlavor::List || flavor == ListFlavor::Tuple || flavor == ListFlavor::Range;
      if (subscriptable && (key.is_int() || key.is_bool())) {
        const int64_t index = key.is_bool() ? key.bool_value() : key.int_value();
        const int64_t at = normalize_index(index, object.items().size());
        if (at >= 0) return object.items()[static_cast<size_t>(at)];
      }
      break;
    }
    case ValueKind::String:
      if (key.is_int() || key.is_bool()) {
        const std::string& s = object.string_value();
        const int64_t index = key.is_bool() ? key.bool_value() : key.int_value();
        if (text::is_ascii(s)) {
          const int64_t at = normalize_index(index, s.size());
          if (at >= 0) return Value::string_like(object, s.substr(static_cast<size_t>(at), 1));
        } else {
          const std::vector<size_t> offsets = text::code_point_offsets(s);
          const int64_t at = normalize_index(index, offsets.size() - 1);
          if (at >= 0) {
            const size_t begin = offsets[static_cast<size_t>(at)];
            return Value::string_like(object, s.substr(begin, offsets[static_cast<size_t>(at) + 1] - begin));
          }
        }
      }
      break;
    default: break;
  }
  // Then an attribute of that name (obj['items'] finds dict.items when there is no such key).
  if (key.is_string()) {
    auto name = std::make_shared<const std::string>(key.string_value());
    if (object.is_dict() || object.is_namespace()) {
      bool found;
      Value method = object.is_dict() ? method_attribute(object, name, &found) : Value();
      if (object.is_dict() && found) return method;
      return Value::undefined_attribute(object.object_type(), name);
    }
    return get_attribute(object, name);
  }
  return Value::undefined_element(object.object_type(), key.repr());
}

namespace {

// A slice bound as an integer: nullopt when omitted (null); when it is not an integer, *ok
// turns false (and the bound reads 0).
std::optional<int64_t> slice_bound(const Value* v, bool* ok) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int()) return v->int_value();
  if (v->is_bool()) return v->bool_value();
  *ok = false;
  return 0;
}

// The positions a slice takes from a sequence.
struct SliceRange {
  int64_t from = 0;
  int64_t to = 0;
  int64_t step = 1;
  size_t count = 0;  // elements taken
  size_t index(size_t k) const { return static_cast<size_t>(from + static_cast<int64_t>(k) * step); }
};

// Python's PySlice_AdjustIndices: the bounds clamped to a sequence of `length`.
SliceRange adjust_slice(std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step, size_t length) {
  const int64_t n = static_cast<int64_t>(length);
  const auto adjust = [&](std::optional<int64_t> bound, int64_t fallback) {
    if (!bound) return fallback;
    int64_t value = *bound;
    if (value < 0) {
      value += n;
      if (value < 0) value = step < 0 ? -1 : 0;
    } else if (value >= n) {
      value = step < 0 ? n - 1 : n;
    }
    return value;
  };
  SliceRange range;
  range.step = step;
  range.from = adjust(start, step < 0 ? n - 1 : 0);
  range.to = adjust(stop, step < 0 ? -1 : n);
  if (step > 0 && range.from < range.to) {
    range.count = static_cast<size_t>((range.to - range.from - 1) / step + 1);
  } else if (step < 0 && range.from > range.to) {
    const uint64_t magnitude = uint64_t(0) - static_cast<uint64_t>(step);  // no overflow at INT64_MIN
    range.count = static_cast<size_t>(static_cast<uint64_t>(range.from - range.to - 1) / magnitude + 1);
  }
  return range;
}

// A slice of a string, in code points (`offsets`: their byte boundaries, empty for ASCII).
Value slice_string(const Value& object, const std::vector<size_t>& offsets, const SliceRange& range) {
  const std::string& s = object.string_value();
  std::string out;
  if (range.count != 0) {
    const auto byte = [&](size_t cp) { return offsets.empty() ? cp : offsets[cp]; };
    if (range.step == 1) {
      out = s.substr(byte(range.index(0)), byte(range.index(range.count - 1) + 1) - byte(range.index(0)));
    } else {
      for (size_t k = 0; k < range.count; ++k) {
        out.append(s, byte(range.index(k)), byte(range.index(k) + 1) - byte(range.index(k)));
      }
    }
  }
  return object.is_markup() ? Value::markup(std::move(out)) : Value::string(std::move(out));
}

// A slice of a list or tuple is one of the same kind; a slice of a range is a range.
Value slice_sequence(const Value& object, const SliceRange& range) {
  std::vector<Value> out;
  out.reserve(range.count);
  for (size_t k = 0; k < range.count; ++k) out.push_back(object.items()[range.index(k)]);
  if (object.list_flavor() == ListFlavor::Range) {
    // range(start + from*step, start + to*step, step*k).
    const ListData& r = object.list_data();
    int64_t new_start, new_stop, new_step, offset;
    if (__builtin_mul_overflow(range.from, r.range_step, &offset) ||
        __builtin_add_overflow(r.range_start, offset, &new_start) ||
        __builtin_mul_overflow(range.to, r.range_step, &offset) ||
        __builtin_add_overflow(r.range_start, offset, &new_stop) ||
        __builtin_mul_overflow(r.range_step, range.step, &new_step)) {
      type_error("integer overflow (step35 keeps integers in 64 bits)");
    }
    return Value::range(new_start, new_stop, new_step, std::move(out));
  }
  return Value::list(std::move(out), object.list_flavor() == ListFlavor::Tuple ? ListFlavor::Tuple : ListFlavor::List);
}

}  // namespace

Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step) {
  bool ok = true;
  const int64_t step_value = step == nullptr ? 1 : *slice_bound(step, &ok);
  const std::optional<int64_t> start_index = slice_bound(start, &ok);
  const std::optional<int64_t> stop_index = slice_bound(stop, &ok);
  const bool sliceable = object.is_string() || (object.is_list() && (object.list_flavor() == ListFlavor::List ||
                                                                      object.list_flavor() == ListFlavor::Tuple ||
                                                                      object.list_flavor() == ListFlavor::Range));
  // jinja2 subscripts slices directly (not through the sandbox's getitem): a value that
  // cannot be sliced is a TypeError.
  if (object.is_dict()) type_error("unhashable type: 'slice'");
  if (!sliceable) type_error(std::string("'") + object.python_type() + "' object is not subscriptable");
  if (!ok) type_error("slice indices must be integers or None or have an __index__ method");
  if (step_value == 0) throw Error(ErrorKind::Type, "slice step cannot be zero");

  if (!object.is_string()) {
    return slice_sequence(object, adjust_slice(start_index, stop_index, step_value, object.items().size()));
  }
  const std::string& s = object.string_value();
  if (text::is_ascii(s)) return slice_string(object, {}, adjust_slice(start_index, stop_index, step_value, s.size()));
  const std::vector<size_t> offsets = text::code_point_offsets(s);
  return slice_string(object, offsets, adjust_slice(start_index, stop_index, step_value, offsets.size() - 1));
}

std::vector<Value> bind_arguments(std::string_view function, const Arguments& args,
                                  const std::vector<Parameter>& parameters) {
  if (args.positional.size() > parameters.size()) {
    type_error(std::string(function) + "() takes at most " + std::to_string(parameters.size()) +
               " argument(s) (" + std::to_string(args.positional.size()) + " given)");
  }
  std::vector<Value> bound(parameters.size());
  std::vector<bool> set(parameters.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    bound[i] = args.positional[i];
    set[i] = true;
  }
  for (const auto& [name, value] : args.keyword) {
    size_t i = 0;
    while (i < parameters.size() && name != parameters[i].name) ++i;
    if (i == parameters.size()) {
      type_error(std::string(function) + "() got an unexpected keyword argument '" + name + "'");
    }
    if (set[i]) type_error(std::string(function) + "() got multiple values for argument '" + name + "'");
    bound[i] = value;
    set[i] = true;
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (set[i]) continue;
    if (!parameters[i].default_value) {
      type_error(std::string(function) + "() missing required argument: '" + parameters[i].name + "'");
    }
    bound[i] = *parameters[i].default_value;
  }
  return bound;
}

}  // namespace step35::jinja
