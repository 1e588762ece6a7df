// Constrained decoding: a TokenConstraint says which tokens may come next (so sampled
// output always matches a grammar, e.g. a JSON schema) and follows the tokens chosen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace step35 {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the logit of every token that may not come next to -infinity. End-of-generation
  // tokens are allowed exactly when the text so far is complete. When no token at all is
  // allowed (cannot happen for a well-formed grammar) every logit but one EOG is masked.
  virtual void mask(float* logits, size_t n_vocab) = 0;
  // Advances past `token` (which mask() allowed).
  virtual void accept(int32_t token) = 0;
  // True when the text so far is a complete match.
  virtual bool complete() const = 0;
  // An independent copy in the same state (for n > 1 choices).
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
  // Whether the constraint decides where the text ends (a grammar allows end of generation
  // only once it is complete), so that ignore_eos or min_tokens would contradict it. A
  // constraint that only steers part of the text (a reasoning budget) says false.
  virtual bool decides_end() const { return true; }
};

}  // namespace step35
