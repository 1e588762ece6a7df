// Byte-level BPE (§5 of ../shared/docs/step35-model.md): special-token carving, the
// pre-tokenizer of tokenizer.ggml.pre, the GPT-2 byte-to-unicode mapping, and merges by rank.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "gguf/gguf.h"
#include "tokenizer/unicode.h"

namespace step35 {

namespace {

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100...
struct ByteMap {
  uint32_t byte_to_cp[256];
  std::string byte_to_str[256];
  ByteMap() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = printable ? b : next++;
      append_utf8(byte_to_str[b], byte_to_cp[b]);
    }
  }
  // Inverse, for decoding: code point -> byte, or -1.
  int cp_to_byte(uint32_t cp) const {
    if (cp < 256 && byte_to_cp[cp] == cp) return int(cp);
    if (cp >= 256 && cp < 256 + 68) {
      for (uint32_t b = 0; b < 256; ++b)
        if (byte_to_cp[b] == cp) return int(b);
    }
    return -1;
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

bool is_letter(uint32_t cp) { return category(cp) == Category::LETTER; }
bool is_letter_or_mark(uint32_t cp) {
  const Category c = category(cp);
  return c == Category::LETTER || c == Category::MARK;
}
bool is_punct_or_symbol(uint32_t cp) {
  const Category c = category(cp);
  return c == Category::PUNCT || c == Category::SYMBOL;
}
bool is_number(uint32_t cp) { return category(cp) == Category::NUMBER; }
bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
bool is_ascii_letter(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z'); }
bool is_ascii_punct(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}
bool is_cjk_kana(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) || (cp >= 0x30A0 && cp <= 0x30FF);
}

using Units = std::vector<CodeUnit>;
// A matcher returns the length (in code units) of the match starting at i within [i, end),
// 0 for no match. Leftmost-first regex semantics are reproduced by trying every start.
using Matcher = size_t (*)(const Units& u, size_t i, size_t end);

// \s+(?!\S) then \s+ : a whitespace run leaves its last char for the next token when a
// non-space follows (backtracking of the greedy run into the lookahead).
size_t match_whitespace_tail(const Units& u, size_t i, size_t end) {
  size_t j = i;
  while (j < end && is_whitespace(u[j].cp)) ++j;
  const size_t n = j - i;
  if (n == 0) return 0;
  if (j == end) return n;       // (?!\S) holds at the end of the piece
  return n >= 2 ? n - 1 : n;    // n-1 is followed by whitespace; a single char falls to \s+
}

// \s*[\r\n]+ : through the last CR/LF of the whitespace run.
size_t match_ws_newlines(const Units& u, size_t i, size_t end) {
  size_t j = i, last_nl = 0;
  bool any = false;
  while (j < end && is_whitespace(u[j].cp)) {
    if (is_crlf(u[j].cp)) any = true, last_nl = j;
    ++j;
  }
  return any ? last_nl + 1 - i : 0;
}

// deepseek-v3 split 1: \p{N}{1,3}
size_t match_ds3_digits(const Units& u, size_t i, size_t end) {
  size_t n = 0;
  while (n < 3 && i + n < end && is_number(u[i + n].cp)) ++n;
  return n;
}

// deepseek-v3 split 2: [一-龥぀-ゟ゠-ヿ]+
size_t match_ds3_cjk(const Units& u, size_t i, size_t end) {
  size_t n = 0;
  while (i + n < end && is_cjk_kana(u[i + n].cp)) ++n;
  return n;
}

// deepseek-v3 split 3, alternatives a..f in order (§5).
size_t match_ds3_main(const Units& u, size_t i, size_t end) {
  const uint32_t c = u[i].cp;
  // a. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
  if (is_ascii_punct(c) && i + 1 < end && is_ascii_letter(u[i + 1].cp)) {
    size_t j = i + 1;
    while (j < end && is_ascii_letter(u[j].cp)) ++j;
    return j - i;
  }
  // b. [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
  {
    const bool prefix_ok = !is_crlf(c) && !is_letter(c) && !is_punct_or_symbol(c);
    size_t start = i;
    if (prefix_ok && i + 1 < end && is_letter_or_mark(u[i + 1].cp)) start = i + 1;
    if (start > i || is_letter_or_mark(c)) {
      size_t j = start;
      while (j < end && is_letter_or_mark(u[j].cp)) ++j;
      if (j > start) return j - i;
    }
  }
  // c.  ?[\p{P}\p{S}]+[\r\n]*
  {
    size_t j = i;
    if (c == ' ' && i + 1 < end && is_punct_or_symbol(u[i + 1].cp)) ++j;
    if (j < end && is_punct_or_symbol(u[j].cp)) {
      while (j < end && is_punct_or_symbol(u[j].cp)) ++j;
      while (j < end && is_crlf(u[j].cp)) ++j;
      return j - i;
    }
  }
  // d. \s*[\r\n]+
  if (size_t n = match_ws_newlines(u, i, end)) return n;
  // e. \s+(?!\S)   f. \s+
  return match_whitespace_tail(u, i, end);
}

// GPT-2's split rule, for vocabularies with another pre-tokenizer:
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Units& u, size_t i, size_t end) {
  const uint32_t c = u[i].cp;
  if (c == '\'' && i + 1 < end) {
    const uint32_t d = u[i + 1].cp;
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
    if (i + 2 < end) {
      const uint32_t e = u[i + 2].cp;
      if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return 3;
    }
  }
  const size_t s = (c == ' ' && i + 1 < end) ? i + 1 : i;
  auto run = [&](auto pred) -> size_t {
    size_t j = s;
    while (j < end && pred(u[j].cp)) ++j;
    return j > s ? j - i : 0;
  };
  if (size_t n = run(is_letter)) return n;
  if (size_t n = run(is_number)) return n;
  if (size_t n = run([](uint32_t x) { return !is_whitespace(x) && !is_letter(x) && !is_number(x); })) return n;
  return match_whitespace_tail(u, i, end);
}

// Isolated split of every piece by one matcher: matches and the gaps between them.
void split_isolated(const Units& u, std::vector<std::pair<size_t, size_t>>& pieces, Matcher m) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(pieces.size() * 2);
  for (const auto& [b, e] : pieces) {
    size_t gap = b, i = b;
    while (i < e) {
      const size_t n = m(u, i, e);
      if (n == 0) {
        ++i;
        continue;
      }
      if (gap < i) out.push_back({gap, i});
      out.push_back({i, i + n});
      i += n;
      gap = i;
    }
    if (gap < e) out.push_back({gap, e});
  }
  pieces.swap(out);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const std::string& path = f.path();
  const std::string model = f.get_str("tokenizer.ggml.model");
  if (model != "gpt2")
    throw gguf::Error(path + ": key 'tokenizer.ggml.model' is '" + model +
                      "' (expected 'gpt2': byte-level BPE is the only tokenizer step35 models use)");
  t->tokens_ = f.get_str_array("tokenizer.ggml.tokens");
  const size_t n = t->tokens_.size();
  if (n == 0) throw gguf::Error(path + ": key 'tokenizer.ggml.tokens' is empty");
  t->types_.assign(n, TokenType::NORMAL);
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_i32_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      throw gguf::Error(path + ": key 'tokenizer.ggml.token_type' has " + std::to_string(types.size()) +
                        " entries (expected " + std::to_string(n) + ", one per token)");
    for (size_t i = 0; i < n; ++i) t->types_[i] = TokenType(types[i]);
  }
  t->token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) t->token_to_id_.emplace(t->tokens_[i], TokenId(i));
  if (f.has("tokenizer.ggml.merges")) {
    const auto merges = f.get_str_array("tokenizer.ggml.merges");
    t->merge_rank_.reserve(merges.size());
    for (size_t r = 0; r < merges.size(); ++r) {
      const size_t sp = merges[r].find(' ', 1);
      if (sp == std::string::npos)
        throw gguf::Error(path + ": key 'tokenizer.ggml.merges' entry " + std::to_string(r) + " '" + merges[r] +
                          "' has no space (expected 'left right')");
      t->merge_rank_.emplace(merges[r], int32_t(r));
    }
    t->n_merges_ = merges.size();
  }
  auto id_key = [&](const char* k, TokenId dflt) -> TokenId {
    auto v = f.opt_u32(k);
    if (!v) return dflt;
    if (*v >= n)
      throw gguf::Error(path + ": key '" + std::string(k) + "' = " + std::to_string(*v) +
                        " is not a token id (vocabulary has " + std::to_string(n) + " tokens)");
    return TokenId(*v);
  };
  t->bos_ = id_key("tokenizer.ggml.bos_token_id", -1);
  t->eos_ = id_key("tokenizer.ggml.eos_token_id", -1);
  const TokenId eot = id_key("tokenizer.ggml.eot_token_id", -1);
  t->add_bos_ = f.opt_bool("tokenizer.ggml.add_bos_token").value_or(t->bos_ >= 0);
  t->add_eos_ = f.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);
  t->pre_ = f.opt_str("tokenizer.ggml.pre").value_or("default");
  if (t->pre_ != "deepseek-v3" && t->pre_ != "default" && t->pre_ != "gpt2")
    std::fprintf(stderr, "warning: %s: pre-tokenizer '%s' is not implemented; using the GPT-2 split rule\n",
                 path.c_str(), t->pre_.c_str());

  // End of generation: eos, eot, and the chat end markers by spelling.
  auto add_eog = [&](TokenId id) {
    if (id >= 0 && std::find(t->eog_.begin(), t->eog_.end(), id) == t->eog_.end()) t->eog_.push_back(id);
  };
  add_eog(t->eos_);
  add_eog(eot);
  for (const char* s : {"<|im_end|>", "<|endoftext|>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                        "<|eot_id|>", "<|end|>"})
    add_eog(t->find_token(s));

  // Special tokens are carved out longest first.
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = t->types_[i];
    if ((ty == TokenType::CONTROL || ty == TokenType::USER_DEFINED || ty == TokenType::UNKNOWN) &&
        !t->tokens_[i].empty())
      t->special_sorted_.push_back(TokenId(i));
  }
  std::stable_sort(t->special_sorted_.begin(), t->special_sorted_.end(), [&](TokenId a, TokenId b) {
    return t->tokens_[size_t(a)].size() > t->tokens_[size_t(b)].size();
  });
  return t;
}

