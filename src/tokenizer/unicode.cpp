#include "tokenizer/unicode.h"

#include <algorithm>

namespace step35::unicode {

Category category(uint32_t cp) {
  if (cp >= 0x110000) return Category::OTHER;
  // Last range whose start is <= cp. kRangeStart[0] is 0, so the result is never begin-1.
  const uint32_t* begin = detail::kRangeStart;
  const uint32_t* end = detail::kRangeStart + detail::kRangeCount;
  const uint32_t* it = std::upper_bound(begin, end, cp);
  return static_cast<Category>(detail::kRangeClass[(it - begin) - 1]);
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x0085: case 0x00A0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const char* table_version() { return detail::kUnicodeVersion; }

// Well-formed UTF-8 (Unicode Table 3-7): the allowed range of the second byte depends on
// the lead byte, which is what excludes overlong forms, surrogates and values > U+10FFFF.
Utf8Char decode_utf8(std::string_view s, size_t pos) {
  Utf8Char r;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  r.cp = b0;
  if (b0 < 0x80) {
    r.status = Utf8Status::VALID;
    return r;
  }
  uint32_t need = 0;  // continuation bytes
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  uint32_t cp = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1; cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2; cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;       // overlong below U+0800
    if (b0 == 0xED) hi = 0x9F;       // surrogates U+D800-U+DFFF
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3; cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;       // overlong below U+10000
    if (b0 == 0xF4) hi = 0x8F;       // above U+10FFFF
  } else {
    r.status = Utf8Status::INVALID;  // continuation byte, C0, C1, F5-FF
    return r;
  }
  for (uint32_t k = 1; k <= need; ++k) {
    if (pos + k >= s.size()) {
      r.status = Utf8Status::TRUNCATED;
      return r;
    }
    const uint8_t b = byte(pos + k);
    const uint8_t klo = (k == 1) ? lo : 0x80;
    const uint8_t khi = (k == 1) ? hi : 0xBF;
    if (b < klo || b > khi) {
      r.status = Utf8Status::INVALID;
      return r;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  r.cp = cp;
  r.len = need + 1;
  r.status = Utf8Status::VALID;
  return r;
}

void append_utf8(std::string& out, uint32_t cp) {
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Char c = decode_utf8(s, pos);
    if (c.status != Utf8Status::VALID) return false;
    pos += c.len;
  }
  return true;
}

}  // namespace step35::unicode
