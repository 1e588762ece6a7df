// Rounding helpers shared by the weight encoders (tensor/quants*.cpp) and the activation
// converters (tensor/kernels_ref.cpp), written once so that every one of them rounds and
// picks its reference element exactly as ggml does.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace step35 {

// ggml's nearest_int: round half to even through the 1.5·2^23 trick, exact for |v| < 2^22.
// Plain bit operations, so a NaN or huge input gives some deterministic int, never the
// undefined behaviour of a float->int conversion.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// The element of largest magnitude and that magnitude; the first one wins among equal
// magnitudes and a NaN never wins (all-NaN or all-zero input gives {0, 0}).
struct SignedAbsMax {
  float abs = 0.0f;
  float value = 0.0f;
};

inline SignedAbsMax signed_absmax(const float* x, int n) {
  SignedAbsMax m;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > m.abs) {
      m.abs = ax;
      m.value = x[i];
    }
  }
  return m;
}

}  // namespace step35
