// Byte-level BPE tokenizer (docs/architecture.md, "Tokenizer").
//
// encode(): carve special tokens out of the raw text, pre-tokenize every remaining fragment
// with the split rule of tokenizer.ggml.pre, map each piece's bytes to the GPT-2
// byte-level alphabet and merge symbols by rank.
//
// The pre-tokenizer regexes are implemented as hand-written matchers over decoded code
// points (std::regex has no \p{..} classes and is far too slow). Each matcher returns the
// match of its regex at one start position with the regex engine's semantics (ordered
// alternation, greedy quantifiers with backtracking); the driver tries every start position
// left to right like a regex iterator, so the result is the same as the regex split.
// Bytes that are not well-formed UTF-8 become one unit each whose class is "other": they
// match only the negated classes ([^...], \S) and always round-trip unchanged.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "gguf/gguf.h"
#include "tokenizer/unicode.h"

namespace step35 {

namespace {

// ---------------------------------------------------------------------------------------
// GPT-2 bytes_to_unicode: bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves, the
// other 68 bytes to U+0100, U+0101, ... in increasing byte order.

struct ByteMap {
  uint32_t byte_to_cp[256];
  std::string byte_to_utf8[256];
  int16_t cp_to_byte[0x144];  // every mapped code point is below U+0144; -1 = not mapped

