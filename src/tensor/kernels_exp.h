// exp(x) for the softmax of attention, as a range reduction to [-ln2/2, ln2/2] and a
// degree-6 polynomial (the Cephes expf coefficients): about 1 ulp over the range the
// softmax uses (x <= 0). The SIMD versions evaluate the same steps lane by lane.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace step35::kernels {

namespace exp_consts {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;       // ln 2 split so n·kLn2Hi is exact
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMin = -87.0f;               // below: 2^n would leave the normal range
constexpr float kMax = 88.0f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
}  // namespace exp_consts

// Scalar version (reference); inputs below kMin give ~1e-38 instead of 0, which no
// softmax sum can see.
inline float exp_poly(float x) {
  using namespace exp_consts;
  x = std::fmin(std::fmax(x, kMin), kMax);  // NaN becomes kMin
  const float n = std::nearbyint(x * kLog2e);
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kP0;
  p = p * r + kP1;
  p = p * r + kP2;
  p = p * r + kP3;
  p = p * r + kP4;
  p = p * r + kP5;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

}  // namespace step35::kernels
