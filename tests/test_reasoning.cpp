// Reasoning control below the server: the reasoning budget constraint (chat/reasoning_budget.h)
// on the micro model's vocabulary, which spells <think> and </think> as single tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "chat/reasoning_budget.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace step35;

namespace {

const Tokenizer& micro_tokenizer() {
  static const auto file = gguf::File::open(std::string(PROJECT_SOURCE_DIR) + "/fuzz/corpus/gguf/micro-f16.gguf");
  static const auto tok = Tokenizer::from_gguf(*file);
  return *tok;
}

// The only token mask() leaves, or -1 when it leaves more than one.
int32_t forced_token(TokenConstraint& c, size_t n_vocab) {
  std::vector<float> logits(n_vocab, 0.0f);
  c.mask(logits.data(), n_vocab);
  int32_t only = -1;
  for (size_t i = 0; i < n_vocab; ++i) {
    if (std::isinf(logits[i])) continue;
    if (only >= 0) return -1;
    only = int32_t(i);
  }
  return only;
}

}  // namespace

// After `budget` reasoning tokens the constraint forces "\n</think>\n" token by token, then
// leaves the answer free; before the budget it forces nothing.
TEST(ReasoningBudget, ForcesTheEndOfTheThinkBlockAtTheBudget) {
  const Tokenizer& tok = micro_tokenizer();
  const size_t V = tok.n_vocab();
  const std::vector<int32_t> words = tok.encode("abcd", false, false);
  ASSERT_EQ(words.size(), 4u);
  auto c = make_reasoning_budget(tok, 3);
  EXPECT_FALSE(c->decides_end());
  std::string forced_text;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(forced_token(*c, V), -1) << i;
    c->accept(words[size_t(i)]);
  }
  for (int i = 0; i < 3; ++i) {
    const int32_t t = forced_token(*c, V);
    ASSERT_GE(t, 0) << i;
    forced_text += tok.token_to_piece(t, true);
    c->accept(t);
  }
  EXPECT_EQ(forced_text, "\n</think>\n");
  EXPECT_EQ(forced_token(*c, V), -1);  // the answer is free
  // A copy continues from the same state.
  auto d = make_reasoning_budget(tok, 1);
  d->accept(words[0]);
  auto copy = d->clone();
  EXPECT_EQ(forced_token(*copy, V), forced_token(*d, V));
}

// Reasoning that already ends with a newline is not given a second one, and a think block
// the model closes itself before the budget is left alone.
TEST(ReasoningBudget, NewlineAndNaturalEnd) {
  const Tokenizer& tok = micro_tokenizer();
  const size_t V = tok.n_vocab();
  const std::vector<int32_t> line = tok.encode("a\n", false, false);
  auto c = make_reasoning_budget(tok, int32_t(line.size()));
  for (int32_t t : line) c->accept(t);
  const int32_t first = forced_token(*c, V);
  ASSERT_GE(first, 0);
  EXPECT_EQ(tok.token_to_piece(first, true), "</think>");

  auto natural = make_reasoning_budget(tok, 4);
  for (int32_t t : tok.encode("a</think>b", false, true)) natural->accept(t);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(forced_token(*natural, V), -1);
    natural->accept(tok.encode("c", false, false)[0]);
  }
  // Budget 0: forced from the start.
  auto none = make_reasoning_budget(tok, 0);
  EXPECT_EQ(tok.token_to_piece(forced_token(*none, V), true), "\n");
}

// A budget that runs out inside a multi-byte character lets the character finish first.
TEST(ReasoningBudget, WaitsForAWholeCharacter) {
  const Tokenizer& tok = micro_tokenizer();
  const size_t V = tok.n_vocab();
  const std::vector<int32_t> euro = tok.encode("\xE2\x82\xAC", false, false);  // three byte tokens
  ASSERT_EQ(euro.size(), 3u);
  auto c = make_reasoning_budget(tok, 1);
  c->accept(euro[0]);
  EXPECT_EQ(forced_token(*c, V), -1);
  c->accept(euro[1]);
  EXPECT_EQ(forced_token(*c, V), -1);
  c->accept(euro[2]);
  EXPECT_EQ(tok.token_to_piece(forced_token(*c, V), true), "\n");
}
