// The global functions of the environment: jinja2's range (capped as the sandbox caps it),
// dict, namespace, cycler and joiner, and transformers' raise_exception and strftime_now.
#include <ctime>

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/native_function.h"

namespace step35::jinja {

namespace {

// jinja2.sandbox.MAX_RANGE.
constexpr int64_t kMaxRange = 100000;

void no_keywords(const char* function, const Arguments& args) {
  if (!args.keyword.empty()) type_error(std::string(function) + "() takes no keyword arguments");
}

int64_t as_integer(const Value& v) {
  if (v.is_int()) return v.int_value();
  if (v.is_bool()) return v.bool_value();
  type_error(std::string("'") + v.python_type() + "' object cannot be interpreted as an integer");
}

Value range_function(Interpreter& interp, const NativeFunction&, Arguments& args) {
  no_keywords("range", args);
  const auto& a = args.positional;
  if (a.empty() || a.size() > 3) {
    type_error("range expected at most 3 arguments, got " + std::to_string(a.size()));
  }
  int64_t start = 0, stop, step = 1;
  if (a.size() == 1) {
    stop = as_integer(a[0]);
  } else {
    start = as_integer(a[0]);
    stop = as_integer(a[1]);
    if (a.size() == 3) step = as_integer(a[2]);
  }
  if (step == 0) type_error("range() arg 3 must not be zero");
  // Element count, computed without overflow.
  uint64_t count = 0;
  if (step > 0 && start < stop) {
    count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
  } else if (step < 0 && start > stop) {
    count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / (uint64_t(0) - static_cast<uint64_t>(step)) + 1;
  }
  if (count > static_cast<uint64_t>(kMaxRange)) {
    throw Error(ErrorKind::Limit,
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (" + std::to_string(kMaxRange) + ").");
  }
  interp.charge(count);
  std::vector<Value> items;
  items.reserve(count);
  int64_t v = start;
  for (uint64_t i = 0; i < count; ++i, v += (i < count ? step : 0)) items.push_back(Value::integer(v));
  return Value::range(start, stop, step, std::move(items));
}

Value dict_function(Interpreter& interp, const NativeFunction&, Arguments& args) {
  if (args.positional.size() > 1) type_error("dict expected at most 1 argument, got " + std::to_string(args.positional.size()));
  auto d = std::make_shared<Dict>();
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      for (const auto& [key, value] : source.dict_value().entries()) d->set(key, value);
    } else {
      for (const Value& pair : iterate(interp, source)) {
        const std::vector<Value> kv = iterate(interp, pair);
        if (kv.size() != 2) {
          type_error("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        }
        if (!is_hashable(kv[0])) type_error(std::string("unhashable type: '") + kv[0].python_type() + "'");
        d->set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) d->set(std::string_view(key), value);
  interp.charge(d->size());
  return Value::dict(std::move(d));
}

Value namespace_function(Interpreter& interp, const NativeFunction&, Arguments& args) {
  return interp.make_namespace(args);
}

Value raise_exception_function(Interpreter&, const NativeFunction&, Arguments& args) {
  std::string message;
  if (!args.positional.empty()) message = args.positional[0].str();
  throw Error(ErrorKind::Raised, std::move(message));
}

Value strftime_now_function(Interpreter& interp, const NativeFunction&, Arguments& args) {
  no_keywords("strftime_now", args);
  if (args.positional.size() != 1 || !args.positional[0].is_string()) {
    type_error("strftime_now() takes one argument: the format string");
  }
  const std::string& format = args.positional[0].string_value();
  const std::time_t t = std::chrono::system_clock::to_time_t(interp.now());
  std::tm local{};
  localtime_r(&t, &local);
  if (format.empty()) return Value::string("");
  // strftime reports 0 both for "too small" and for an empty result: grow up to a bound.
  for (size_t size = 64 + format.size() * 4; size <= (size_t(1) << 20); size *= 4) {
    std::string out(size, '\0');
    const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
    if (n > 0) {
      out.resize(n);
      return Value::string(std::move(out));
    }
  }
  return Value::string("");
}

// jinja2.utils.Cycler: next(), reset(), current.
class CyclerObject : public Object {
 public:
  explicit CyclerObject(std::vector<Value> items) : items_(std::move(items)) {}
  const char* python_type() const override { return "Cycler"; }
  const char* object_type() const override { return "jinja2.utils.Cycler object"; }
  std::string repr() const override { return "<jinja2.utils.Cycler object>"; }
  uint32_t nesting() const override {
    uint32_t n = 1;
    for (const Value& v : items_) n = std::max(n, nesting_of(v) + 1);
    return n;
  }
  Value attribute(std::string_view name) const override {
    if (name == "current") return items_[position_];
    if (name == "next" || name == "reset") {
      auto self = std::make_shared<CyclerMethod>(const_cast<CyclerObject*>(this)->self_.lock(), name == "next");
      return Value::object(std::move(self));
    }
    return Object::attribute(name);
  }
  std::weak_ptr<CyclerObject> self_;

 private:
  class CyclerMethod : public BoundMethod {
   public:
    CyclerMethod(std::shared_ptr<CyclerObject> cycler, bool is_next) : cycler_(std::move(cycler)), is_next_(is_next) {}
    std::string repr() const override { return is_next_ ? "<bound method Cycler.next>" : "<bound method Cycler.reset>"; }
    Value call(Interpreter&, Arguments&) override {
      CyclerObject& c = *cycler_;
      if (!is_next_) {
        c.position_ = 0;
        return Value::none();
      }
      Value v = c.items_[c.position_];
      c.position_ = (c.position_ + 1) % c.items_.size();
      return v;
    }

   private:
    std::shared_ptr<CyclerObject> cycler_;
    bool is_next_;
  };

  std::vector<Value> items_;
  size_t position_ = 0;
};

Value cycler_function(Interpreter&, const NativeFunction&, Arguments& args) {
  no_keywords("cycler", args);
  if (args.positional.empty()) type_error("at least one item has to be provided");
  auto cycler = std::make_shared<CyclerObject>(args.positional);
  cycler->self_ = cycler;
  return Value::object(std::move(cycler));
}

// jinja2.utils.Joiner: "" the first time it is called, then the separator.
class JoinerObject : public Object {
 public:
  explicit JoinerObject(std::string separator) : separator_(std::move(separator)) {}
  const char* python_type() const override { return "Joiner"; }
  const char* object_type() const override { return "jinja2.utils.Joiner object"; }
  std::string repr() const override { return "<jinja2.utils.Joiner object>"; }
  bool is_callable() const override { return true; }
  Value call(Interpreter&, Arguments&) override {
    if (!used_) {
      used_ = true;
      return Value::string("");
    }
    return Value::string(separator_);
  }

 private:
  std::string separator_;
  bool used_ = false;
};

Value joiner_function(Interpreter&, const NativeFunction&, Arguments& args) {
  const std::vector<Value> bound = bind_arguments("joiner", args, {{"sep", Value::string(", ")}});
  return Value::object(std::make_shared<JoinerObject>(bound[0].str()));
}

struct GlobalEntry {
  const char* name;
  NativeFunction::Body body;
};

constexpr GlobalEntry kGlobals[] = {
    {"range", range_function},         {"dict", dict_function},
    {"namespace", namespace_function}, {"cycler", cycler_function},
    {"joiner", joiner_function},       {"raise_exception", raise_exception_function},
    {"strftime_now", strftime_now_function},
};

}  // namespace

Value global_function(std::string_view name) {
  // Built once; the objects are immutable, so renders on several threads share them.
  static const std::vector<Value> functions = [] {
    std::vector<Value> v;
    for (const GlobalEntry& entry : kGlobals) v.push_back(Value::object(std::make_shared<NativeFunction>(entry.name, entry.body)));
    return v;
  }();
  for (size_t i = 0; i < std::size(kGlobals); ++i)
    if (name == kGlobals[i].name) return functions[i];
  return Value();
}

}  // namespace step35::jinja
