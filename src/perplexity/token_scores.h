// What one scored position contributes to perplexity and KL divergence, computed as
// llama-perplexity computes it (tools/perplexity/perplexity.cpp at the fixtures' commit):
// the same float/double mix, so the figures agree with llama.cpp's beyond the digits it
// prints. A row is the model's logits at position j; `token` is the text's token j+1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace step35::perplexity {

// uint16 words of one row of a base file: two floats (scale, min log-prob) as four words,
// n_vocab quantised log-probabilities, padded to an even count (llama.cpp's `nv`).
inline size_t base_row_words(int32_t n_vocab) { return 2 * ((size_t(n_vocab) + 1) / 2) + 4; }

// Negative log-likelihood of `token` (plain perplexity): max logit in float, Σ exp(l - max)
// in double, the difference taken in double.
double token_nll(const float* logits, int32_t n_vocab, int32_t token);

// Writes the row's log-probabilities to `row` (base_row_words(n_vocab) words): log-probs
// below max - 16 are clamped there, the rest stored as round((l - min) / scale) with
// scale = (max - min) / 65535; returns the token's negative log-likelihood, which this
// path computes in float (llama.cpp's base-writing run prints this one).
double encode_base_row(const float* logits, int32_t n_vocab, int32_t token, uint16_t* row);

// Decoded log-probability of entry i of a base row.
float base_row_log_prob(const uint16_t* row, int32_t i);

// One position of this model scored against the base row of the same position.
struct KlTokenScore {
  float nll = 0;       // this model's -log p(token)
  float nll_base = 0;  // the base's -log p(token), from the quantised row
  double kld = 0;      // Σ_i p_base(i) (log p_base(i) - log p(i)) over log p_base(i) > -16
  float p_diff = 0;    // p(token) - p_base(token)
  bool same_top = false;  // first argmax of both rows is the same token
};
KlTokenScore score_against_base(const float* logits, int32_t n_vocab, const uint16_t* base_row, int32_t token);

}  // namespace step35::perplexity
