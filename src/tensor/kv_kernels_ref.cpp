// Scalar reference of the per-block attention kernels (kv_kernels.h): plain loops over the
// private block layout (kv_layout.h), every float operation rounded on its own
// (-ffp-contract=off). The SIMD twins (kv_kernels_x86.inc) are tested against these.
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/fp16.h"
#include "tensor/kernels_exp.h"
#include "tensor/kernels_impl.h"
#include "tensor/kv_layout.h"
#include "tensor/quants.h"

namespace step35::kernels {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Key i of position j of a dimension-major float block.
float float_key(DType t, const uint8_t* block, int32_t bs, int64_t i, int32_t j) {
  const size_t at = size_t(i) * size_t(bs) + size_t(j);
  if (t == DType::F32) {
    float f;
    std::memcpy(&f, block + at * 4, 4);
    return f;
  }
  const uint16_t h = load_u16(block + at * 2);
  return t == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

}  // namespace

void ref_kv_scores(DType t, const uint8_t* q, size_t q_stride, int64_t n_q, const uint8_t* block, int32_t bs,
                   int32_t n_k, int64_t d, float scale, float* s, int64_t s_stride) {
  if (t == DType::Q8_0 || t == DType::Q4_0) {
    const int64_t nb = d / 32;
    const uint8_t* ints = block + key_scale_bytes(d, bs);
    const int32_t offset = t == DType::Q8_0 ? kKeyOffsetQ8_0 : kKeyOffsetQ4_0;
    for (int64_t r = 0; r < n_q; ++r) {
      const auto* qb = reinterpret_cast<const QueryQ8*>(q + size_t(r) * q_stride);
      for (int32_t j = 0; j < n_k; ++j) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          int32_t isum = 0;
          for (int e = 0; e < 32; ++e) {
            const int64_t i = 32 * b + e;
            int32_t u;
            if (t == DType::Q8_0) {
              u = ints[key_q8_index(i, j, bs)];
            } else {
              const uint8_t byte = ints[key_q4_index(i, j, bs)];
              u = key_q4_high(i) ? byte >> 4 : byte & 15;
            }
            isum += u * qb[b].qs[e];
          }
          isum -= offset * qb[b].sum;
          const float dk = fp16_to_fp32(load_u16(block + (size_t(b) * size_t(bs) + size_t(j)) * 2));
          acc += (dk * qb[b].d) * float(isum);
        }
        s[r * s_stride + j] = acc * scale;
      }
    }
    return;
  }
  for (int64_t r = 0; r < n_q; ++r) {
    const float* qr = reinterpret_cast<const float*>(q + size_t(r) * q_stride);
    for (int32_t j = 0; j < n_k; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d; ++i) acc += qr[i] * float_key(t, block, bs, i, j);
      s[r * s_stride + j] = acc * scale;
    }
  }
}

float ref_kv_exp_sum(float* s, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = s[j] == -INFINITY ? 0.0f : exp_poly(s[j] - m);
    sum += s[j];
  }
  return sum;
}

float ref_kv_max(const float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

void ref_kv_accumulate(DType t, const float* p, int64_t p_stride, int64_t n_q, const uint8_t* block, int32_t n_k,
                       int64_t d, float* acc, int64_t acc_stride) {
  thread_local std::vector<float> row;
  row.resize(size_t(d));
  const size_t rb = *row_bytes(t, d);
  for (int32_t j = 0; j < n_k; ++j) {
    dequantize_row_ref(t, block + size_t(j) * rb, row.data(), d);
    for (int64_t r = 0; r < n_q; ++r) {
      const float w = p[r * p_stride + j];
      float* a = acc + r * acc_stride;
      for (int64_t c = 0; c < d; ++c) a[c] += w * row[size_t(c)];
    }
  }
}

}  // namespace step35::kernels
