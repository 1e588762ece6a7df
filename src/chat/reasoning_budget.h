// A reasoning budget: after a number of reasoning tokens, the think block is ended the way
// Step 3.5 writes it, "\n</think>\n", by forcing those tokens one by one; the answer then
// follows freely. A think block the model closes itself before the budget is left alone.
//
// Counting starts at the first generated token (the prompt opened the think block). When
// the budget runs out in the middle of a multi-byte UTF-8 character, the tokens that
// complete the character are still allowed first. The leading "\n" is not forced again
// when the reasoning already ends with one.
#pragma once

#include <cstdint>
#include <memory>

#include "structured/constraint.h"
#include "tokenizer/tokenizer.h"

namespace step35 {

// `budget` >= 0 reasoning tokens. Throws std::invalid_argument when the vocabulary cannot
// write "</think>". The tokenizer must outlive the constraint. decides_end() is false:
// the constraint never holds back the end of generation.
std::unique_ptr<TokenConstraint> make_reasoning_budget(const Tokenizer& tok, int32_t budget);

}  // namespace step35
