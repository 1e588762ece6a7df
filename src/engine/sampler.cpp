#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace step35 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Uniform double in [0, 1) from the top 53 bits of one raw 64-bit output. (The standard
// distributions' algorithms are implementation-defined, so they would make a seed
// reproduce on one standard library only.)
double uniform01(uint64_t raw) { return double(raw >> 11) * 0x1.0p-53; }

}  // namespace

Sampler::Sampler(const SamplingParams& params, size_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
  // Every buffer is sized here once, so sample()/accept() never allocate afterwards.
  work_.resize(n_vocab_);
  idx_.resize(n_vocab_);
  probs_.resize(n_vocab_);
  if (params_.typical_p < 1.0f) typical_order_.reserve(n_vocab_);
  if (penalties_active()) {
    history_.resize(size_t(params_.repeat_last_n));
    counts_.assign(n_vocab_, 0);
  }
}

bool Sampler::penalties_active() const {
  if (params_.repeat_last_n <= 0) return false;
  // A non-positive (or NaN) repeat penalty would flip signs or poison logits: treat as off.
  const bool repeat = params_.repeat_penalty != 1.0f && params_.repeat_penalty > 0.0f;
  return repeat || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

void Sampler::reset() {
  history_head_ = 0;
  history_size_ = 0;
  rng_.seed(params_.seed);
}

void Sampler::accept(int32_t token) {
  if (history_.empty()) return;  // penalties off: nothing needs the history
  history_[history_head_] = token;
  history_head_ = (history_head_ + 1) % history_.size();
  history_size_ = std::min(history_size_ + 1, history_.size());
}

int32_t Sampler::argmax(const float* logits, size_t n) {
  size_t best = 0;
  float best_v = kNegInf;
  for (size_t i = 0; i < n; ++i) {
    const float v = logits[i];
    if (v > best_v) best_v = v, best = i;  // NaN never compares greater; ties keep the lowest id
  }
  return int32_t(best);
}

void Sampler::apply_penalties() {
  if (history_size_ == 0) return;
  // The window's slots [0, history_size_) are exactly the recent tokens (order is
  // irrelevant for counting). Two passes: count, then penalise each distinct token once
  // and zero its count, which leaves counts_ all-zero for the next call.
  const size_t n = n_vocab_;
  for (size_t i = 0; i < history_size_; ++i) {
    const int32_t t = history_[i];
    if (t >= 0 && size_t(t) < n) counts_[size_t(t)]++;
  }
  const bool repeat = params_.repeat_penalty != 1.0f && params_.repeat_penalty > 0.0f;
  for (size_t i = 0; i < history_size_; ++i) {
    const int32_t t = history_[i];
    if (t < 0 || size_t(t) >= n || counts_[size_t(t)] == 0) continue;
    const int c = counts_[size_t(t)];
    counts_[size_t(t)] = 0;
    float& v = work_[size_t(t)];
    if (repeat) v = v > 0.0f ? v / params_.repeat_penalty : v * params_.repeat_penalty;
    v -= params_.presence_penalty + params_.frequency_penalty * float(c);
    if (std::isnan(v)) v = kNegInf;  // e.g. inf - inf with an infinite penalty
  }
}

void Sampler::prepare(const float* logits) {
  const size_t n = n_vocab_;
  for (size_t i = 0; i < n; ++i) {
    const float v = logits[i];
    work_[i] = std::isnan(v) ? kNegInf : v;
  }
  for (const auto& [token, bias] : params_.logit_bias)
    if (token >= 0 && size_t(token) < n) {
      float& v = work_[size_t(token)];
      v += bias;
      if (std::isnan(v)) v = kNegInf;  // +inf logit with a -inf bias: banned
    }
  if (penalties_active()) apply_penalties();
}

int32_t Sampler::sample(const float* logits) {
  const size_t n = n_vocab_;
  if (n == 0) return 0;
  prepare(logits);

  // `!(t > 0)` also sends a NaN temperature to greedy.
  const double temp = double(params_.temperature);
  if (!(temp > 0.0)) return argmax(work_.data(), n);

  // Exactly one RNG step per sampled token, whatever the truncation keeps, so the stream
  // position depends only on how many tokens were sampled.
  const double u01 = uniform01(rng_());
  const size_t keep = candidates();
  if (keep == 0) return argmax(work_.data(), n);
  double mass = 0.0;
  for (size_t i = 0; i < keep; ++i) mass += probs_[i];
  const double u = u01 * mass;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += probs_[i];
    if (u < cum) return idx_[i];
  }
  return idx_[keep - 1];  // u rounded up to the total: the last candidate
}

void Sampler::distribution(const float* logits, std::vector<TokenProb>& out) {
  out.clear();
  const size_t n = n_vocab_;
  if (n == 0) return;
  prepare(logits);
  const double temp = double(params_.temperature);
  const size_t keep = temp > 0.0 ? candidates() : 0;
  if (keep == 0) {
    out.push_back({argmax(work_.data(), n), 1.0});
    return;
  }
  double mass = 0.0;
  for (size_t i = 0; i < keep; ++i) mass += probs_[i];
  for (size_t i = 0; i < keep; ++i) out.push_back({idx_[i], probs_[i] / mass});
}

double Sampler::uniform() { return uniform01(rng_()); }

