// Errors of the template language: one exception type, with what went wrong (its kind),
// where (template line and column, 1-based; 0 while the error has not yet been placed)
// and the message alone (what() adds the position).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace step35::jinja {

enum class ErrorKind : uint8_t {
  Syntax,     // the template does not parse (jinja2's TemplateSyntaxError / TemplateAssertionError)
  Undefined,  // an undefined value was used where a value is needed (UndefinedError)
  Type,       // an operation on values of the wrong type (TypeError, ValueError, ZeroDivisionError, ...)
  Security,   // an attribute the immutable sandbox forbids (SecurityError)
  Raised,     // the template called raise_exception(message) (TemplateError)
  Limit,      // a configured bound (output size, steps, depth, value size) was reached
};

// Short name of a kind, as it starts error messages ("syntax error", ...).
const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, uint32_t line = 0, uint32_t column = 0);

  ErrorKind kind() const { return kind_; }
  // The message without position: for Raised, exactly the template's raise_exception text.
  const std::string& message() const { return message_; }
  uint32_t line() const { return line_; }
  uint32_t column() const { return column_; }
  bool has_position() const { return line_ != 0; }
  // The same error placed at a template position (the innermost expression that failed).
  Error at(uint32_t line, uint32_t column) const { return Error(kind_, message_, line, column); }

 private:
  ErrorKind kind_;
  std::string message_;
  uint32_t line_;
  uint32_t column_;
};

// Throws a Type error with this message: Python's TypeError / ValueError of a builtin.
[[noreturn]] void type_error(std::string message);

}  // namespace step35::jinja
