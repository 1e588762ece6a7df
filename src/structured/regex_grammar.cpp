// Code point sets as UTF-8 grammar fragments, and the regex subset. See regex_grammar.h.
#include "structured/regex_grammar.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "tokenizer/unicode.h"

namespace step35::grammar {

namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr size_t kMaxPatternBytes = 8192;
constexpr uint32_t kMaxRepeat = 10000;
constexpr int kMaxGroupDepth = 64;

// Decodes one code point at s[pos]; returns its length, 0 for invalid UTF-8.
size_t decode_utf8(std::string_view s, size_t pos, uint32_t& cp) {
  const uint8_t c0 = uint8_t(s[pos]);
  if (c0 < 0x80) {
    cp = c0;
    return 1;
  }
  size_t len;
  uint32_t min;
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2, cp = c0 & 0x1F, min = 0x80;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3, cp = c0 & 0x0F, min = 0x800;
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4, cp = c0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (pos + len > s.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t c = uint8_t(s[pos + i]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > kMaxCp || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// The canonical encoding of one code point inside a JSON string literal (what
// nlohmann::json::dump writes): short escapes, \u00xx for other controls, else UTF-8.
std::string json_char(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  std::string out;
  if (cp < 0x20) {
    static const char* hex = "0123456789abcdef";
    out = "\\u00";
    out += hex[cp >> 4];
    out += hex[cp & 15];
    return out;
  }
  unicode::append_utf8(out, cp);
  return out;
}

using ByteRange = std::pair<uint8_t, uint8_t>;
using ByteSeq = std::vector<ByteRange>;

// Splits [lo, hi] (same UTF-8 length `len`, no surrogates) into sequences of byte ranges
// whose cross products are exactly the encodings of the code points in the range: first
// cut where a continuation-byte suffix is neither all-zero at lo nor all-one at hi, then
// every remaining piece is a product of per-byte ranges.
void utf8_split(uint32_t lo, uint32_t hi, size_t len, std::vector<ByteSeq>& out) {
  if (lo > hi) return;
  for (size_t i = 1; i < len; ++i) {
    const uint32_t m = (uint32_t(1) << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, len, out);
        utf8_split((lo | m) + 1, hi, len, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, len, out);
        utf8_split(hi & ~m, hi, len, out);
        return;
      }
    }
  }
  std::string a, b;
  unicode::append_utf8(a, lo);
  unicode::append_utf8(b, hi);
  ByteSeq seq;
  for (size_t i = 0; i < a.size(); ++i) seq.push_back({uint8_t(a[i]), uint8_t(b[i])});
  out.push_back(std::move(seq));
}

std::vector<ByteSeq> utf8_sequences(const CpSet& set) {
  static const uint32_t first[4] = {0, 0x80, 0x800, 0x10000};
  static const uint32_t last[4] = {0x7F, 0x7FF, 0xFFFF, kMaxCp};
  std::vector<ByteSeq> out;
  for (const auto& [lo, hi] : set)
    for (size_t len = 1; len <= 4; ++len) {
      const uint32_t a = std::max(lo, first[len - 1]), b = std::min(hi, last[len - 1]);
      if (a <= b) utf8_split(a, b, len, out);
    }
  return out;
}

// One alternative per distinct continuation tail, the lead bytes sharing a tail merged
// into one byte set (so "any character" is 8 alternatives, not dozens).
void emit_sequences(Builder& b, const std::vector<ByteSeq>& seqs, uint32_t next, std::vector<uint32_t>& options) {
  std::map<ByteSeq, ByteSet> by_tail;
  for (const ByteSeq& s : seqs) {
    ByteSeq tail(s.begin() + 1, s.end());
    by_tail[tail].add_range(s[0].first, s[0].second);
  }
  for (const auto& [tail, lead] : by_tail) {
    uint32_t cur = next;
    for (size_t i = tail.size(); i > 0; --i) cur = b.range(tail[i - 1].first, tail[i - 1].second, cur);
    options.push_back(b.match(lead, cur));
  }
}

bool is_ascii_alnum(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

const CpSet& digit_set() {
  static const CpSet s = {{'0', '9'}};
  return s;
}
const CpSet& word_set() {
  static const CpSet s = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return s;
}
const CpSet& space_set() {  // ECMAScript \s: WhiteSpace and LineTerminator
  static const CpSet s = cp_normalize({{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                       {0xFEFF, 0xFEFF}});
  return s;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view p) : p_(p) {}

  Regex parse() {
    if (p_.size() > kMaxPatternBytes) fail("longer than " + std::to_string(kMaxPatternBytes) + " bytes");
    while (true) {
      Regex::Branch br{};
      if (peek('^')) {
        ++pos_;
        br.anchored_start = true;
      }
      br.node = parse_concat(true, &br.anchored_end);
      re_.branches.push_back(br);
      if (pos_ >= p_.size()) break;
      if (p_[pos_] == '|') {
        ++pos_;
        continue;
      }
      fail("unmatched ')'");
    }
    return std::move(re_);
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    std::string shown(p_.substr(0, 80));
    if (p_.size() > 80) shown += "...";
    throw std::invalid_argument("pattern '" + shown + "': " + why + " at offset " + std::to_string(pos_));
  }
  bool peek(char c) const { return pos_ < p_.size() && p_[pos_] == c; }
  uint32_t add(Regex::Node n) {
    re_.nodes.push_back(std::move(n));
    return uint32_t(re_.nodes.size() - 1);
  }
  uint32_t add_set(CpSet s) {
    Regex::Node n;
    n.kind = Regex::Kind::Set;
    n.set = std::move(s);
    return add(std::move(n));
  }
  uint32_t next_cp() {
    uint32_t cp = 0;
    const size_t len = decode_utf8(p_, pos_, cp);
    if (len == 0) fail("invalid UTF-8");
    pos_ += len;
    return cp;
  }

  uint32_t parse_alt() {
    std::vector<uint32_t> kids{parse_concat(false, nullptr)};
    while (peek('|')) {
      ++pos_;
      kids.push_back(parse_concat(false, nullptr));
    }
    if (kids.size() == 1) return kids[0];
    Regex::Node n;
    n.kind = Regex::Kind::Alt;
    n.kids = std::move(kids);
    return add(std::move(n));
  }

  uint32_t parse_concat(bool top, bool* anchored_end) {
    std::vector<uint32_t> kids;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$') {
        const bool at_end = pos_ + 1 == p_.size() || p_[pos_ + 1] == '|';
        if (!top || !at_end) fail("'$' is only supported at the end of the pattern");
        ++pos_;
        *anchored_end = true;
        break;
      }
      if (p_[pos_] == '^') fail("'^' is only supported at the start of the pattern");
      kids.push_back(parse_repeat());
    }
    if (kids.size() == 1) return kids[0];
    Regex::Node n;
    n.kind = kids.empty() ? Regex::Kind::Empty : Regex::Kind::Concat;
    n.kids = std::move(kids);
    return add(std::move(n));
  }

  // {n}, {n,}, {n,m} at pos_; false (pos_ unchanged) when the text is not a quantifier.
  bool parse_braces(uint32_t& mn, uint32_t& mx) {
    size_t i = pos_ + 1;
    auto number = [&](uint32_t& v) {
      const size_t s = i;
      uint64_t x = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        x = std::min<uint64_t>(x * 10 + uint64_t(p_[i] - '0'), uint64_t(1) << 40);
        ++i;
      }
      v = uint32_t(std::min<uint64_t>(x, UINT32_MAX - 1));
      return i > s;
    };
    if (!number(mn)) return false;
    mx = mn;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(mx)) mx = Regex::kUnbounded;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    pos_ = i + 1;
    return true;
  }

  bool at_quantifier() {
    if (pos_ >= p_.size()) return false;
    const char c = p_[pos_];
    if (c == '*' || c == '+' || c == '?') return true;
    if (c != '{') return false;
    const size_t save = pos_;
    uint32_t a, b;
    const bool q = parse_braces(a, b);
    pos_ = save;
    return q;
  }

  uint32_t parse_repeat() {
    const uint32_t atom = parse_atom();
    if (!at_quantifier()) return atom;
    uint32_t mn = 0, mx = Regex::kUnbounded;
    const char c = p_[pos_];
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      ++pos_;
      mn = 1;
    } else if (c == '?') {
      ++pos_;
      mx = 1;
    } else {
      parse_braces(mn, mx);
      if (mx != Regex::kUnbounded && mx < mn) fail("numbers out of order in {} quantifier");
      if (mn > kMaxRepeat || (mx != Regex::kUnbounded && mx > kMaxRepeat))
        fail("repetition count above " + std::to_string(kMaxRepeat));
    }
    if (peek('?')) ++pos_;  // lazy: same set of matching strings
    if (at_quantifier()) fail("nothing to repeat (possessive or doubled quantifier)");
    Regex::Node n;
    n.kind = Regex::Kind::Repeat;
    n.kids = {atom};
    n.min = mn;
    n.max = mx;
    return add(std::move(n));
  }

  uint32_t parse_atom() {
    const char c = p_[pos_];
    if (c == '(') {
      if (++depth_ > kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      ++pos_;
      if (peek('?')) {
        ++pos_;
        if (peek(':')) {
          ++pos_;
        } else if (peek('<') && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) fail("unterminated group name");
          pos_ = close + 1;
        } else if (peek('=') || peek('!') || peek('<')) {
          fail("lookaround assertions are not supported");
        } else {
          fail("inline flags / unknown group syntax are not supported");
        }
      }
      const uint32_t inner = parse_alt();
      if (!peek(')')) fail("missing ')'");
      ++pos_;
      --depth_;
      return inner;
    }
    if (c == '[') return add_set(parse_class());
    if (c == '.') {
      ++pos_;
      return add_set(cp_minus(cp_all(), {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      ++pos_;
      return add_set(parse_escape(false));
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    const uint32_t cp = next_cp();
    return add_set({{cp, cp}});
  }

  uint32_t parse_hex(size_t digits) {
    if (pos_ + digits > p_.size()) fail("truncated hex escape");
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const int h = hex_value(p_[pos_ + i]);
      if (h < 0) fail("bad hex escape");
      v = v * 16 + uint32_t(h);
    }
    pos_ += digits;
    return v;
  }

  // After the backslash.
  CpSet parse_escape(bool in_class) {
    if (pos_ >= p_.size()) fail("pattern ends with a backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 'd': return digit_set();
      case 'D': return cp_complement(digit_set());
      case 'w': return word_set();
      case 'W': return cp_complement(word_set());
      case 's': return space_set();
      case 'S': return cp_complement(space_set());
      case 't': return {{'\t', '\t'}};
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0':
        if (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') fail("octal escapes are not supported");
        return {{0, 0}};
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        fail("word boundaries (\\b) are not supported");
      case 'B': fail("\\B is not supported");
      case 'x': {
        const uint32_t v = parse_hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (peek('{')) {
          ++pos_;
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ || close - pos_ > 6) fail("bad \\u{...} escape");
          v = parse_hex(close - pos_);
          ++pos_;
          if (v > kMaxCp) fail("code point above U+10FFFF");
        } else {
          v = parse_hex(4);
          // A surrogate pair written as two escapes is one code point.
          if (v >= 0xD800 && v <= 0xDBFF && pos_ + 6 <= p_.size() && p_[pos_] == '\\' && p_[pos_ + 1] == 'u') {
            const size_t save = pos_;
            pos_ += 2;
            const uint32_t lo = parse_hex(4);
            if (lo >= 0xDC00 && lo <= 0xDFFF) return {{0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00), 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00)}};
            pos_ = save;
          }
        }
        return {{v, v}};  // a lone surrogate matches nothing (it cannot occur in text)
      }
      case 'c': fail("control escapes (\\c) are not supported");
      case 'p':
      case 'P': fail("Unicode property escapes (\\p, \\P) are not supported");
      case 'k': fail("named backreferences are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') fail("backreferences are not supported");
    --pos_;
    const uint32_t cp = next_cp();
    if (cp < 0x80 && is_ascii_alnum(cp)) fail(std::string("unknown escape \\") + char(cp));
    return {{cp, cp}};  // identity escape of punctuation (or any non-alphanumeric)
  }

  CpSet parse_class() {
    ++pos_;  // '['
    bool negate = false;
    if (peek('^')) {
      ++pos_;
      negate = true;
    }
    CpSet set;
    while (true) {
      if (pos_ >= p_.size()) fail("missing ']'");
      if (p_[pos_] == ']') {
        ++pos_;
        break;
      }
      bool single = true;
      uint32_t lo = 0;
      CpSet item;
      if (p_[pos_] == '\\') {
        ++pos_;
        item = parse_escape(true);
        single = item.size() == 1 && item[0].first == item[0].second;
        if (single) lo = item[0].first;
      } else {
        lo = next_cp();
        item = {{lo, lo}};
      }
      if (pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi = 0;
        if (p_[pos_] == '\\') {
          ++pos_;
          const CpSet h = parse_escape(true);
          if (h.size() != 1 || h[0].first != h[0].second) fail("class escape as a range end");
          hi = h[0].first;
        } else {
          hi = next_cp();
        }
        if (!single) fail("class escape as a range start");
        if (hi < lo) fail("range out of order in character class");
        item = {{lo, hi}};
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    set = cp_normalize(std::move(set));
    return negate ? cp_complement(set) : set;
  }

  std::string_view p_;
  size_t pos_ = 0;
  int depth_ = 0;
  Regex re_;
};

uint32_t emit_node(Builder& b, const Regex& re, uint32_t id, TextMode mode, uint32_t next) {
  const Regex::Node& n = re.nodes[id];
  switch (n.kind) {
    case Regex::Kind::Empty:
      return next;
    case Regex::Kind::Set:
      return emit_char_set(b, n.set, mode, next);
    case Regex::Kind::Concat: {
      uint32_t cur = next;
      for (size_t i = n.kids.size(); i > 0; --i) cur = emit_node(b, re, n.kids[i - 1], mode, cur);
      return cur;
    }
    case Regex::Kind::Alt: {
      std::vector<uint32_t> opts;
      for (uint32_t k : n.kids) opts.push_back(emit_node(b, re, k, mode, next));
      return b.alt(std::move(opts));
    }
    case Regex::Kind::Repeat: {
      const uint32_t kid = n.kids[0];
      uint32_t cur = next;
      if (n.max == Regex::kUnbounded) {
        const uint32_t loop = b.placeholder();
        b.set_options(loop, {emit_node(b, re, kid, mode, loop), next});
        cur = loop;
      } else {
        for (uint32_t i = n.min; i < n.max; ++i) cur = b.alt({emit_node(b, re, kid, mode, cur), next});
      }
      for (uint32_t i = 0; i < n.min; ++i) cur = emit_node(b, re, kid, mode, cur);
      return cur;
    }
  }
  return next;
}

}  // namespace

CpSet cp_normalize(CpSet s) {
  for (auto& r : s) r.second = std::min(r.second, kMaxCp);
  s.erase(std::remove_if(s.begin(), s.end(), [](const auto& r) { return r.first > r.second; }), s.end());
  std::sort(s.begin(), s.end());
  CpSet out;
  for (const auto& r : s) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

CpSet cp_complement(const CpSet& s) {
  const CpSet n = cp_normalize(s);
  CpSet out;
  uint32_t start = 0;
  for (const auto& [lo, hi] : n) {
    if (lo > start) out.push_back({start, lo - 1});
    start = hi + 1;
  }
  if (start <= kMaxCp) out.push_back({start, kMaxCp});
  return out;
}

CpSet cp_union(const CpSet& a, const CpSet& b) {
  CpSet s = a;
  s.insert(s.end(), b.begin(), b.end());
  return cp_normalize(std::move(s));
}

CpSet cp_minus(const CpSet& a, const CpSet& b) {
  const CpSet nb = cp_complement(b);
  const CpSet na = cp_normalize(a);
  CpSet out;  // intersection of a with the complement of b
  size_t i = 0, j = 0;
  while (i < na.size() && j < nb.size()) {
    const uint32_t lo = std::max(na[i].first, nb[j].first), hi = std::min(na[i].second, nb[j].second);
    if (lo <= hi) out.push_back({lo, hi});
    if (na[i].second < nb[j].second)
      ++i;
    else
      ++j;
  }
  return out;
}

CpSet cp_all() { return {{0, 0xD7FF}, {0xE000, kMaxCp}}; }

uint32_t emit_char_set(Builder& b, const CpSet& set_in, TextMode mode, uint32_t next) {
  CpSet set = cp_minus(set_in, {{0xD800, 0xDFFF}});
  if (mode == TextMode::RawLine) set = cp_minus(set, {{0, 0}, {'\n', '\n'}});
  std::vector<uint32_t> options;
  if (mode == TextMode::Json) {
    const CpSet escaped = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    emit_sequences(b, utf8_sequences(cp_minus(set, escaped)), next, options);
    const CpSet need_escape = cp_minus(set, cp_complement(escaped));
    // Short escapes one by one; the other controls as "\u00" + two hex digits, one
    // alternative per first digit (so a negated class costs a handful of nodes).
    ByteSet hex_by_high[2];
    for (const auto& [lo, hi] : need_escape)
      for (uint32_t cp = lo; cp <= hi; ++cp) {
        const std::string enc = json_char(cp);
        if (enc.size() == 6)
          hex_by_high[cp >> 4].add(uint8_t(enc[5]));
        else
          options.push_back(b.literal(enc, next));
      }
    for (int high = 0; high < 2; ++high)
      if (!hex_by_high[high].empty())
        options.push_back(b.literal(high ? "\\u001" : "\\u000", b.match(hex_by_high[high], next)));
  } else {
    emit_sequences(b, utf8_sequences(set), next, options);
  }
  return b.alt(std::move(options));
}

uint32_t emit_text(Builder& b, std::string_view utf8, TextMode mode, uint32_t next) {
  if (mode != TextMode::Json) return b.literal(utf8, next);
  std::string enc;
  for (size_t pos = 0; pos < utf8.size();) {
    uint32_t cp = 0;
    const size_t len = decode_utf8(utf8, pos, cp);
    if (len == 0) throw std::invalid_argument("text is not valid UTF-8");
    enc += json_char(cp);
    pos += len;
  }
  return b.literal(enc, next);
}

Regex parse_regex(std::string_view pattern) { return RegexParser(pattern).parse(); }

uint32_t emit_regex(Builder& b, const Regex& re, TextMode mode, uint32_t next) {
  // Unanchored ends: any characters (in the mode's encoding) before / after.
  auto any_run = [&](uint32_t cont) {
    const uint32_t loop = b.placeholder();
    b.set_options(loop, {emit_char_set(b, cp_all(), mode, loop), cont});
    return loop;
  };
  std::vector<uint32_t> options;
  for (const Regex::Branch& br : re.branches) {
    uint32_t cur = br.anchored_end ? next : any_run(next);
    cur = emit_node(b, re, br.node, mode, cur);
    if (!br.anchored_start) cur = any_run(cur);
    options.push_back(cur);
  }
  return b.alt(std::move(options));
}

const char* format_pattern(std::string_view format) {
#define STEP35_DATE "\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:0[1-9]|[12]\\d))"
#define STEP35_TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:(?:[0-5]\\d|60)(?:\\.\\d{1,9})?(?:[Zz]|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
#define STEP35_OCTET "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)"
  if (format == "date") return "^" STEP35_DATE "$";
  if (format == "time") return "^" STEP35_TIME "$";
  if (format == "date-time") return "^" STEP35_DATE "[Tt]" STEP35_TIME "$";
  if (format == "uuid") return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  if (format == "email")
    return "^[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.){1,8}[A-Za-z]{2,24}$";
  if (format == "ipv4") return "^(?:" STEP35_OCTET "\\.){3}" STEP35_OCTET "$";
#undef STEP35_DATE
#undef STEP35_TIME
#undef STEP35_OCTET
  return nullptr;
}

std::shared_ptr<const Grammar> compile_pattern(std::string_view pattern) {
  const Regex re = parse_regex(pattern);
  Builder b;
  const uint32_t root = b.add_rule("pattern");
  b.set_entry(root, emit_regex(b, re, TextMode::Raw, b.ret()));
  try {
    return b.finish(root);
  } catch (const EmptyLanguage&) {
    return nullptr;  // e.g. "[]": matches no string at all
  }
}

bool grammar_matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  if (!g) return false;
  Matcher m(g);
  return m.feed(text) && m.complete();
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace step35::grammar