size_t Sampler::typical(size_t c, double max_logit, double temp) {
  // p_i = e_i / z with e_i = exp((l_i - max) / T); the surprise of token i is -log p_i =
  // log z - (l_i - max) / T, the entropy H = sum p_i * surprise_i, and a token's score is
  // |surprise_i - H|.
  const float* w = work_.data();
  double z = 0.0;
  for (size_t i = 0; i < c; ++i) z += std::exp((double(w[idx_[i]]) - max_logit) / temp);
  const double log_z = std::log(z);
  double entropy = 0.0;
  for (size_t i = 0; i < c; ++i) {
    const double scaled = (double(w[idx_[i]]) - max_logit) / temp;
    entropy += std::exp(scaled) / z * (log_z - scaled);
  }
  // Candidates by score ascending, ties by id.
  std::vector<std::pair<double, int32_t>>& order = typical_order_;
  order.resize(c);
  for (size_t i = 0; i < c; ++i) {
    const double scaled = (double(w[idx_[i]]) - max_logit) / temp;
    order[i] = {std::fabs(log_z - scaled - entropy), idx_[i]};
  }
  std::sort(order.begin(), order.end());
  const double target = double(params_.typical_p);
  double cum = 0.0;
  size_t keep = c;
  for (size_t i = 0; i < c; ++i) {
    idx_[i] = order[i].second;
    cum += std::exp((double(w[idx_[i]]) - max_logit) / temp) / z;
    if (cum >= target && keep == c) keep = i + 1;
  }
  return keep;
}

size_t Sampler::candidates() {
  const size_t n = n_vocab_;
  const double temp = double(params_.temperature);
  float max_logit = kNegInf;
  for (size_t i = 0; i < n; ++i) max_logit = std::max(max_logit, work_[i]);
  if (std::isinf(max_logit)) {
    // All -inf: nothing to sample, token 0. Some +inf: the softmax is a point mass on the
    // +inf tokens; take the lowest id among them.
    return 0;
  }
  // Candidates: every finite-logit token, in id order.
  size_t c = 0;
  for (size_t i = 0; i < n; ++i)
    if (work_[i] > kNegInf) idx_[c++] = int32_t(i);
  // A strict total order (logit descending, then id ascending): the top-k *set* is then the
  // same with every standard library, whatever nth_element's internal order.
  const float* w = work_.data();
  auto by_logit = [w](int32_t a, int32_t b) {
    return w[a] > w[b] || (w[a] == w[b] && a < b);
  };
  bool id_order = true;
  if (params_.top_k > 0 && size_t(params_.top_k) < c) {
    std::nth_element(idx_.begin(), idx_.begin() + std::ptrdiff_t(params_.top_k - 1),
                     idx_.begin() + std::ptrdiff_t(c), by_logit);
    c = size_t(params_.top_k);
    id_order = false;
  }

  // Softmax at the temperature over the top-k set: e_i = exp((l_i - max) / T), so the
  // best token has e = 1 and p_i / p_max = e_i. Z normalises over the whole top-k set (the
  // top-p mass is measured before min-p removes anything).
  if (params_.typical_p < 1.0f && c > 1) {
    c = typical(c, double(max_logit), temp);
    id_order = false;
    // The most likely token may be atypical: p_max is now the best of those kept.
    max_logit = kNegInf;
    for (size_t i = 0; i < c; ++i) max_logit = std::max(max_logit, w[idx_[i]]);
  }
  auto weight = [&](int32_t t) { return std::exp((double(w[t]) - double(max_logit)) / temp); };
  double z = 0.0;
  for (size_t i = 0; i < c; ++i) z += weight(idx_[i]);
  // min-p: p_i < min_p * p_max  <=>  e_i < min_p. Tokens tied with the maximum always stay,
  // so at least one survives even for min_p > 1. The compaction keeps the relative order.
  if (params_.min_p > 0.0f) {
    size_t s = 0;
    for (size_t i = 0; i < c; ++i) {
      const int32_t t = idx_[i];
      if (w[t] == max_logit || weight(t) >= double(params_.min_p)) idx_[s++] = t;
    }
    c = s;
  }

  size_t keep = c;
  if (params_.top_p < 1.0f) {
    keep = nucleus(c, max_logit, z);
  } else if (!id_order) {
    // No top-p: draw over the candidates in id order, a canonical order independent of
    // nth_element's.
    std::sort(idx_.begin(), idx_.begin() + std::ptrdiff_t(c));
  }

  for (size_t i = 0; i < keep; ++i) probs_[i] = weight(idx_[i]);
  return keep;
}

// top-p over the c candidates in idx_ (z: their softmax normaliser): sorts them into
// probability order only as far as the nucleus reaches (select the next chunk with
// nth_element, then sort just that chunk), so a peaked distribution over a big vocabulary
// costs O(n), not O(n log n). Returns how many candidates the nucleus keeps.
size_t Sampler::nucleus(size_t c, float max_logit, double z) {
  const float* w = work_.data();
  const double temp = double(params_.temperature);
  auto by_logit = [w](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };
  auto weight = [&](int32_t t) { return std::exp((double(w[t]) - double(max_logit)) / temp); };
  const double top_p = double(params_.top_p);
  double cum = 0.0;
  size_t sorted = 0, chunk = 64;
  while (sorted < c) {
    const size_t end = std::min(c, sorted + chunk);
    auto first = idx_.begin() + std::ptrdiff_t(sorted);
    auto stop = idx_.begin() + std::ptrdiff_t(end);
    if (end < c) std::nth_element(first, stop - 1, idx_.begin() + std::ptrdiff_t(c), by_logit);
    std::sort(first, stop, by_logit);
    for (size_t i = sorted; i < end; ++i) {
      cum += weight(idx_[i]) / z;
      if (cum >= top_p) return i + 1;
    }
    sorted = end;
    chunk *= 4;
  }
  // Not reached (rounding, or min-p left less than top_p of the mass): everything left is
  // sorted and kept.
  return c;
}

}  // namespace step35
