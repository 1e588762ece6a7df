#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace step35 {

Sampler::Sampler(const SamplingParams& params, size_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {}

void Sampler::reset() {
  history_.clear();
  rng_.seed(params_.seed);
}

void Sampler::accept(int32_t token) {
  history_.push_back(token);
  const size_t keep = size_t(std::max(params_.repeat_last_n, 0));
  while (history_.size() > keep) history_.pop_front();
}

int32_t Sampler::argmax(const float* logits, size_t n) {
  size_t best = 0;
  float best_v = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    const float v = logits[i];
    if (v > best_v) best_v = v, best = i;  // NaN never compares greater; ties keep the lowest id
  }
  return int32_t(best);
}

int32_t Sampler::sample(const float* logits) {
  const size_t n = n_vocab_;
  work_.assign(logits, logits + n);
  for (float& v : work_)
    if (std::isnan(v)) v = -INFINITY;

  // Penalties over the recent history (prompt and generated tokens).
  if (!history_.empty() && (params_.repeat_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                            params_.frequency_penalty != 0.0f)) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history_)
      if (t >= 0 && size_t(t) < n) counts[t]++;
    for (const auto& [t, c] : counts) {
      float& v = work_[size_t(t)];
      if (params_.repeat_penalty != 1.0f && params_.repeat_penalty > 0.0f)
        v = v > 0 ? v / params_.repeat_penalty : v * params_.repeat_penalty;
      v -= params_.presence_penalty + params_.frequency_penalty * float(c);
    }
  }
  if (params_.temperature <= 0.0f) return argmax(work_.data(), n);

  // Candidates sorted by logit (descending; ties by id), truncated by top-k.
  idx_.resize(n);
  for (size_t i = 0; i < n; ++i) idx_[i] = int32_t(i);
  size_t k = n;
  if (params_.top_k > 0 && size_t(params_.top_k) < n) k = size_t(params_.top_k);
  auto by_logit = [&](int32_t a, int32_t b) {
    return work_[size_t(a)] > work_[size_t(b)] || (work_[size_t(a)] == work_[size_t(b)] && a < b);
  };
  std::partial_sort(idx_.begin(), idx_.begin() + std::ptrdiff_t(k), idx_.end(), by_logit);
  const float max_logit = work_[size_t(idx_[0])];
  if (!std::isfinite(max_logit)) return idx_[0];

  // Softmax with temperature over the k candidates (probabilities written in place).
  probs_.resize(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    const double p = std::exp(double(work_[size_t(idx_[i])] - max_logit) / double(params_.temperature));
    probs_[i] = p;
    sum += p;
  }
  for (size_t i = 0; i < k; ++i) probs_[i] /= sum;
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (params_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = k;
    for (size_t i = 0; i < k; ++i) {
      cum += probs_[i];
      if (cum >= double(params_.top_p)) {
        keep = i + 1;
        break;
      }
    }
    k = keep;
  }
  // min-p: drop tokens below min_p × the top probability.
  if (params_.min_p > 0.0f) {
    const double floor = double(params_.min_p) * probs_[0];
    size_t keep = 1;
    while (keep < k && probs_[keep] >= floor) ++keep;
    k = keep;
  }
  double mass = 0;
  for (size_t i = 0; i < k; ++i) mass += probs_[i];
  // A uniform double from the raw 64-bit output, so a seed reproduces on every platform.
  const double u = double(rng_() >> 11) * 0x1.0p-53 * mass;
  double cum = 0;
  for (size_t i = 0; i < k; ++i) {
    cum += probs_[i];
    if (u < cum) return idx_[i];
  }
  return idx_[k - 1];
}

}  // namespace step35