  ByteMap() {
    for (int16_t& b : cp_to_byte) b = -1;
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = self ? b : next++;
      unicode::append_utf8(byte_to_utf8[b], byte_to_cp[b]);
      cp_to_byte[byte_to_cp[b]] = int16_t(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Inverse byte-level mapping of a vocabulary string. Code points outside the byte alphabet
// (and bytes that are not UTF-8) are kept as written: such tokens do not come from a
// byte-level vocabulary, and their text is the most useful thing to show.
std::string unmap_bytes(const std::string& s) {
  const ByteMap& bm = byte_map();
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const unicode::Utf8Char c = unicode::decode_utf8(s, pos);
    if (c.status == unicode::Utf8Status::VALID && c.cp < 0x144 && bm.cp_to_byte[c.cp] >= 0) {
      out.push_back(static_cast<char>(bm.cp_to_byte[c.cp]));
    } else {
      out.append(s, pos, c.len);
    }
    pos += c.len;
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Character classes of the pre-tokenizer regexes, one bit each, computed once per unit.

enum : uint16_t {
  F_WS = 1u << 0,            // \s
  F_LETTER = 1u << 1,        // \p{L}
  F_MARK = 1u << 2,          // \p{M}
  F_NUMBER = 1u << 3,        // \p{N}
  F_PUNCT = 1u << 4,         // \p{P}
  F_SYMBOL = 1u << 5,        // \p{S}
  F_CRLF = 1u << 6,          // \r or \n
  F_SPACE = 1u << 7,         // U+0020 (the literal ' ' of the regexes)
  F_ASCII_LETTER = 1u << 8,  // [A-Za-z]
  F_ASCII_PUNCT = 1u << 9,   // [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]
  F_CJK = 1u << 10,          // [一-龥぀-ゟ゠-ヿ]
};
constexpr uint16_t F_LM = F_LETTER | F_MARK;
constexpr uint16_t F_PS = F_PUNCT | F_SYMBOL;
constexpr uint32_t kInvalidByte = 0xFFFFFFFFu;  // cp of a unit that is not UTF-8

uint16_t flags_of_cp(uint32_t cp) {
  // Whitespace first: no whitespace character is a letter, number, mark, punctuation or
  // symbol, and llama.cpp (the fixtures' oracle) also classifies it before the category.
  if (unicode::is_whitespace(cp)) {
    uint16_t f = F_WS;
    if (cp == '\r' || cp == '\n') f |= F_CRLF;
    if (cp == ' ') f |= F_SPACE;
    return f;
  }
  uint16_t f = 0;
  switch (unicode::category(cp)) {
    case unicode::Category::LETTER: f = F_LETTER; break;
    case unicode::Category::MARK: f = F_MARK; break;
    case unicode::Category::NUMBER: f = F_NUMBER; break;
    case unicode::Category::PUNCT: f = F_PUNCT; break;
    case unicode::Category::SYMBOL: f = F_SYMBOL; break;
    default: break;
  }
  // Note on '~' (U+007E): Unicode (and HF tokenizers) class it as a symbol (Sm), and so do
  // we. llama.cpp's std::regex emulation leaves it out of \p{S}; the two differ only for
  // '~' next to other punctuation or symbols (e.g. "~/" is one piece here, two there).
  if (cp < 0x80) {
    if ((cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z')) f |= F_ASCII_LETTER;
    if ((cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
        (cp >= 0x7B && cp <= 0x7E))
      f |= F_ASCII_PUNCT;
  }
  if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF)) f |= F_CJK;
  return f;
}

struct AsciiFlags {
  uint16_t f[128];
  AsciiFlags() {
    for (uint32_t c = 0; c < 128; ++c) f[c] = flags_of_cp(c);
  }
};

uint16_t flags_of(uint32_t cp) {
  static const AsciiFlags ascii;
  return cp < 128 ? ascii.f[cp] : flags_of_cp(cp);
}

struct Unit {
  uint32_t cp;     // code point, or kInvalidByte
  uint16_t flags;  // 0 for an invalid byte: the "other" class
};

// A decoded text: units plus the byte offset of every unit (offsets[units.size()] = size).
struct Decoded {
  std::vector<Unit> units;
  std::vector<size_t> offsets;
};

Decoded decode_units(std::string_view text) {
  Decoded d;
  d.units.reserve(text.size());
  d.offsets.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    const unicode::Utf8Char c = unicode::decode_utf8(text, pos);
    d.offsets.push_back(pos);
    if (c.status == unicode::Utf8Status::VALID) {
      d.units.push_back({c.cp, flags_of(c.cp)});
    } else {
      d.units.push_back({kInvalidByte, 0});
    }
    pos += c.len;
  }
  d.offsets.push_back(text.size());
  return d;
}

// ---------------------------------------------------------------------------------------
// Matchers. Each gets the units of one piece (u[0..n)) and a start i < n, and returns the
// length of the regex match starting at i, or 0 when no alternative matches there.

using Matcher = size_t (*)(const Unit* u, size_t i, size_t n);

size_t run_end(const Unit* u, size_t j, size_t n, uint16_t f) {
  while (j < n && (u[j].flags & f)) ++j;
  return j;
}

bool ascii_is(const Unit& u, char lower) {
  return u.cp == uint32_t(lower) || u.cp == uint32_t(lower - 'a' + 'A');
}

// The contractions 's 't 'm 'd (2 units) and 're 've 'll (3 units) at u[i], 0 for none:
// GPT-2 takes them in lower case only, llama3 in either case.
size_t match_contraction(const Unit* u, size_t i, size_t n, bool any_case) {
  if (u[i].cp != '\'' || i + 1 >= n) return 0;
  auto is = [any_case](const Unit& c, char lower) { return any_case ? ascii_is(c, lower) : c.cp == uint32_t(lower); };
  const Unit& c1 = u[i + 1];
  if (is(c1, 's') || is(c1, 't') || is(c1, 'm') || is(c1, 'd')) return 2;
  if (i + 2 < n) {
    const Unit& c2 = u[i + 2];
    if ((is(c1, 'r') && is(c2, 'e')) || (is(c1, 'v') && is(c2, 'e')) || (is(c1, 'l') && is(c2, 'l'))) return 3;
  }
  return 0;
}

// The start of " ?X" at i: the optional ' ' can only be the space itself (a run never
// starts with a space), so it is taken whenever u[i] is a space and something follows.
size_t after_optional_space(const Unit* u, size_t i, size_t n) {
  return ((u[i].flags & F_SPACE) && i + 1 < n) ? i + 1 : i;
}

// [^\s\p{L}\p{N}]+ from j: the end of the run of units that are neither whitespace, letters
// nor numbers.
constexpr uint16_t kWordOrSpace = F_WS | F_LETTER | F_NUMBER;
size_t symbol_run_end(const Unit* u, size_t j, size_t n) {
  while (j < n && !(u[j].flags & kWordOrSpace)) ++j;
  return j;
}

// The whitespace alternatives shared by the split rules, at a whitespace unit i:
//   \s*[\r\n]+  (only if with_newline_rule): greedy \s* backtracks to the LAST CR/LF of the
//               whitespace run, and [\r\n]+ then takes just that one (the run stops there
//               or continues with non-CR/LF whitespace), so the match ends after it.
//   \s+(?!\S)   the whole run if it ends the piece; otherwise the run minus its last char
//               (which is followed by the non-space), if that leaves at least one char.
//   \s+         the whole run (a single whitespace char before a non-space).
size_t match_whitespace(const Unit* u, size_t i, size_t n, bool with_newline_rule) {
  const size_t j = run_end(u, i, n, F_WS);
  if (with_newline_rule) {
    for (size_t k = j; k > i; --k) {
      if (u[k - 1].flags & F_CRLF) return k - i;
    }
  }
  if (j == n) return j - i;
  if (j - i >= 2) return j - 1 - i;
  return j - i;
}

// deepseek-v3 split 1: \p{N}{1,3}
size_t match_ds3_digits(const Unit* u, size_t i, size_t n) {
  size_t j = i;
  while (j < n && j - i < 3 && (u[j].flags & F_NUMBER)) ++j;
  return j - i;
}

// deepseek-v3 split 2: [一-龥぀-ゟ゠-ヿ]+
size_t match_ds3_cjk(const Unit* u, size_t i, size_t n) { return run_end(u, i, n, F_CJK) - i; }

// deepseek-v3 split 3, alternatives a-f of architecture.md "Tokenizer" in order.
size_t match_ds3_main(const Unit* u, size_t i, size_t n) {
  const uint16_t f = u[i].flags;
  // a. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
  if ((f & F_ASCII_PUNCT) && i + 1 < n && (u[i + 1].flags & F_ASCII_LETTER))
    return run_end(u, i + 1, n, F_ASCII_LETTER) - i;
  // b. [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : the optional char is taken when it qualifies
  //    and a letter/mark follows; otherwise the run must start at i itself.
  if (!(f & (F_CRLF | F_LETTER | F_PS)) && i + 1 < n && (u[i + 1].flags & F_LM))
    return run_end(u, i + 1, n, F_LM) - i;
  if (f & F_LM) return run_end(u, i, n, F_LM) - i;
  // c.  ?[\p{P}\p{S}]+[\r\n]*
  {
    size_t j = i;
    if ((f & F_SPACE) && i + 1 < n && (u[i + 1].flags & F_PS)) j = i + 1;
    if (u[j].flags & F_PS) {
      j = run_end(u, j, n, F_PS);
      j = run_end(u, j, n, F_CRLF);
      return j - i;
    }
  }
  // d. \s*[\r\n]+   e. \s+(?!\S)   f. \s+
  if (f & F_WS) return match_whitespace(u, i, n, true);
  return 0;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Unit* u, size_t i, size_t n) {
  const uint16_t f = u[i].flags;
  if (const size_t len = match_contraction(u, i, n, false)) return len;
  const size_t s = after_optional_space(u, i, n);
  const uint16_t fs = u[s].flags;
  if (fs & F_LETTER) return run_end(u, s, n, F_LETTER) - i;
  if (fs & F_NUMBER) return run_end(u, s, n, F_NUMBER) - i;
  if (!(fs & kWordOrSpace)) return symbol_run_end(u, s, n) - i;
  if (f & F_WS) return match_whitespace(u, i, n, false);
  return 0;
}

// llama3: (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|
//         \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const Unit* u, size_t i, size_t n) {
  const uint16_t f = u[i].flags;
  if (const size_t len = match_contraction(u, i, n, true)) return len;
  if (!(f & (F_CRLF | F_LETTER | F_NUMBER)) && i + 1 < n && (u[i + 1].flags & F_LETTER))
    return run_end(u, i + 1, n, F_LETTER) - i;
  if (f & F_LETTER) return run_end(u, i, n, F_LETTER) - i;
  if (f & F_NUMBER) return match_ds3_digits(u, i, n);
  const size_t s = after_optional_space(u, i, n);
  if (!(u[s].flags & kWordOrSpace)) return run_end(u, symbol_run_end(u, s, n), n, F_CRLF) - i;
  if (f & F_WS) return match_whitespace(u, i, n, true);
  return 0;
}

// A piece: units [begin, end).
struct Span {
  size_t begin, end;
};

// Isolated split: every piece is replaced by its matches and the unmatched gaps between
// them, in order (a regex iterator over the piece; no empty pieces).
void split_isolated(const std::vector<Unit>& units, std::vector<Span>& pieces, Matcher match,
                    std::vector<Span>& scratch) {
  scratch.clear();
  scratch.reserve(pieces.size() * 2);
  for (const Span& p : pieces) {
    const Unit* u = units.data() + p.begin;
    const size_t n = p.end - p.begin;
    size_t gap = 0, i = 0;
    while (i < n) {
      const size_t len = match(u, i, n);
      if (len == 0) {
        ++i;
        continue;
      }
      if (gap < i) scratch.push_back({p.begin + gap, p.begin + i});
      scratch.push_back({p.begin + i, p.begin + i + len});
      i += len;
      gap = i;
    }
    if (gap < n) scratch.push_back({p.begin + gap, p.end});
  }
  pieces.swap(scratch);
}

// Pieces of `text` as byte ranges [first, second). `kind` is Tokenizer::PreKind's value
// (0 deepseek-v3, 1 gpt2, 2 llama3; the enum is private to the class).
std::vector<std::pair<size_t, size_t>> pre_tokenize_ranges(std::string_view text, uint8_t kind) {
  std::vector<std::pair<size_t, size_t>> out;
  if (text.empty()) return out;
  const Decoded d = decode_units(text);
  std::vector<Span> pieces{{0, d.units.size()}}, scratch;
  if (kind == 0) {  // deepseek-v3: three splits, each on the pieces of the one before
    split_isolated(d.units, pieces, match_ds3_digits, scratch);
    split_isolated(d.units, pieces, match_ds3_cjk, scratch);
    split_isolated(d.units, pieces, match_ds3_main, scratch);
  } else if (kind == 1) {
    split_isolated(d.units, pieces, match_gpt2, scratch);
  } else {
    split_isolated(d.units, pieces, match_llama3, scratch);
  }
  out.reserve(pieces.size());
  for (const Span& p : pieces) out.push_back({d.offsets[p.begin], d.offsets[p.end]});
  return out;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Spellings that end a generation whatever their id (llama.cpp's list; architecture.md
// "Tokenizer").
const char* const kEogSpellings[] = {
    "<|im_end|>",
    "<|endoftext|>",
    ("<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"),  // <｜end▁of▁sentence｜>
    "<|eot_id|>",
};

}  // namespace

const std::string& byte_level_text(uint8_t b) { return byte_map().byte_to_utf8[b]; }

// ---------------------------------------------------------------------------------------

namespace {

// Where a tokenizer key error is reported: the file's path, or "<gguf>" for one in memory.
std::string tokenizer_source(const gguf::File& f) {
  return f.path().empty() ? std::string("<gguf>") : f.path();
}

[[noreturn]] void fail_tokenizer_key(const std::string& where, const std::string& key,
                                     const std::string& what) {
  throw gguf::Error(where + ": key '" + key + "' " + what);
}

// An optional token id key: -1 when absent, an error when it is not an id of the n tokens.
TokenId token_id_key(const gguf::File& f, const char* key, size_t n, const std::string& where) {
  const std::optional<uint32_t> v = f.opt_u32(key);
  if (!v) return -1;
  if (*v >= n)
    fail_tokenizer_key(where, key,
                       "= " + std::to_string(*v) + " is not a token id (the vocabulary has " +
                           std::to_string(n) + " tokens)");
  return TokenId(*v);
}

}  // namespace

// The model name, the tokens, their types and the spelling -> id map.
void Tokenizer::read_vocabulary(const gguf::File& f, const std::string& where) {
  const std::string& model = f.get_str("tokenizer.ggml.model");
  if (model != "gpt2")
    fail_tokenizer_key(where, "tokenizer.ggml.model",
                       "is '" + model + "'; only 'gpt2' (byte-level BPE) is supported");

  tokens_ = f.get_str_array("tokenizer.ggml.tokens");
  const size_t n = tokens_.size();
  if (n == 0) fail_tokenizer_key(where, "tokenizer.ggml.tokens", "is empty");
  if (n >= size_t(INT32_MAX))
    fail_tokenizer_key(where, "tokenizer.ggml.tokens", "has too many entries");

  types_.assign(n, TokenType::NORMAL);
  if (f.has("tokenizer.ggml.token_type")) {
    const std::vector<int32_t> types = f.get_i32_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      fail_tokenizer_key(where, "tokenizer.ggml.token_type",
                         "has " + std::to_string(types.size()) + " entries, expected " +
                             std::to_string(n) + " (one per token)");
    for (size_t i = 0; i < n; ++i) {
      // Values outside the known set are treated as UNDEFINED, as llama.cpp does.
      types_[i] = (types[i] >= 0 && types[i] <= 6) ? TokenType(types[i]) : TokenType::UNDEFINED;
    }
  }

  // A duplicated spelling maps to its last id (llama.cpp's behaviour).
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) token_to_id_[tokens_[i]] = TokenId(i);
}

// Merges as pairs of symbol ids. A string that takes part in a merge but is not a token
// gets an id >= n_vocab, so merge chains through such strings work exactly like the
// string-keyed definition; the final symbols that are not tokens fall back to bytes.
void Tokenizer::read_merges(const gguf::File& f, const std::string& where) {
  const size_t n = tokens_.size();
  const std::vector<std::string> merges = f.get_str_array("tokenizer.ggml.merges");
  std::unordered_map<std::string, int32_t> extra;  // non-token strings in merges
  auto symbol = [&](const std::string& s) -> int32_t {
    auto it = token_to_id_.find(s);
    if (it != token_to_id_.end()) return it->second;
    auto [e, inserted] = extra.emplace(s, int32_t(n + extra.size()));
    (void)inserted;
    return e->second;
  };
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size())
      fail_tokenizer_key(where, "tokenizer.ggml.merges",
                         "entry " + std::to_string(r) + " '" + m + "' is not 'left right'");
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const int32_t l = symbol(left), rr = symbol(right), res = symbol(left + right);
    // A repeated pair keeps its first (lowest) rank.
    merges_.emplace(pair_key(l, rr), MergeTarget{int32_t(r), res});
  }
  n_merges_ = merges.size();
  const ByteMap& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    const std::string& s = bm.byte_to_utf8[b];
    auto it = token_to_id_.find(s);
    byte_token_[b] = it == token_to_id_.end() ? -1 : it->second;
    auto e = extra.find(s);
    byte_symbol_[b] = byte_token_[b] >= 0 ? byte_token_[b] : (e == extra.end() ? -1 : e->second);
  }
}

// Pre-tokenizer. A missing or unknown name falls back to deepseek-v3, the rule of the
// Step 3.5 vocabulary, with one warning.
void Tokenizer::choose_pre_tokenizer(const gguf::File& f, const std::string& where) {
  const std::optional<std::string> pre = f.opt_str("tokenizer.ggml.pre");
  const std::string pre_name = pre.value_or("");
  if (pre_name == "deepseek-v3") {
    pre_kind_ = PreKind::DEEPSEEK_V3;
    pre_ = "deepseek-v3";
  } else if (pre_name == "default" || pre_name == "gpt2" || pre_name == "gpt-2") {
    // Note: llama.cpp's own "default" rule is a different, four-regex sequence; GPT-2's
    // single regex is what the name means for the vocabularies step35 can meet.
    pre_kind_ = PreKind::GPT2;
    pre_ = "gpt2";
  } else if (pre_name == "llama3" || pre_name == "llama-v3" || pre_name == "llama-bpe") {
    pre_kind_ = PreKind::LLAMA3;
    pre_ = "llama3";
  } else {
    std::fprintf(stderr, "step35: warning: %s: tokenizer.ggml.pre %s; using the deepseek-v3 split rule\n",
                 where.c_str(), pre ? ("'" + pre_name + "' is not supported").c_str() : "is missing");
    pre_kind_ = PreKind::DEEPSEEK_V3;
    pre_ = "deepseek-v3";
  }
}

// End-of-generation set. Tokens with the EOG spellings are control tokens whatever the
// file says (llama.cpp does the same): they must never be produced from plain text.
void Tokenizer::collect_eog(TokenId eom, const std::string& where) {
  std::vector<TokenId> eog;
  for (TokenId id : {eos_, eot_, eom})
    if (id >= 0) eog.push_back(id);
  for (const char* s : kEogSpellings) {
    const TokenId id = find_token(s);
    if (id < 0) continue;
    eog.push_back(id);
    if (types_[size_t(id)] != TokenType::CONTROL) {
      std::fprintf(stderr, "step35: warning: %s: token %d '%s' is not a control token; treating it as one\n",
                   where.c_str(), id, s);
      types_[size_t(id)] = TokenType::CONTROL;
    }
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  eog_ = std::move(eog);
}

void Tokenizer::read_add_special(const gguf::File& f, const std::string& where) {
  const std::optional<bool> add_bos = f.opt_bool("tokenizer.ggml.add_bos_token");
  // Absent key: DeepSeek-V3-style vocabularies (Step 3.5's) start every text with BOS.
  add_bos_ = add_bos.value_or(pre_kind_ == PreKind::DEEPSEEK_V3 && bos_ >= 0);
  if (add_bos_ && bos_ < 0)
    fail_tokenizer_key(where, "tokenizer.ggml.add_bos_token",
                       "is true but tokenizer.ggml.bos_token_id is missing");
  add_eos_ = f.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);
  if (add_eos_ && eos_ < 0)
    fail_tokenizer_key(where, "tokenizer.ggml.add_eos_token",
                       "is true but tokenizer.ggml.eos_token_id is missing");
}

// Carve-out order: longest spelling first (ties by id, so the order is deterministic).
void Tokenizer::sort_special_tokens() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const TokenType ty = types_[i];
    if ((ty == TokenType::CONTROL || ty == TokenType::USER_DEFINED || ty == TokenType::UNKNOWN) &&
        !tokens_[i].empty())
      special_sorted_.push_back(TokenId(i));
  }
  std::stable_sort(special_sorted_.begin(), special_sorted_.end(), [&](TokenId a, TokenId b) {
    return tokens_[size_t(a)].size() > tokens_[size_t(b)].size();
  });
}

