// Token trie construction (and its per-tokenizer cache) and the masked trie walk.
#include "structured/grammar_constraint.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "tokenizer/tokenizer.h"

namespace step35::grammar {

TokenTrie::TokenTrie(std::vector<std::string> pieces, std::vector<Kind> kinds)
    : pieces_(std::move(pieces)), kinds_(std::move(kinds)) {
  if (pieces_.size() != kinds_.size()) throw std::invalid_argument("TokenTrie: pieces and kinds differ in size");
  if (pieces_.size() > size_t(INT32_MAX)) throw std::invalid_argument("TokenTrie: vocabulary too large");
  std::vector<int32_t> text;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    Kind& k = kinds_[i];
    if (k == Kind::Text && (pieces_[i].empty() || pieces_[i].size() > UINT16_MAX)) k = Kind::Never;
    if (k == Kind::Special && pieces_[i].empty()) k = Kind::Never;
    if (k == Kind::Text) text.push_back(int32_t(i));
    if (k == Kind::Eog) eog_.push_back(int32_t(i));
    if (k == Kind::Special) specials_.push_back(int32_t(i));
  }
  std::sort(text.begin(), text.end(), [&](int32_t a, int32_t b) {
    return pieces_[size_t(a)] < pieces_[size_t(b)] || (pieces_[size_t(a)] == pieces_[size_t(b)] && a < b);
  });
  // Preorder construction from the sorted pieces: a piece adds nodes for its bytes past
  // the common prefix with the previous one. open[d] is the node at depth d+1 on the
  // current path; a node's subtree ends when a later piece diverges above it.
  const int32_t none = int32_t(pieces_.size());
  std::vector<uint32_t> open;
  const std::string* prev = nullptr;
  for (int32_t id : text) {
    const std::string& p = pieces_[size_t(id)];
    size_t common = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), p.size());
      while (common < m && (*prev)[common] == p[common]) ++common;
    }
    while (open.size() > common) {
      nodes_[open.back()].end = uint32_t(nodes_.size());
      open.pop_back();
    }
    for (size_t d = common; d < p.size(); ++d) {
      open.push_back(uint32_t(nodes_.size()));
      nodes_.push_back(Node{0, none, uint16_t(d + 1), uint8_t(p[d])});
    }
    // Sorted order puts a piece right after its prefixes, so its node is open.back().
    Node& at = nodes_[open.back()];
    if (at.token == none)
      at.token = id;
    else
      duplicates_.push_back({open.back(), id});
    max_depth_ = std::max(max_depth_, uint32_t(p.size()));
    prev = &p;
  }
  while (!open.empty()) {
    nodes_[open.back()].end = uint32_t(nodes_.size());
    open.pop_back();
  }
}

std::shared_ptr<const TokenTrie> TokenTrie::of(const Tokenizer& tok) {
  const size_t n = tok.n_vocab();
  std::vector<std::string> pieces(n);
  std::vector<Kind> kinds(n, Kind::Never);
  uint64_t fp = 0xcbf29ce484222325ULL ^ n;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    pieces[i] = tok.token_to_piece(id, true);
    switch (tok.token_type(id)) {
      case TokenType::NORMAL:
      case TokenType::BYTE:
        kinds[i] = Kind::Text;
        break;
      case TokenType::CONTROL:
      case TokenType::USER_DEFINED:
      case TokenType::UNKNOWN:
        kinds[i] = Kind::Special;
        break;
      default:
        kinds[i] = Kind::Never;
        break;
    }
    if (tok.is_eog(id)) kinds[i] = Kind::Eog;
    for (char c : pieces[i]) fp = (fp ^ uint8_t(c)) * 0x100000001b3ULL;
    fp = (fp ^ (0x100 + uint64_t(kinds[i]))) * 0x100000001b3ULL;
  }

  struct Cached {
    const Tokenizer* tok;
    uint64_t fingerprint;
    std::shared_ptr<const TokenTrie> trie;
  };
  static std::mutex mu;
  static std::vector<Cached> cache;  // most recent last
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < cache.size(); ++i)
      if (cache[i].tok == &tok && cache[i].fingerprint == fp && cache[i].trie->n_vocab() == n) {
        Cached hit = cache[i];
        cache.erase(cache.begin() + long(i));
        cache.push_back(hit);
        return hit.trie;
      }
  }
  auto trie = std::make_shared<const TokenTrie>(std::move(pieces), std::move(kinds));
  std::lock_guard<std::mutex> lock(mu);
  cache.push_back({&tok, fp, trie});
  if (cache.size() > 4) cache.erase(cache.begin());
  return trie;
}

// ---------------------------------------------------------------------------------------

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie)
    : trie_(std::move(trie)), matcher_(std::move(grammar)) {
  const Grammar& g = matcher_.grammar();
  for (uint32_t s = 0; s < g.n_symbols(); ++s)
    for (int32_t t : trie_->specials())
      if (trie_->piece(t) == g.symbol_text(s)) special_symbols_.push_back({t, s});
  std::sort(special_symbols_.begin(), special_symbols_.end());
}

