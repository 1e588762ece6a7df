// UTF-8 decoding that never fails (each invalid byte becomes a code point of its own
// class) and coarse Unicode general categories for the pre-tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace step35 {

enum class Category : uint8_t { OTHER = 0, LETTER = 1, MARK = 2, NUMBER = 3, PUNCT = 4, SYMBOL = 5, SEPARATOR = 6 };

// One decoded unit of the input: a code point and the bytes it spans. Invalid UTF-8
// bytes give cp = kInvalid + byte, spanning one byte, so every input round-trips.
struct CodeUnit {
  uint32_t cp;
  uint32_t offset;  // byte offset in the input
  uint32_t len;     // bytes
};
constexpr uint32_t kInvalidBase = 0x80000000u;

std::vector<CodeUnit> decode_utf8(std::string_view s);
// Length of a valid UTF-8 sequence starting at s[i] (1..4), or 0 if invalid/truncated.
size_t utf8_sequence_length(std::string_view s, size_t i);
void append_utf8(std::string& out, uint32_t cp);

Category category(uint32_t cp);
bool is_whitespace(uint32_t cp);  // regex \s

namespace unicode_data {
struct CategoryRange {
  uint32_t first, last;
  uint8_t category;
};
extern const CategoryRange kRanges[];
extern const size_t kNumRanges;
}  // namespace unicode_data

}  // namespace step35
