#include "model/layer_math.h"

#include <algorithm>

#include "tensor/kernels.h"

namespace step35 {

float rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float scale = 1.0f / std::sqrt(kernels::sum_squares_f32(x, n) / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
  return scale;
}

void rope_angles(int32_t pos, int32_t n_rot, float base, const float* freq_factors, float* row) {
  const int32_t half = n_rot / 2;
  for (int32_t j = 0; j < half; ++j) {
    double theta = double(pos) * std::pow(double(base), -2.0 * j / double(n_rot));
    if (freq_factors) theta /= double(freq_factors[j]);
    row[j] = float(std::cos(theta));
    row[half + j] = float(std::sin(theta));
  }
}

void rope_apply(float* x, int32_t half, const float* cs, const float* sn) {
  for (int32_t i = 0; i < half; ++i) {
    const float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * cs[i] - x1 * sn[i];
    x[i + half] = x0 * sn[i] + x1 * cs[i];
  }
}

void router_probabilities(bool sigmoid_gating, float* z, int64_t n_expert) {
  if (sigmoid_gating) {
    for (int64_t e = 0; e < n_expert; ++e) z[e] = sigmoid(z[e]);
    return;
  }
  const float mx = *std::max_element(z, z + n_expert);
  float sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) sum += (z[e] = std::exp(z[e] - mx));
  for (int64_t e = 0; e < n_expert; ++e) z[e] /= sum;
}

void router_top_k(const float* p, const float* bias, int64_t n_expert, int64_t k, int32_t* ids, float* sel) {
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

}  // namespace step35
