#include "chat/reasoning_budget.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/step35_format.h"

namespace step35 {

namespace {

using step35_format::kThinkClose;

// Bytes at the end of `text` that start a UTF-8 character still missing continuation
// bytes (0 when the text ends on a character boundary).
size_t incomplete_utf8_tail(std::string_view text) {
  for (size_t back = 1; back <= 4 && back <= text.size(); ++back) {
    const uint8_t c = uint8_t(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

class ReasoningBudget final : public TokenConstraint {
 public:
  ReasoningBudget(const Tokenizer& tok, int32_t budget, std::vector<int32_t> forced, bool forced_starts_with_newline)
      : tok_(&tok), budget_(budget), forced_(std::move(forced)), skip_newline_ok_(forced_starts_with_newline) {
    if (budget_ <= 0) start_forcing();
  }

  void mask(float* logits, size_t n_vocab) override {
    if (state_ != State::Forcing) return;
    const int32_t want = forced_[pos_];
    for (size_t i = 0; i < n_vocab; ++i)
      if (int64_t(i) != want) logits[i] = -INFINITY;
  }

  void accept(int32_t token) override {
    switch (state_) {
      case State::Counting:
      case State::FinishingCharacter: {
        tail_ += tok_->token_to_piece(token, true);
        if (tail_.find(kThinkClose) != std::string::npos) {  // ended by the model itself
          state_ = State::Done;
          return;
        }
        // Only the end of the text matters from here on (a split "</think>", a split
        // character, a final newline).
        if (tail_.size() > 32) tail_.erase(0, tail_.size() - 32);
        if (state_ == State::Counting) ++used_;
        if (used_ >= budget_ && incomplete_utf8_tail(tail_) == 0) start_forcing();
        else if (used_ >= budget_) state_ = State::FinishingCharacter;
        return;
      }
      case State::Forcing:
        if (++pos_ >= forced_.size()) state_ = State::Done;
        return;
      case State::Done: return;
    }
  }

  bool complete() const override { return true; }
  bool decides_end() const override { return false; }

  std::unique_ptr<TokenConstraint> clone() const override { return std::make_unique<ReasoningBudget>(*this); }

 private:
  enum class State : uint8_t { Counting, FinishingCharacter, Forcing, Done };

  void start_forcing() {
    state_ = State::Forcing;
    pos_ = 0;
    // The reasoning already ends with the newline the end sequence starts with.
    if (skip_newline_ok_ && !tail_.empty() && tail_.back() == '\n') pos_ = 1;
    if (pos_ >= forced_.size()) state_ = State::Done;
  }

  const Tokenizer* tok_;
  int32_t budget_;
  std::vector<int32_t> forced_;  // the tokens of "\n</think>\n"
  bool skip_newline_ok_;         // forced_[0] is exactly "\n"
  State state_ = State::Counting;
  int32_t used_ = 0;
  size_t pos_ = 0;               // next forced token
  std::string tail_;             // the end of the reasoning text so far
};

}  // namespace

std::unique_ptr<TokenConstraint> make_reasoning_budget(const Tokenizer& tok, int32_t budget) {
  // "\n", "</think>", "\n" tokenized separately, so the end tag is the special token where
  // the vocabulary has one, as the model writes it.
  std::vector<int32_t> forced = tok.encode("\n", false, false);
  const bool starts_with_newline = forced.size() == 1;
  const std::vector<int32_t> close = tok.encode(std::string(kThinkClose), false, true);
  if (close.empty() || tok.decode(close, true) != kThinkClose)
    throw std::invalid_argument("the vocabulary cannot write </think>: no reasoning budget");
  forced.insert(forced.end(), close.begin(), close.end());
  const std::vector<int32_t> newline = tok.encode("\n", false, false);
  forced.insert(forced.end(), newline.begin(), newline.end());
  return std::make_unique<ReasoningBudget>(tok, budget, std::move(forced), starts_with_newline);
}

}  // namespace step35
