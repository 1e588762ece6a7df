// Python's formatting of values into text: repr() of floats, the % operator (printf-style),
// str.format() with its format-spec mini-language.
#pragma once

#include <string>
#include <string_view>

#include "jinja/value.h"

namespace step35::jinja {

// Widths and precisions in format specs above this are refused (Python would allocate).
inline constexpr int64_t kMaxFormatWidth = 1 << 20;

// repr(float): the shortest text that reads back as the same double, in Python's layout
// ("1.0", "1e-05", "1e+16", "1000000000000000.0", "inf", "nan").
std::string float_repr(double x);

// str % args: args is the right operand (a tuple supplies several values; a dict serves
// %(key)s conversions; anything else is the one value).
std::string percent_format(std::string_view format, const Value& args);

// How str.format resolves "{0.name}" and "{0[key]}" (the sandbox's getattr / getitem).
using FieldLookup = Value (*)(const Value& object, const Value& key, bool as_attribute);

// str.format(*args, **kwargs).
std::string str_format(std::string_view format, const Arguments& args, FieldLookup lookup);

// format(value, spec): the format-spec mini-language for str, int, bool and float.
std::string format_value(const Value& v, std::string_view spec);

}  // namespace step35::jinja
