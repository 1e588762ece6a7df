#include "perplexity/token_scores.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace step35::perplexity {

static_assert(std::endian::native == std::endian::little,
              "base files store floats and integers little-endian, as llama.cpp writes them on x86");

namespace {

// Round to nearest, ties to even, for 0 <= x < 2^22: adding 1.5 * 2^23 leaves the
// integer part in the low mantissa bits (the rounding ggml uses when it stores log-probs).
int round_small(float x) {
  const float shifted = x + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

float max_of(const float* v, int32_t n) {
  float m = v[0];
  for (int32_t i = 1; i < n; ++i) m = std::max(m, v[i]);
  return m;
}

// Σ exp(l - max) in double, each term in float (expf), as llama.cpp sums it.
double sum_exp(const float* logits, int32_t n_vocab, float max_logit) {
  double s = 0.0;
  for (int32_t i = 0; i < n_vocab; ++i) s += std::exp(logits[i] - max_logit);
  return s;
}

}  // namespace

double token_nll(const float* logits, int32_t n_vocab, int32_t token) {
  const float max_logit = max_of(logits, n_vocab);
  const double s = sum_exp(logits, n_vocab, max_logit);
  const double log_prob = double(logits[token] - max_logit) - std::log(s);
  return -log_prob;
}

double encode_base_row(const float* logits, int32_t n_vocab, int32_t token, uint16_t* row) {
  float max_logit = logits[0], min_logit = logits[0];
  for (int32_t i = 1; i < n_vocab; ++i) {
    max_logit = std::max(max_logit, logits[i]);
    min_logit = std::min(min_logit, logits[i]);
  }
  min_logit = std::max(min_logit, max_logit - 16);
  const float log_sum_exp = float(std::log(sum_exp(logits, n_vocab, max_logit)));
  const float min_log_prob = min_logit - max_logit - log_sum_exp;
  const float scale = (max_logit - min_logit) / 65535.f;
  std::memcpy(row, &scale, sizeof scale);
  std::memcpy(row + 2, &min_log_prob, sizeof min_log_prob);
  uint16_t* values = row + 4;
  const size_t n_words = base_row_words(n_vocab);
  std::fill(values, row + n_words, uint16_t(0));
  if (scale != 0.0f) {
    const float inv_scale = 1 / scale;
    for (int32_t i = 0; i < n_vocab; ++i)
      if (logits[i] > min_logit) values[i] = uint16_t(round_small(inv_scale * (logits[i] - min_logit)));
  }
  const float nll = max_logit + log_sum_exp - logits[token];
  return nll;
}

float base_row_log_prob(const uint16_t* row, int32_t i) {
  float scale, min_log_prob;
  std::memcpy(&scale, row, sizeof scale);
  std::memcpy(&min_log_prob, row + 2, sizeof min_log_prob);
  return scale * float(row[4 + i]) + min_log_prob;
}

KlTokenScore score_against_base(const float* logits, int32_t n_vocab, const uint16_t* base_row, int32_t token) {
  float max_logit = logits[0];
  int32_t top = 0;
  for (int32_t i = 1; i < n_vocab; ++i)
    if (logits[i] > max_logit) {
      max_logit = logits[i];
      top = i;
    }
  const float log_sum_exp = float(std::log(sum_exp(logits, n_vocab, max_logit)));
  float scale, min_log_prob;
  std::memcpy(&scale, base_row, sizeof scale);
  std::memcpy(&min_log_prob, base_row + 2, sizeof min_log_prob);
  const uint16_t* base = base_row + 4;

  KlTokenScore s;
  s.nll = max_logit + log_sum_exp - logits[token];
  s.nll_base = -(scale * float(base[token]) + min_log_prob);
  // log p(i) = logits[i] - log_norm
  const float log_norm = max_logit + log_sum_exp;
  double kld = 0;
  int32_t top_base = 0;
  float top_base_log_prob = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    const float log_p_base = scale * float(base[i]) + min_log_prob;
    if (i == 0 || log_p_base > top_base_log_prob) {
      top_base_log_prob = log_p_base;
      top_base = i;
    }
    // Entries clamped at the row's floor (max - 16 and below) carry under e^-16 each.
    if (log_p_base > -16.f) kld += std::exp(log_p_base) * (log_p_base - logits[i] + log_norm);
  }
  s.kld = kld;
  s.same_top = top == top_base;
  s.p_diff = std::exp(-s.nll) - std::exp(-s.nll_base);
  return s;
}

}  // namespace step35::perplexity
