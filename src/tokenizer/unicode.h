// UTF-8 decoding/encoding that never fails, and the Unicode character classes the
// pre-tokenizer regexes need (\p{L} \p{M} \p{N} \p{P} \p{S}, \s).
//
// Decoding is strict (no overlong forms, no surrogates, nothing above U+10FFFF): every byte
// that does not start a well-formed sequence is reported as invalid on its own, so callers
// can keep such bytes as opaque one-byte units and reproduce the input exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace step35::unicode {

// Unicode general category, reduced to its major class (first letter).
enum class Category : uint8_t {
  OTHER = 0,      // C*: control, format, surrogate, private use, unassigned
  LETTER = 1,     // L*
  MARK = 2,       // M*
  NUMBER = 3,     // N*
  PUNCT = 4,      // P*
  SYMBOL = 5,     // S*
  SEPARATOR = 6,  // Z*
};

// Category of a code point; OTHER for anything above U+10FFFF.
Category category(uint32_t cp);

// The "\s" set of std::regex / PCRE with Unicode whitespace: \t \n \v \f \r, space,
// U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_whitespace(uint32_t cp);

// Unicode version of the generated category table (e.g. "14.0.0").
const char* table_version();

enum class Utf8Status : uint8_t {
  VALID,      // a well-formed sequence of `len` bytes
  INVALID,    // the byte at the position can never start a well-formed sequence here
  TRUNCATED,  // a well-formed prefix that runs into the end of the input
};

struct Utf8Char {
  uint32_t cp = 0;  // the code point (VALID); the byte value otherwise
  uint32_t len = 1; // bytes consumed: the sequence length (VALID) or 1
  Utf8Status status = Utf8Status::INVALID;
};

// Decodes the sequence starting at s[pos] (pos < s.size()).
Utf8Char decode_utf8(std::string_view s, size_t pos);

// Appends the UTF-8 form of cp; a surrogate or a value above U+10FFFF appends U+FFFD.
void append_utf8(std::string& out, uint32_t cp);

// True when s is entirely well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

namespace detail {
// Generated range table (unicode_data.cpp): range i covers [kRangeStart[i], kRangeStart[i+1]).
extern const char* const kUnicodeVersion;
extern const size_t kRangeCount;
extern const uint32_t kRangeStart[];
extern const uint8_t kRangeClass[];
}  // namespace detail

}  // namespace step35::unicode