// Decoded text of every token (special = true), so decoding is a lookup.
void Tokenizer::decode_pieces() {
  const size_t n = tokens_.size();
  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (types_[i]) {
      case TokenType::NORMAL:
      case TokenType::BYTE:
        pieces_[i] = unmap_bytes(tokens_[i]);
        break;
      case TokenType::CONTROL:
      case TokenType::UNKNOWN:
      case TokenType::USER_DEFINED:
        pieces_[i] = tokens_[i];  // literal text
        break;
      default:
        break;  // UNUSED / UNDEFINED decode to nothing (llama.cpp)
    }
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const std::string where = tokenizer_source(f);
  t->read_vocabulary(f, where);
  t->read_merges(f, where);
  const size_t n = t->tokens_.size();
  t->bos_ = token_id_key(f, "tokenizer.ggml.bos_token_id", n, where);
  t->eos_ = token_id_key(f, "tokenizer.ggml.eos_token_id", n, where);
  t->eot_ = token_id_key(f, "tokenizer.ggml.eot_token_id", n, where);
  t->pad_ = token_id_key(f, "tokenizer.ggml.padding_token_id", n, where);
  const TokenId eom = token_id_key(f, "tokenizer.ggml.eom_token_id", n, where);
  t->choose_pre_tokenizer(f, where);
  t->collect_eog(eom, where);
  t->read_add_special(f, where);
  t->sort_special_tokens();
  t->decode_pieces();
  return t;
}

