// The structured-output entry points: schemas compiled into grammars
// (json_schema_compile.cpp) and applied to a tokenizer's vocabulary (grammar_constraint),
// and the wrapper that leaves text free until a trigger token (reasoning before </think>).
#include "structured/json_constraint.h"

#include <cmath>
#include <stdexcept>

#include "structured/gbnf.h"
#include "structured/grammar_constraint.h"
#include "structured/json_schema.h"

namespace step35 {

std::unique_ptr<TokenConstraint> make_json_constraint(const nlohmann::json& schema, const Tokenizer& tok) {
  auto grammar = grammar::compile_json_schema(schema);
  return std::make_unique<grammar::GrammarConstraint>(std::move(grammar), grammar::TokenTrie::of(tok));
}

std::unique_ptr<TokenConstraint> make_gbnf_constraint(std::string_view gbnf, const Tokenizer& tok) {
  auto grammar = grammar::compile_gbnf(gbnf);
  return std::make_unique<grammar::GrammarConstraint>(std::move(grammar), grammar::TokenTrie::of(tok));
}

namespace {

// Free text (reasoning) until `trigger`, then the inner constraint. End of generation is
// not allowed in the free part: the constrained text must still follow.
class AfterTokenConstraint : public TokenConstraint {
 public:
  AfterTokenConstraint(int32_t trigger, int32_t max_free, std::unique_ptr<TokenConstraint> inner,
                       std::vector<int32_t> eog)
      : trigger_(trigger), max_free_(max_free), inner_(std::move(inner)), eog_(std::move(eog)) {}

  void mask(float* logits, size_t n_vocab) override {
    if (triggered_) {
      inner_->mask(logits, n_vocab);
      return;
    }
    if (max_free_ >= 0 && n_free_ >= max_free_) {  // budget spent: only the trigger
      for (size_t i = 0; i < n_vocab; ++i)
        if (int64_t(i) != trigger_) logits[i] = -INFINITY;
      return;
    }
    // Free text, but no end of generation: the constrained part must still follow.
    for (int32_t e : eog_)
      if (e >= 0 && size_t(e) < n_vocab && e != trigger_) logits[e] = -INFINITY;
  }

  void accept(int32_t token) override {
    if (triggered_) {
      inner_->accept(token);
    } else if (token == trigger_) {
      triggered_ = true;
    } else {
      ++n_free_;
    }
  }

  bool complete() const override { return triggered_ && inner_->complete(); }

  std::unique_ptr<TokenConstraint> clone() const override {
    auto c = std::make_unique<AfterTokenConstraint>(trigger_, max_free_, inner_->clone(), eog_);
    c->triggered_ = triggered_;
    c->n_free_ = n_free_;
    return c;
  }

 private:
  int32_t trigger_;
  int32_t max_free_;
  std::unique_ptr<TokenConstraint> inner_;
  std::vector<int32_t> eog_;
  bool triggered_ = false;
  int32_t n_free_ = 0;
};

}  // namespace

std::unique_ptr<TokenConstraint> make_after_token_constraint(int32_t trigger, int32_t max_free,
                                                             std::unique_ptr<TokenConstraint> inner) {
  if (!inner) throw std::invalid_argument("make_after_token_constraint: no inner constraint");
  if (trigger < 0) throw std::invalid_argument("make_after_token_constraint: the trigger token is missing from the vocabulary");
  std::vector<int32_t> eog;
  if (auto* g = dynamic_cast<grammar::GrammarConstraint*>(inner.get())) eog = g->eog_tokens();
  return std::make_unique<AfterTokenConstraint>(trigger, max_free, std::move(inner), std::move(eog));
}

}  // namespace step35
