// The model's arithmetic between the matrix products, written once: the inference forward
// (step35_forward.cpp) and the training forward (src/train) both call these, so the two
// compute the same bits by construction (TrainModel.ForwardMatches* check the whole
// forward). docs/architecture.md, "The model", describes each step.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tensor/kernels.h"

namespace step35 {

inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// RMS(x; w) of one row ("Conventions"): y = x * s * w with s = 1 / sqrt(mean(x^2) + eps).
// Returns s (the training backward's inverse RMS). y may be x.
inline float rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float scale = 1.0f / std::sqrt(kernels::sum_squares_f32(x, n) / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  return scale;
}

// The RoPE angles of one position: row[j] = cos(theta_j), row[half + j] = sin(theta_j) for
// j < half = n_rot / 2, theta_j = pos * base^(-2j / n_rot) / freq_factors[j] (factors
// optional: the rope_freqs tensor of the full-attention layers).
void rope_angles(int32_t pos, int32_t n_rot, float base, const float* freq_factors, float* row);
// NeoX ("rotate-half") RoPE of the first 2*half dims of one head with the cos/sin of its
// position's angles.
inline void rope_apply(float* x, int32_t half, const float* cs, const float* sn) {
  for (int32_t i = 0; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * cs[i] - x1 * sn[i];
    x[i + half] = x0 * sn[i] + x1 * cs[i];
  }
}

// MoE routing ("MoE routing and the shared expert").
// The smallest sum of the chosen experts' probabilities the weights are divided by (2^-14).
constexpr float kMinExpertWeightSum = 6.103515625e-5f;
// Router logits z[n_expert] into probabilities, in place: sigmoid per expert, or softmax.
inline void router_probabilities(bool sigmoid_gating, float* z, int64_t n_expert) {
  if (sigmoid_gating) {
    for (int64_t e = 0; e < n_expert; ++e) z[e] = sigmoid(z[e]);
    return;
  }
  const float mx = *std::max_element(z, z + n_expert);
  float sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) sum += (z[e] = std::exp(z[e] - mx));
  for (int64_t e = 0; e < n_expert; ++e) z[e] /= sum;
}
// The k experts of highest selection score p[e] + bias[e] (bias optional), best first, ties
// to the lower id, into ids[k]; sel[k] is scratch.
inline void router_top_k(const float* p, const float* bias, int64_t n_expert, int64_t k, int32_t* ids,
                         float* sel) {
  // Kept sorted by insertion (k is small; no full sort).
  int64_t n = 0;
  for (int64_t e = 0; e < n_expert; ++e) {
    const float s = p[e] + (bias ? bias[e] : 0.0f);
    if (n == k && !(s > sel[k - 1])) continue;
    int64_t j = n < k ? n++ : k - 1;
    while (j > 0 && s > sel[j - 1]) {
      sel[j] = sel[j - 1];
      ids[j] = ids[j - 1];
      --j;
    }
    sel[j] = s;
    ids[j] = int32_t(e);
  }
}
// What the chosen weights are multiplied by before the scale: 1 / max(sum, kMinExpertWeightSum)
// when normalising, else 1.
inline float expert_weight_norm(bool normalize, float sum) {
  return normalize ? 1.0f / std::max(sum, kMinExpertWeightSum) : 1.0f;
}

}  // namespace step35