TokenId Tokenizer::find_token(std::string_view text) const {
  auto it = token_to_id_.find(std::string(text));
  return it == token_to_id_.end() ? -1 : it->second;
}

bool Tokenizer::is_eog(TokenId id) const { return std::find(eog_.begin(), eog_.end(), id) != eog_.end(); }

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  const Units u = decode_utf8(text);
  std::vector<std::pair<size_t, size_t>> pieces;
  if (!u.empty()) pieces.push_back({0, u.size()});
  if (pre_ == "deepseek-v3") {
    split_isolated(u, pieces, match_ds3_digits);
    split_isolated(u, pieces, match_ds3_cjk);
    split_isolated(u, pieces, match_ds3_main);
  } else {
    split_isolated(u, pieces, match_gpt2);
  }
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (const auto& [b, e] : pieces) {
    const size_t off = u[b].offset, end_off = u[e - 1].offset + u[e - 1].len;
    out.emplace_back(text.substr(off, end_off - off));
  }
  return out;
}

// BPE over one pre-tokenized piece: merge the adjacent pair of lowest rank (leftmost on
// ties) until none is in the merge list. A linked list and a heap keep this O(n log n).
std::vector<TokenId> Tokenizer::bpe(std::string_view piece) const {
  const ByteMap& bm = byte_map();
  struct Sym {
    std::string text;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    syms.push_back({bm.byte_to_str[static_cast<unsigned char>(piece[i])], int(i) - 1, int(i) + 1, true});
  }
  if (!syms.empty()) syms.back().next = -1;
  // The byte-level map works per byte; merges then rebuild multi-byte characters.
  struct Cand {
    int32_t rank;
    int left;
    size_t left_len, right_len;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand> heap;
  std::string key;
  auto consider = [&](int l) {
    if (l < 0) return;
    const int r = syms[size_t(l)].next;
    if (r < 0) return;
    key.assign(syms[size_t(l)].text).append(" ").append(syms[size_t(r)].text);
    auto it = merge_rank_.find(key);
    if (it != merge_rank_.end())
      heap.push({it->second, l, syms[size_t(l)].text.size(), syms[size_t(r)].text.size()});
  };
  for (int i = 0; i + 1 < int(syms.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& L = syms[size_t(c.left)];
    if (!L.alive || L.next < 0 || L.text.size() != c.left_len) continue;
    Sym& R = syms[size_t(L.next)];
    if (!R.alive || R.text.size() != c.right_len) continue;
    L.text += R.text;
    R.alive = false;
    L.next = R.next;
    if (R.next >= 0) syms[size_t(R.next)].prev = c.left;
    consider(L.prev);
    consider(c.left);
  }
  std::vector<TokenId> ids;
  for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[size_t(i)].next) {
    const Sym& s = syms[size_t(i)];
    auto it = token_to_id_.find(s.text);
    if (it != token_to_id_.end()) {
      ids.push_back(it->second);
      continue;
    }
    // Not in the vocabulary: fall back to one token per byte (each mapped char is a byte).
    for (const CodeUnit& cu : decode_utf8(s.text)) {
      std::string one;
      append_utf8(one, cu.cp);
      auto bt = token_to_id_.find(one);
      if (bt != token_to_id_.end()) ids.push_back(bt->second);
    }
  }
  return ids;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  // Fragments: either raw text (id -1) or an already recognised special token.
  struct Frag {
    TokenId id;
    size_t off, len;
  };
  std::vector<Frag> frags{{-1, 0, text.size()}};
  for (TokenId sid : special_sorted_) {
    const TokenType ty = types_[size_t(sid)];
    if (!parse_special && ty != TokenType::USER_DEFINED) continue;
    const std::string& st = tokens_[size_t(sid)];
    std::vector<Frag> next;
    next.reserve(frags.size());
    for (const Frag& fr : frags) {
      if (fr.id >= 0) {
        next.push_back(fr);
        continue;
      }
      size_t pos = fr.off;
      const size_t end = fr.off + fr.len;
      while (pos < end) {
        const size_t hit = text.substr(0, end).find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({-1, pos, hit - pos});
        next.push_back({sid, hit, st.size()});
        pos = hit + st.size();
      }
      if (pos < end) next.push_back({-1, pos, end - pos});
    }
    frags.swap(next);
  }
  std::vector<TokenId> ids;
  if (add_special && add_bos_ && bos_ >= 0) ids.push_back(bos_);
  for (const Frag& fr : frags) {
    if (fr.id >= 0) {
      ids.push_back(fr.id);
      continue;
    }
    for (const std::string& piece : pre_tokenize(text.substr(fr.off, fr.len))) {
      const auto p = bpe(piece);
      ids.insert(ids.end(), p.begin(), p.end());
    }
  }
  if (add_special && add_eos_ && eos_ >= 0) ids.push_back(eos_);
  return ids;
}

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  if (id < 0 || size_t(id) >= tokens_.size()) return "";
  const std::string& s = tokens_[size_t(id)];
  switch (types_[size_t(id)]) {
    case TokenType::CONTROL:
    case TokenType::UNKNOWN:
    case TokenType::UNUSED:
      return special ? s : "";
    case TokenType::USER_DEFINED:
      return s;
    default:
      break;
  }
  // Normal tokens are in byte-level form: map each code point back to its byte.
  const ByteMap& bm = byte_map();
  std::string out;
  for (const CodeUnit& cu : decode_utf8(s)) {
    const int b = cu.cp < kInvalidBase ? bm.cp_to_byte(cu.cp) : -1;
    if (b >= 0)
      out += char(b);
    else
      out.append(s, cu.offset, cu.len);  // not a byte-level char: keep as written
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool special) const {
  std::string out;
  for (TokenId id : ids) out += token_to_piece(id, special);
  return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  // Hold back a trailing sequence that is incomplete but could still become valid.
  size_t keep_from = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const size_t i = pending_.size() - back;
    const unsigned char c = static_cast<unsigned char>(pending_[i]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (need > back) keep_from = i;
    break;
  }
  std::string out = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace step35
