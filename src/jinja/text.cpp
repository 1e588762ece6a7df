#include "jinja/text.h"

#include <cstdio>

namespace step35::jinja::text {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_code_point(std::string_view s, size_t& pos) {
  const uint8_t b0 = static_cast<uint8_t>(s[pos]);
  size_t extra;
  uint32_t cp;
  if (b0 < 0x80) {
    ++pos;
    return b0;
  } else if (b0 >= 0xC0 && b0 < 0xE0) {
    extra = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 < 0xF0) {
    extra = 2;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 < 0xF8) {
    extra = 3;
    cp = b0 & 0x07;
  } else {
    ++pos;
    return b0;
  }
  for (size_t i = 1; i <= extra; ++i) {
    if (pos + i >= s.size() || (static_cast<uint8_t>(s[pos + i]) & 0xC0) != 0x80) {
      ++pos;
      return b0;
    }
    cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  }
  pos += extra + 1;
  return cp;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<uint8_t>(c) >= 0x80) return false;
  return true;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    size_t extra;
    uint32_t min_cp;
    if (b0 < 0x80) {
      ++i;
      continue;
    } else if (b0 >= 0xC2 && b0 < 0xE0) {
      extra = 1;
      min_cp = 0x80;
    } else if (b0 >= 0xE0 && b0 < 0xF0) {
      extra = 2;
      min_cp = 0x800;
    } else if (b0 >= 0xF0 && b0 < 0xF5) {
      extra = 3;
      min_cp = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i <= extra) return false;
    size_t pos = i;
    const uint32_t cp = next_code_point(s, pos);
    if (pos != i + extra + 1 || cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return false;
    i = pos;
  }
  return true;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<uint8_t>(c) & 0xC0) != 0x80) ++n;
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    next_code_point(s, pos);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool is_space(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_word(uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_';
  }
  if (is_space(cp)) return false;
  // Latin-1 punctuation and symbols, General Punctuation, CJK punctuation.
  if (cp < 0xC0) return cp == 0xAA || cp == 0xB5 || cp == 0xBA || cp == 0xB2 || cp == 0xB3 || cp == 0xB9 ||
                        (cp >= 0xBC && cp <= 0xBE);
  if (cp == 0xD7 || cp == 0xF7) return false;
  if (cp >= 0x2000 && cp <= 0x206F) return false;
  if (cp >= 0x3000 && cp <= 0x303F) return false;
  if (cp >= 0xFF00 && cp <= 0xFF0F) return false;
  return true;
}

bool is_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp < 0x300) return true;
  if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x180E) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
  if ((cp >= 0x205F && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000) return false;
  if (cp >= 0xD800 && cp <= 0xF8FF) return false;  // surrogates and the private use area
  if (cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return false;
  if (cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F) || cp >= 0xF0000) return false;
  return true;
}

namespace {

// Upper-case partner of a lower-case code point in the supported blocks, or 0.
uint32_t upper_partner(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return 0;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp == 0xB5) return 0x39C;
  if (cp >= 0x100 && cp <= 0x137) return (cp & 1) ? cp - 1 : 0;
  if (cp == 0x131) return 'I';
  if (cp >= 0x139 && cp <= 0x148) return (cp & 1) ? 0 : cp - 1;
  if (cp >= 0x14A && cp <= 0x177) return (cp & 1) ? cp - 1 : 0;
  if (cp >= 0x179 && cp <= 0x17E) return (cp & 1) ? 0 : cp - 1;
  if (cp == 0x17F) return 'S';
  if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) return cp - 32;
  if (cp == 0x3C2) return 0x3A3;
  if (cp == 0x3AC) return 0x386;
  if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
  if (cp == 0x3CC) return 0x38C;
  if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  if ((cp >= 0x460 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x4BF) || (cp >= 0x4D0 && cp <= 0x4FF))
    return (cp & 1) ? cp - 1 : 0;
  if (cp >= 0xFF41 && cp <= 0xFF5A) return cp - 32;
  return 0;
}

// Lower-case partner of an upper-case code point in the supported blocks, or 0.
uint32_t lower_partner(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return 0;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x100 && cp <= 0x137) return (cp & 1) ? 0 : cp + 1;
  if (cp == 0x130) return 'i';
  if (cp >= 0x139 && cp <= 0x148) return (cp & 1) ? cp + 1 : 0;
  if (cp >= 0x14A && cp <= 0x177) return (cp & 1) ? 0 : cp + 1;
  if (cp >= 0x179 && cp <= 0x17E) return (cp & 1) ? cp + 1 : 0;
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 63;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if ((cp >= 0x460 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x4BF) || (cp >= 0x4D0 && cp <= 0x4FF))
    return (cp & 1) ? 0 : cp + 1;
  if (cp >= 0xFF21 && cp <= 0xFF3A) return cp + 32;
  return 0;
}

