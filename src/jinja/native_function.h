// A callable implemented in C++: a global function (range, namespace, ...) or a method
// bound to its value ('abc'.upper), as the template sees them.
#pragma once

#include <string>

#include "jinja/value.h"

namespace step35::jinja {

class NativeFunction : public Object {
 public:
  using Body = Value (*)(Interpreter& interp, const NativeFunction& self, Arguments& args);

  // bound_to: the value a method belongs to (undefined for a global function).
  NativeFunction(std::string name, Body body, Value bound_to = Value())
      : name_(std::move(name)), body_(body), bound_to_(std::move(bound_to)) {}

  const std::string& name() const { return name_; }
  const Value& bound_to() const { return bound_to_; }

  const char* python_type() const override {
    return bound_to_.is_undefined() ? "function" : "builtin_function_or_method";
  }
  const char* object_type() const override {
    return bound_to_.is_undefined() ? "function object" : "builtin_function_or_method object";
  }
  std::string repr() const override {
    if (bound_to_.is_undefined()) return "<function " + name_ + ">";
    return "<built-in method " + name_ + " of " + bound_to_.python_type() + " object>";
  }
  bool is_callable() const override { return true; }
  Value call(Interpreter& interp, Arguments& args) override { return body_(interp, *this, args); }
  uint32_t nesting() const override { return nesting_of(bound_to_); }

 private:
  std::string name_;
  Body body_;
  Value bound_to_;
};

}  // namespace step35::jinja
