#include "model/layer_math.h"

#include <algorithm>

namespace step35 {

void rope_angles(int32_t pos, int32_t n_rot, float base, const float* freq_factors, float* row) {
  const int32_t half = n_rot / 2;
  for (int32_t j = 0; j < half; ++j) {
    double theta = double(pos) * std::pow(double(base), -2.0 * j / double(n_rot));
    if (freq_factors) theta /= double(freq_factors[j]);
    row[j] = float(std::cos(theta));
    row[half + j] = float(std::sin(theta));
  }
}

}  // namespace step35
