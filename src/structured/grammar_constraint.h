// A grammar applied to a tokenizer's vocabulary: the TokenTrie holds every token's bytes
// in a preorder byte trie; GrammarConstraint walks it with the matcher, pruning every
// subtree whose prefix the grammar rejects, so mask() costs one memoised transition per
// live trie node rather than one grammar run per token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "structured/constraint.h"
#include "structured/grammar.h"

namespace step35 {
class Tokenizer;
}

namespace step35::grammar {

class TokenTrie {
 public:
  enum class Kind : uint8_t {
    Text,     // ordinary text: allowed wherever its bytes are
    Special,  // control / user-defined: only where the grammar has its text as a symbol
    Eog,      // end of generation: only when the match is complete
    Never,    // unused / undecodable / empty
  };

  TokenTrie(std::vector<std::string> pieces, std::vector<Kind> kinds);
  // The trie of a tokenizer's vocabulary (pieces from token_to_piece(id, true); NORMAL and
  // BYTE tokens are text, CONTROL / USER_DEFINED / UNKNOWN special, is_eog() tokens EOG).
  // Cached: the last few tokenizers' tries are kept, keyed by address and a fingerprint
  // of the whole vocabulary, so a request does not rebuild the trie.
  static std::shared_ptr<const TokenTrie> of(const Tokenizer& tok);

  size_t n_vocab() const { return pieces_.size(); }
  const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
  Kind kind(int32_t id) const { return kinds_[size_t(id)]; }
  const std::vector<int32_t>& eog() const { return eog_; }
  const std::vector<int32_t>& specials() const { return specials_; }

  // Preorder trie of the Text tokens. Node i holds one byte at depth `depth` (1 = first
  // byte of a piece); its subtree ends before node `end`; `token` is the token whose
  // piece ends there, or n_vocab() when none does (so a walk can mark it without a
  // branch: allowed arrays get one spare slot). Further tokens with the same piece are
  // listed in duplicates() as (node, token).
  struct Node {
    uint32_t end;
    int32_t token;
    uint16_t depth;
    uint8_t byte;
  };
  size_t n_nodes() const { return nodes_.size(); }
  const Node* nodes() const { return nodes_.data(); }
  const std::vector<std::pair<uint32_t, int32_t>>& duplicates() const { return duplicates_; }
  uint32_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<Kind> kinds_;
  std::vector<int32_t> eog_, specials_;
  std::vector<Node> nodes_;
  std::vector<std::pair<uint32_t, int32_t>> duplicates_;
  uint32_t max_depth_ = 0;
};

class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);

  void mask(float* logits, size_t n_vocab) override;
  void accept(int32_t token) override;
  bool complete() const override { return !failed_ && matcher_.complete(); }
  std::unique_ptr<TokenConstraint> clone() const override;

  // allowed[t] = 1 for every token mask() would leave (the trie's vocabulary size, plus
  // one spare slot); returns how many. EOG tokens only when complete; never empty (see
  // constraint.h).
  size_t allowed_tokens(std::vector<uint8_t>& allowed);
  // Fewest bytes that still complete the text (0 when complete).
  uint64_t min_remaining_bytes() const { return failed_ ? kUnreachable : matcher_.min_remaining(); }
  // The same after `token` would be accepted (kUnreachable if it is not allowed; 0 for an
  // allowed EOG). The state does not change. Lets a caller steer towards an early end.
  uint64_t min_remaining_after(int32_t token);
  // accept() was given a token the grammar rejects; only EOG is allowed from then on.
  bool failed() const { return failed_; }
  const Matcher& matcher() const { return matcher_; }
  const std::vector<int32_t>& eog_tokens() const { return trie_->eog(); }
  // Memo tables are rebuilt when they hold more configurations than this.
  static constexpr size_t kMaxConfigs = 1 << 14;

 private:
  struct Fork {};
  GrammarConstraint(const GrammarConstraint& from, Fork);

  std::shared_ptr<const TokenTrie> trie_;
  Matcher matcher_;
  std::vector<std::pair<int32_t, uint32_t>> special_symbols_;  // (token, grammar symbol), by token
  std::vector<uint8_t> allowed_;
  std::vector<int32_t> walk_;  // configuration per trie depth
  bool failed_ = false;
};

}  // namespace step35::grammar
