#include "jinja/error.h"

namespace step35::jinja {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Syntax: return "syntax error";
    case ErrorKind::Undefined: return "undefined value";
    case ErrorKind::Type: return "type error";
    case ErrorKind::Security: return "sandbox";
    case ErrorKind::Raised: return "raise_exception";
    case ErrorKind::Limit: return "limit";
  }
  return "error";
}

namespace {

std::string describe(ErrorKind kind, const std::string& message, uint32_t line, uint32_t column) {
  std::string text;
  if (line != 0) text = std::to_string(line) + ":" + std::to_string(column) + ": ";
  text += error_kind_name(kind);
  text += ": ";
  text += message;
  return text;
}

}  // namespace

Error::Error(ErrorKind kind, std::string message, uint32_t line, uint32_t column)
    : std::runtime_error(describe(kind, message, line, column)),
      kind_(kind),
      message_(std::move(message)),
      line_(line),
      column_(column) {}

void type_error(std::string message) { throw Error(ErrorKind::Type, std::move(message)); }

}  // namespace step35::jinja
