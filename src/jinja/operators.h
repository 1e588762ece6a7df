// Python's operators on template values: arithmetic (with int64 overflow checks), string
// and list concatenation and repetition, ordering comparisons, membership, and the HTML
// escaping of Markup. Errors are jinja::Error with Python's messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "jinja/value.h"

namespace step35::jinja {

// Throws the error that using an undefined value raises (UndefinedError, or SecurityError
// for an attribute the sandbox forbids).
[[noreturn]] void raise_undefined(const Value& undefined);

// a OP b for OP in + - * / // % **; max_size bounds the bytes of strings and lists built.
Value binary_operation(std::string_view op, const Value& a, const Value& b, size_t max_size);
// -a and +a.
Value negate(const Value& a);
Value unary_plus(const Value& a);
// a OP b for OP in < <= > >= (== and != are equals()).
bool compare(std::string_view op, const Value& a, const Value& b);
// Python's "item in container".
bool contains(const Value& container, const Value& item);
// markupsafe.escape: & < > ' " as HTML entities; Markup passes unchanged.
Value html_escape(const Value& v);
std::string html_escape_text(std::string_view s);

}  // namespace step35::jinja
