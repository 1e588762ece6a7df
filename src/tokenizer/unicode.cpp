#include "tokenizer/unicode.h"

#include <algorithm>

namespace step35 {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t len;
  uint32_t min_cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) len = 2, min_cp = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, min_cp = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, min_cp = 0x10000;
  else return 0;
  if (i + len > s.size()) return 0;
  uint32_t cp = c & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

std::vector<CodeUnit> decode_utf8(std::string_view s) {
  std::vector<CodeUnit> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (len == 0) {
      out.push_back({kInvalidBase + c, uint32_t(i), 1});
      ++i;
      continue;
    }
    uint32_t cp = len == 1 ? c : (c & (0xFF >> (len + 1)));
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back({cp, uint32_t(i), uint32_t(len)});
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

Category category(uint32_t cp) {
  if (cp >= kInvalidBase) return Category::OTHER;
  using unicode_data::kNumRanges;
  using unicode_data::kRanges;
  const auto* end = kRanges + kNumRanges;
  const auto* it = std::upper_bound(kRanges, end, cp,
                                    [](uint32_t v, const unicode_data::CategoryRange& r) { return v < r.first; });
  if (it == kRanges) return Category::OTHER;
  --it;
  return cp <= it->last ? Category(it->category) : Category::OTHER;
}

bool is_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

}  // namespace step35
