// Placeholder implementation of kernels.h on the scalar reference code (F32 activations
// only). Replaced by the dispatched scalar/AVX2/AVX-512 kernels.
#include "tensor/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "tensor/quants.h"

namespace step35::kernels {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}
std::vector<Isa> available_isas() { return {Isa::Scalar}; }
Isa active_isa() { return Isa::Scalar; }
void force_isa(Isa) {}
std::string cpu_summary() { return "scalar"; }

const char* act_type_name(ActType t) {
  switch (t) {
    case ActType::F32: return "f32";
    case ActType::F16: return "f16";
    case ActType::BF16: return "bf16";
    case ActType::Q8_0: return "q8_0";
    case ActType::Q8_1: return "q8_1";
    case ActType::Q8_K: return "q8_K";
  }
  return "?";
}

ActType act_type(DType, Precision) { return ActType::F32; }

size_t act_row_bytes(ActType t, int64_t n) {
  if (t != ActType::F32) throw std::invalid_argument("act_row_bytes: unsupported activation type");
  return (size_t(n) * 4 + 63) / 64 * 64;
}

void convert_activations(ActType t, const float* x, int64_t n_rows, int64_t n, int64_t ld_x, uint8_t* dst) {
  const size_t rb = act_row_bytes(t, n);
  for (int64_t r = 0; r < n_rows; ++r) std::memcpy(dst + size_t(r) * rb, x + r * ld_x, size_t(n) * 4);
}

void rms_norm_convert(ActType t, const float* x, const float* w, float eps, int64_t n_rows, int64_t n,
                      int64_t ld_x, uint8_t* dst, float* normed) {
  const size_t rb = act_row_bytes(t, n);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ld_x;
    float* yr = reinterpret_cast<float*>(dst + size_t(r) * rb);
    const float scale = 1.0f / std::sqrt(sum_squares_f32(xr, n) / float(n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
    if (normed) std::memcpy(normed + r * n, yr, size_t(n) * 4);
  }
}

void swiglu_convert(ActType t, const float* gate, const float* up, int64_t ld, float limit, int64_t n_rows,
                    int64_t n, uint8_t* dst) {
  const size_t rb = act_row_bytes(t, n);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* yr = reinterpret_cast<float*>(dst + size_t(r) * rb);
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[r * ld + i], u = up[r * ld + i];
      const float s = g / (1.0f + std::exp(-g));
      yr[i] = limit > 1e-6f ? std::min(s, limit) * std::clamp(u, -limit, limit) : s * u;
    }
  }
}

void matmul(const WeightMatrix& w, int64_t o_begin, int64_t o_end, const ActRows& x, float* y, int64_t ldy) {
  if (x.type != ActType::F32) throw std::invalid_argument("matmul: unsupported activation type");
  std::vector<float> row(size_t(w.n_in));
  for (int64_t o = o_begin; o < o_end; ++o) {
    dequantize_row_ref(w.type, w.row(o), row.data(), w.n_in);
    for (int64_t t = 0; t < x.n_tok; ++t) {
      const int64_t r = x.idx ? x.idx[t] : t;
      const float* xt = reinterpret_cast<const float*>(x.data + size_t(r) * x.stride);
      y[t * ldy + o] = dot_f32(row.data(), xt, w.n_in);
    }
  }
}

int64_t row_granularity(DType) { return 1; }

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
void axpy_f32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void scale_f32(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}
float sum_squares_f32(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return float(s);
}

}  // namespace step35::kernels