template <typename Map>
std::string map_code_points(std::string_view s, Map map) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const uint32_t cp = next_code_point(s, pos);
    map(out, cp);
  }
  return out;
}

void append_upper(std::string& out, uint32_t cp) {
  if (cp == 0xDF) {
    out += "SS";
    return;
  }
  append_utf8(out, to_upper_cp(cp));
}

void append_lower(std::string& out, uint32_t cp) {
  if (cp == 0x130) {  // 'İ'.lower() is "i" + combining dot above
    out += "i\xCC\x87";
    return;
  }
  append_utf8(out, to_lower_cp(cp));
}

bool is_cased(uint32_t cp) { return is_upper_cp(cp) || is_lower_cp(cp) || cp == 0xDF; }

// All-ASCII s with the letters first..first+25 moved by `shift` (to the other case).
std::string shift_ascii_letters(std::string_view s, char first, int shift) {
  std::string out(s);
  for (char& c : out)
    if (c >= first && c <= first + 25) c = static_cast<char>(c + shift);
  return out;
}

}  // namespace

uint32_t to_upper_cp(uint32_t cp) {
  const uint32_t u = upper_partner(cp);
  return u != 0 ? u : cp;
}

uint32_t to_lower_cp(uint32_t cp) {
  const uint32_t l = lower_partner(cp);
  return l != 0 ? l : cp;
}

bool is_upper_cp(uint32_t cp) { return lower_partner(cp) != 0; }
bool is_lower_cp(uint32_t cp) { return upper_partner(cp) != 0 || cp == 0xDF || cp == 0x138; }

std::string upper(std::string_view s) {
  if (is_ascii(s)) return shift_ascii_letters(s, 'a', -32);
  return map_code_points(s, append_upper);
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) return shift_ascii_letters(s, 'A', 32);
  return map_code_points(s, append_lower);
}

namespace {

// Drops leading and/or trailing code points for which `drop` holds (Python's str.strip
// family); a trailing code point is found by stepping back over UTF-8 continuation bytes.
template <typename Pred>
std::string_view strip_code_points(std::string_view s, bool left, bool right, Pred drop) {
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t pos = begin;
      if (!drop(next_code_point(s, pos))) break;
      begin = pos;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
      size_t pos = start;
      if (!drop(next_code_point(s, pos))) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

}  // namespace

std::vector<std::string> split_lines(std::string_view s, bool keep_ends) {
  std::vector<std::string> lines;
  size_t begin = 0, pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    const uint32_t cp = next_code_point(s, next);
    const bool is_break = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
                          cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (!is_break) {
      pos = next;
      continue;
    }
    if (cp == '\r' && next < s.size() && s[next] == '\n') ++next;
    lines.emplace_back(s.substr(begin, (keep_ends ? next : pos) - begin));
    begin = pos = next;
  }
  if (begin < s.size()) lines.emplace_back(s.substr(begin));
  return lines;
}

std::string_view strip(std::string_view s, bool left, bool right) {
  return strip_code_points(s, left, right, [](uint32_t cp) { return is_space(cp); });
}

std::string_view strip_chars(std::string_view s, std::string_view chars, bool left, bool right) {
  std::vector<uint32_t> set;
  for (size_t pos = 0; pos < chars.size();) set.push_back(next_code_point(chars, pos));
  return strip_code_points(s, left, right, [&](uint32_t cp) {
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  });
}

std::string python_title(std::string_view s) {
  // A cased letter after a cased letter is lowered; any other cased letter is raised.
  bool previous_cased = false;
  return map_code_points(s, [&](std::string& out, uint32_t cp) {
    (previous_cased ? append_lower : append_upper)(out, cp);
    previous_cased = is_cased(cp);
  });
}

std::string python_capitalize(std::string_view s) {
  bool first = true;
  return map_code_points(s, [&](std::string& out, uint32_t cp) {
    (first ? append_upper : append_lower)(out, cp);
    first = false;
  });
}

std::string jinja_title(std::string_view s) {
  bool word_start = true;
  return map_code_points(s, [&](std::string& out, uint32_t cp) {
    const bool separator = is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    if (separator) {
      append_utf8(out, cp);
      word_start = true;
    } else {
      (word_start ? append_upper : append_lower)(out, cp);
      word_start = false;
    }
  });
}

std::string repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out += quote;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const uint32_t cp = next_code_point(s, pos);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!is_printable(cp)) {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      } else if (cp < 0x10000) {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      }
      out += buf;
    } else {
      out.append(s.substr(start, pos - start));
    }
  }
  out += quote;
  return out;
}

}  // namespace step35::jinja::text
