// Python's str semantics on UTF-8 text: templates index, slice and measure strings in code
// points, strip Unicode whitespace, change case and print reprs as Python does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace step35::jinja::text {

// Appends the UTF-8 encoding of a code point (surrogates are encoded as 3 bytes, as
// Python's "surrogatepass" would, so that '\ud83d' survives as a value).
void append_utf8(std::string& out, uint32_t cp);

// Decodes the code point starting at byte `pos` and advances pos past it. Text here is
// valid UTF-8 (templates are checked when parsed, JSON strings when read); a stray byte
// decodes as itself so that nothing can read past the end.
uint32_t next_code_point(std::string_view s, size_t& pos);

bool is_ascii(std::string_view s);
bool is_valid_utf8(std::string_view s);
// Number of code points (Python's len()).
size_t length(std::string_view s);
// Byte offset of each code point, plus s.size() at the end (size length(s) + 1).
std::vector<size_t> code_point_offsets(std::string_view s);

// Python's str.isspace() for one code point.
bool is_space(uint32_t cp);
// Python's \w for one code point (letters, digits, underscore; every non-ASCII code point
// that is not whitespace or common punctuation counts as a letter).
bool is_word(uint32_t cp);
// Whether Python's repr() prints the code point itself rather than an escape.
bool is_printable(uint32_t cp);

// Case mapping: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (simple one-to-one
// mappings, plus 'ß' -> "SS" for upper()).
std::string upper(std::string_view s);
std::string lower(std::string_view s);
bool is_upper_cp(uint32_t cp);
bool is_lower_cp(uint32_t cp);
uint32_t to_upper_cp(uint32_t cp);
uint32_t to_lower_cp(uint32_t cp);

// str.strip / lstrip / rstrip: with chars empty and strip_whitespace set, Unicode whitespace.
std::string_view strip(std::string_view s, bool left, bool right);
std::string_view strip_chars(std::string_view s, std::string_view chars, bool left, bool right);

// str.splitlines(keepends): lines split at \n, \r, \r\n, \v, \f, \x1c-\x1e, U+0085,
// U+2028 and U+2029, each with its line break when keep_ends is set.
std::vector<std::string> split_lines(std::string_view s, bool keep_ends);

// str.title() and str.capitalize(), and jinja2's title filter (words start after
// whitespace, '-', '(', '{', '[' or '<').
std::string python_title(std::string_view s);
std::string python_capitalize(std::string_view s);
std::string jinja_title(std::string_view s);

// Python's repr() of a str: single quotes unless the text holds ' and no ", escapes.
std::string repr(std::string_view s);

}  // namespace step35::jinja::text