size_t GrammarConstraint::allowed_tokens(std::vector<uint8_t>& allowed) {
  const TokenTrie& trie = *trie_;
  const size_t n_vocab = trie.n_vocab();
  allowed.assign(n_vocab + 1, 0);  // + the spare slot for trie nodes without a token
  uint8_t* out = allowed.data();
  if (!failed_) {
    matcher_.compact_if_larger(kMaxConfigs);
    const Grammar& g = matcher_.grammar();
    const uint8_t* cls = g.class_table();
    const TokenTrie::Node* nodes = trie.nodes();
    walk_.resize(size_t(trie.max_depth()) + 1);
    int32_t* walk = walk_.data();
    walk[0] = matcher_.state();
    // The hot loop reads the memo table directly and calls step() only to fill a gap
    // (which may move the table).
    const int32_t* table = matcher_.table();
    const size_t width = matcher_.width();
    const size_t n = trie.n_nodes();
    size_t i = 0;
    uint32_t last_depth = 0;  // depth and state of the previous live node: a child reads
    int32_t last_to = walk[0];  // its parent's state from a register, not from walk[]
    while (i < n) {
      const TokenTrie::Node& nd = nodes[i];
      const int32_t from = nd.depth == last_depth + 1 ? last_to : walk[nd.depth - 1];
      const uint32_t col = cls[nd.byte];
      int32_t to = table[size_t(from) * width + col];
      if (to == Matcher::kUnknown) {
        to = matcher_.step(from, col);
        table = matcher_.table();
      }
      if (to == Matcher::kDead) {
        i = nd.end;  // the grammar rejects this prefix: skip every token under it
        continue;
      }
      walk[nd.depth] = to;
      last_depth = nd.depth;
      last_to = to;
      out[nd.token] = 1;
      ++i;
    }
    for (const auto& [node, tok] : trie.duplicates()) out[tok] = out[nodes[node].token];
    for (const auto& [tok, sym] : special_symbols_)
      if (matcher_.step(matcher_.state(), g.n_classes() + sym) != Matcher::kDead) out[tok] = 1;
    if (matcher_.complete())
      for (int32_t t : trie.eog()) out[t] = 1;
  }
  out[n_vocab] = 0;
  size_t count = 0;
  for (size_t t = 0; t < n_vocab; ++t) count += out[t];
  if (count == 0 && !trie.eog().empty()) {  // dead end (see constraint.h): end the text
    out[trie.eog()[0]] = 1;
    count = 1;
  }
  return count;
}

void GrammarConstraint::mask(float* logits, size_t n_vocab) {
  allowed_tokens(allowed_);
  const size_t n = std::min(n_vocab, trie_->n_vocab());
  for (size_t i = 0; i < n; ++i)
    if (!allowed_[i]) logits[i] = -INFINITY;
  for (size_t i = n; i < n_vocab; ++i) logits[i] = -INFINITY;  // ids the tokenizer does not know
}

void GrammarConstraint::accept(int32_t token) {
  if (failed_) return;
  if (token < 0 || size_t(token) >= trie_->n_vocab()) {
    failed_ = true;
    return;
  }
  matcher_.compact_if_larger(kMaxConfigs);
  switch (trie_->kind(token)) {
    case TokenTrie::Kind::Text:
      if (!matcher_.feed(trie_->piece(token))) failed_ = true;
      return;
    case TokenTrie::Kind::Special: {
      auto it = std::lower_bound(special_symbols_.begin(), special_symbols_.end(), std::make_pair(token, 0u));
      for (; it != special_symbols_.end() && it->first == token; ++it)
        if (matcher_.feed_symbol(it->second)) return;
      failed_ = true;
      return;
    }
    case TokenTrie::Kind::Eog:
      if (!matcher_.complete()) failed_ = true;
      return;  // the text is over; the state stays complete
    case TokenTrie::Kind::Never:
      failed_ = true;
      return;
  }
}

// A copy with fresh, small memo tables in the same state (copying the tables would cost
// megabytes for nothing: they refill lazily).
GrammarConstraint::GrammarConstraint(const GrammarConstraint& from, Fork)
    : trie_(from.trie_), matcher_(from.matcher_.fork()), special_symbols_(from.special_symbols_), failed_(from.failed_) {}

uint64_t GrammarConstraint::min_remaining_after(int32_t token) {
  if (failed_ || token < 0 || size_t(token) >= trie_->n_vocab()) return kUnreachable;
  matcher_.compact_if_larger(kMaxConfigs);
  int32_t c = matcher_.state();
  switch (trie_->kind(token)) {
    case TokenTrie::Kind::Text:
      for (char ch : trie_->piece(token)) {
        c = matcher_.step_byte(c, uint8_t(ch));
        if (c == Matcher::kDead) return kUnreachable;
      }
      return matcher_.min_remaining(c);
    case TokenTrie::Kind::Special: {
      uint64_t best = kUnreachable;
      for (const auto& [tok, sym] : special_symbols_) {
        if (tok != token) continue;
        const int32_t to = matcher_.step(c, matcher_.grammar().n_classes() + sym);
        if (to != Matcher::kDead) best = std::min(best, matcher_.min_remaining(to));
      }
      return best;
    }
    case TokenTrie::Kind::Eog:
      return matcher_.complete() ? 0 : kUnreachable;
    case TokenTrie::Kind::Never:
      break;
  }
  return kUnreachable;
}

std::unique_ptr<TokenConstraint> GrammarConstraint::clone() const {
  return std::unique_ptr<TokenConstraint>(new GrammarConstraint(*this, Fork{}));
}

}  // namespace step35::grammar