TokenId Tokenizer::find_token(std::string_view text) const {
  auto it = token_to_id_.find(std::string(text));
  return it == token_to_id_.end() ? -1 : it->second;
}

bool Tokenizer::is_eog(TokenId id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const auto& [b, e] : pre_tokenize_ranges(text, uint8_t(pre_kind_))) out.emplace_back(text.substr(b, e - b));
  return out;
}

// BPE over one piece: repeatedly merge the adjacent pair with the lowest rank (leftmost on
// ties) until no adjacent pair is a merge. Symbols form a linked list over the piece's
// bytes (each byte is one mapped char); candidate pairs sit in a heap and are checked for
// staleness when popped, so a piece of n bytes costs O(n log n).
void Tokenizer::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  const size_t n = piece.size();
  if (n == 0) return;
  struct Sym {
    int32_t id;    // symbol id; -1 for a byte whose mapped char is in neither vocab nor merges
    int32_t prev;  // -1: none
    int32_t next;  // -1: none
    uint32_t end;  // one past the last byte of this symbol (it starts at its own index)
    bool alive;
  };
  struct Cand {
    int32_t rank;
    int32_t left, right;
    int32_t left_id, right_id;
    int32_t result;
  };
  struct Later {  // priority_queue puts the "largest" first: make that the lowest rank, leftmost
    bool operator()(const Cand& a, const Cand& b) const {
      return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
    }
  };
  std::vector<Sym> syms(n);
  for (size_t i = 0; i < n; ++i) {
    syms[i] = {byte_symbol_[static_cast<uint8_t>(piece[i])], int32_t(i) - 1,
               i + 1 < n ? int32_t(i + 1) : -1, uint32_t(i + 1), true};
  }
  std::priority_queue<Cand, std::vector<Cand>, Later> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = syms[size_t(left)].next;
    if (right < 0) return;
    const int32_t a = syms[size_t(left)].id, b = syms[size_t(right)].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(pair_key(a, b));
    if (it != merges_.end()) heap.push({it->second.rank, left, right, a, b, it->second.result});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(int32_t(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[size_t(c.left)];
    // Stale if either side was merged away or changed since the candidate was pushed.
    if (!l.alive || l.next != c.right || l.id != c.left_id) continue;
    Sym& r = syms[size_t(c.right)];
    if (!r.alive || r.id != c.right_id) continue;
    l.id = c.result;
    l.end = r.end;
    l.next = r.next;
    r.alive = false;
    if (r.next >= 0) syms[size_t(r.next)].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  const int32_t n_vocab = int32_t(tokens_.size());
  for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) {
    const Sym& s = syms[size_t(i)];
    if (s.id >= 0 && s.id < n_vocab) {
      out.push_back(s.id);
      continue;
    }
    // Not a token: one token per byte. A byte without a token cannot be represented and
    // is dropped (a complete byte-level vocabulary has all 256).
    for (uint32_t b = uint32_t(i); b < s.end; ++b) {
      const TokenId t = byte_token_[static_cast<uint8_t>(piece[b])];
      if (t >= 0) out.push_back(t);
    }
  }
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  if (text.size() > kMaxEncodeBytes)
    throw std::length_error("text of " + std::to_string(text.size()) + " bytes is too long to tokenize (at most " +
                            std::to_string(kMaxEncodeBytes) + " bytes)");
  // Fragments of the text: raw byte ranges (id -1) or carved special tokens.
  struct Frag {
    TokenId id;
    size_t begin, end;
  };
  std::vector<Frag> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  std::vector<Frag> next;
  // For each special token, longest first, split every still-raw fragment at each literal
  // occurrence (llama.cpp's order; a token never matches across an earlier carve-out).
  for (TokenId sid : special_sorted_) {
    if (frags.empty()) break;
    const TokenType ty = types_[size_t(sid)];
    if (!parse_special && ty != TokenType::USER_DEFINED) continue;
    const std::string& st = tokens_[size_t(sid)];
    if (text.find(st) == std::string_view::npos) continue;  // cheap filter for big vocabularies
    next.clear();
    for (const Frag& fr : frags) {
      if (fr.id >= 0) {
        next.push_back(fr);
        continue;
      }
      const std::string_view raw = text.substr(fr.begin, fr.end - fr.begin);
      size_t pos = 0;
      while (pos < raw.size()) {
        const size_t hit = raw.find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, fr.begin + pos, fr.begin + hit});
        next.push_back({sid, fr.begin + hit, fr.begin + hit + st.size()});
        pos = hit + st.size();
      }
      if (pos < raw.size()) next.push_back({-1, fr.begin + pos, fr.end});
    }
    frags.swap(next);
  }

  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) ids.push_back(bos_);
  for (const Frag& fr : frags) {
    if (fr.id >= 0) {
      ids.push_back(fr.id);
      continue;
    }
    const std::string_view raw = text.substr(fr.begin, fr.end - fr.begin);
    for (const auto& [b, e] : pre_tokenize_ranges(raw, uint8_t(pre_kind_))) bpe(raw.substr(b, e - b), ids);
  }
  if (add_special && add_eos_) ids.push_back(eos_);
  return ids;
}

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  if (id < 0 || size_t(id) >= tokens_.size())
    throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (" +
                            std::to_string(tokens_.size()) + " tokens)");
  const TokenType ty = types_[size_t(id)];
  if (!special && (ty == TokenType::CONTROL || ty == TokenType::UNKNOWN)) return "";
  return pieces_[size_t(id)];
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool special) const {
  std::string out;
  for (TokenId id : ids) out += token_to_piece(id, special);
  return out;
}

// ---------------------------------------------------------------------------------------

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  // Emit complete sequences and bytes that can never become part of one; hold back only a
  // trailing well-formed prefix that more bytes could still complete (at most 3 bytes).
  size_t pos = 0;
  while (pos < pending_.size()) {
    const unicode::Utf8Char c = unicode::decode_utf8(pending_, pos);
    if (c.status == unicode::Utf8Status::TRUNCATED) break;
    pos += c.len;
  }
  std::string out = pending_.substr(0, pos);
  pending_.erase(0, pos);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace step35
