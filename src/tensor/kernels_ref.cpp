// Scalar reference kernels: the activation converters (bit-identical to ggml's) and a plain
// implementation of every dot product and vector helper, the ground truth every SIMD kernel
// is tested against. The K-quant dot products sum exact integers per block and then do the
// same few float operations as the SIMD versions, so those agree bit for bit.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/block32.h"
#include "tensor/fp16.h"
#include "tensor/kernels_exp.h"
#include "tensor/iq_grids.h"
#include "tensor/kernels_impl.h"
#include "tensor/quant_rounding.h"
#include "tensor/quants.h"
#include "tensor/quants_iq.h"

namespace step35::kernels {

namespace {

// Round to nearest, ties to even, as _mm256_round_ps(_MM_ROUND_NEAREST) in ggml's x86
// Q8_0/Q8_1 quantizers. |v| <= 127 here (plus rounding), NaN maps to 0.
int round_even(float v) {
  if (!(std::fabs(v) <= 1e6f)) return 0;
  return int(std::nearbyint(v));
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One block of ggml's x86 quantize_row_q8_0 / q8_1: d = amax/127, values x·(127/amax)
// rounded half to even into qs; returns d (unrounded, the caller stores it as F16).
float quantize_act_block_q8(const float* x, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < 32; ++j) qs[j] = int8_t(round_even(x[j] * id));
  return amax / 127.0f;
}

}  // namespace

// ggml's x86 quantize_row_q8_0: d = amax/127 stored as F16, values x·(127/amax) rounded
// half to even.
void quantize_act_q8_0(const float* x, ActQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) y[b].d = fp32_to_fp16(quantize_act_block_q8(x, y[b].qs));
}

// ggml's x86 quantize_row_q8_1: as Q8_0, plus s = F16(d · Σq).
void quantize_act_q8_1(const float* x, ActQ8_1* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    const float d = quantize_act_block_q8(x, y[b].qs);
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += y[b].qs[j];
    y[b].s = fp32_to_fp16(d * float(sum));
  }
}

// ggml's quantize_row_q8_K: the value of largest magnitude (with its sign) maps to -127,
// iscale = -127/max, nearest_int rounding capped at 127, d = 1/iscale, sums per 16.
void quantize_act_q8_K(const float* x, ActQ8_K* y, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256) {
    const SignedAbsMax peak = signed_absmax(x, 256);
    ActQ8_K& q = y[b];
    if (peak.abs == 0.0f || std::isnan(peak.abs)) {  // all zero (ggml), or NaN input (ours: zeros)
      std::memset(&q, 0, sizeof q);
      continue;
    }
    const float iscale = -127.0f / peak.value;
    for (int j = 0; j < 256; ++j) {
      const float v = iscale * x[j];
      const int r = std::fabs(v) <= 4194303.0f ? nearest_int(v) : 0;
      q.qs[j] = int8_t(r < 127 ? r : 127);
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += q.qs[16 * g + j];
      q.bsums[g] = int16_t(sum);
    }
    q.d = 1.0f / iscale;
  }
}

namespace {

// ---- K-quant super-blocks against Q8_K ----
// Each block's integer sums are exact; its float term is formed as in the SIMD kernels and
// added to the row's float accumulator in block order.

template <typename Block, float (*BlockTerm)(const Block&, const ActQ8_K&)>
float dot_k_blocks(int64_t n, const uint8_t* w, const uint8_t* x) {
  const auto* bw = reinterpret_cast<const Block*>(w);
  const auto* bx = reinterpret_cast<const ActQ8_K*>(x);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i) acc += BlockTerm(bw[i], bx[i]);
  return acc;
}

// d·isum - dmin·summins for the types with a min (Q2_K, Q4_K, Q5_K).
template <typename Block>
float term_with_min(const Block& b, const ActQ8_K& y, int32_t isum, int32_t summins) {
  const float d = y.d * fp16_to_fp32(b.d), dmin = y.d * fp16_to_fp32(b.dmin);
  return d * float(isum) - dmin * float(summins);
}

// Q4_K and Q5_K: eight sub-blocks of 32 with a 6-bit scale and min each; Q5_K's fifth bit of
// element l of sub-block s is bit s of qh[l].
template <typename Block>
float q4_q5_k_term(const Block& b, const ActQ8_K& y) {
  int32_t isum = 0, summins = 0;
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    k4_scale_min(b.scales, s, &sc, &m);
    int32_t dot = 0;
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = b.qs[32 * (s / 2) + l];
      int q = s % 2 == 0 ? (byte & 15) : (byte >> 4);
      if constexpr (std::is_same_v<Block, BlockQ5_K>) q |= ((b.qh[l] >> s) & 1) << 4;
      dot += q * y.qs[32 * s + l];
    }
    isum += sc * dot;
    summins += m * (y.bsums[2 * s] + y.bsums[2 * s + 1]);
  }
  return term_with_min(b, y, isum, summins);
}

float q6_k_term(const BlockQ6_K& b, const ActQ8_K& y) {
  int q[256];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      q[128 * h + l] = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
      q[128 * h + l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      q[128 * h + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      q[128 * h + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
  }
  int32_t isum = 0;
  for (int g = 0; g < 16; ++g) {
    int32_t dot = 0;
    for (int l = 0; l < 16; ++l) dot += q[16 * g + l] * y.qs[16 * g + l];
    isum += b.scales[g] * dot;
  }
  return y.d * fp16_to_fp32(b.d) * float(isum);
}

float q3_k_term(const BlockQ3_K& b, const ActQ8_K& y) {
  int32_t isum = 0;
  for (int k = 0; k < 16; ++k) {
    const int low4 = k < 8 ? (b.scales[k] & 15) : (b.scales[k - 8] >> 4);
    const int high2 = (b.scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    const int scale = (low4 | (high2 << 4)) - 32;
    // Elements 16k..16k+15: half h = k/8, shift j = (k/2)%4, bytes 16·(k%2) + l of the half.
    const int h = k / 8, j = (k / 2) % 4, off = 16 * (k % 2);
    const uint8_t hbit = uint8_t(1u << (4 * h + j));
    int32_t dot = 0;
    for (int l = 0; l < 16; ++l) {
      const int v = ((b.qs[32 * h + off + l] >> (2 * j)) & 3) - ((b.hmask[off + l] & hbit) ? 0 : 4);
      dot += v * y.qs[16 * k + l];
    }
    isum += scale * dot;
  }
  return y.d * fp16_to_fp32(b.d) * float(isum);
}

float q2_k_term(const BlockQ2_K& b, const ActQ8_K& y) {
  int32_t isum = 0, summins = 0;
  for (int k = 0; k < 16; ++k) {
    const int h = k / 8, j = (k / 2) % 4, off = 16 * (k % 2);
    int32_t dot = 0;
    for (int l = 0; l < 16; ++l) dot += ((b.qs[32 * h + off + l] >> (2 * j)) & 3) * y.qs[16 * k + l];
    isum += (b.scales[k] & 15) * dot;
    summins += (b.scales[k] >> 4) * y.bsums[k];
  }
  return term_with_min(b, y, isum, summins);
}

// ---- IQ and TQ super-blocks against Q8_K ----
// ggml's integer sums per 256-block, from the block's integer form (tensor/quants_iq.h):
//   isum   = Σ_g scale[g] · Σ_{j in sub-block g} q_j · y_j
//   idelta = Σ_g scale[g] · Σ_{8-groups k of g} delta_k · Σ_{j in k} y_j     (IQ1_S, IQ1_M)
// both exact in int32 (|isum| < 2^28), then one float step per block in ggml's order,
//   acc += (d_w · d_y) · isum        or   acc += (d_w · d_y) · (isum + 1/8 · idelta),
// and the type's constant factor once per row (1/8 for IQ2_*, 1/4 for IQ3_XXS). ggml's
// generic IQ4_XS kernel applies the float scale per 32 values instead; its x86 kernel sums
// the whole block in integers first, as here.
template <DType T>
float dot_iq_q8_k(int64_t n, const uint8_t* w, const uint8_t* x) {
  const auto* bx = reinterpret_cast<const ActQ8_K*>(x);
  const size_t block_bytes = dtype_info(T).block_bytes;
  iq::BlockInts b;
  float acc = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i) {
    iq::decode(T, w + size_t(i) * block_bytes, &b);
    const ActQ8_K& y = bx[i];
    int32_t isum = 0;
    for (int g = 0; g < 256 / b.group; ++g) {
      int32_t dot = 0;
      for (int j = g * b.group; j < (g + 1) * b.group; ++j) dot += b.q[j] * y.qs[j];
      isum += b.scale[g] * dot;
    }
    const float d = b.d * y.d;
    if (b.has_delta) {
      int32_t idelta = 0;
      for (int k = 0; k < 32; ++k) {
        int32_t ysum = 0;
        for (int j = 8 * k; j < 8 * k + 8; ++j) ysum += y.qs[j];
        idelta += b.scale[8 * k / b.group] * b.delta[k] * ysum;
      }
      acc += d * (float(isum) + iq::kIq1Delta * float(idelta));
    } else {
      acc += d * float(isum);
    }
  }
  return acc * iq::dot_row_factor(T);
}

// ---- 32-element blocks against Q8_0 / Q8_1 activations ----
// Q4_1 / Q5_1 hold unsigned values with a min; the min meets the activation sum s.

template <typename Block>
float dot_block32(int64_t n, const uint8_t* w, const uint8_t* x) {
  using Act = std::conditional_t<kBlockHasMin<Block>, ActQ8_1, ActQ8_0>;
  const auto* bw = reinterpret_cast<const Block*>(w);
  const auto* bx = reinterpret_cast<const Act*>(x);
  float acc = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    int q[32];
    block_levels(bw[b], q);
    int32_t sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += q[j] * bx[b].qs[j];
    if constexpr (kBlockHasMin<Block>)
      acc += block_step(bw[b]) * fp16_to_fp32(bx[b].d) * float(sumi) + fp16_to_fp32(bw[b].m) * fp16_to_fp32(bx[b].s);
    else
      acc += block_step(bw[b]) * fp16_to_fp32(bx[b].d) * float(sumi);
  }
  return acc;
}

// ---- float types ----

// Products i summed in eight float lanes (i mod 8, the tail in lane 0), the lanes added
// pairwise at the end.
template <typename Product>
float sum_in_8_lanes(int64_t n, Product product) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += product(i + k);
  for (; i < n; ++i) acc[0] += product(i);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float ref_dot_f32(const float* a, const float* b, int64_t n) {
  return sum_in_8_lanes(n, [&](int64_t i) { return a[i] * b[i]; });
}

float dot_f32_rows(int64_t n, const uint8_t* w, const uint8_t* x) {
  return ref_dot_f32(reinterpret_cast<const float*>(w), reinterpret_cast<const float*>(x), n);
}

template <float (*Cvt)(uint16_t)>
float dot_half_rows(int64_t n, const uint8_t* w, const uint8_t* x) {
  return sum_in_8_lanes(n, [&](int64_t i) { return Cvt(load_u16(w + 2 * i)) * Cvt(load_u16(x + 2 * i)); });
}

float bf16_cvt(uint16_t v) { return bf16_to_fp32(v); }

// ---- vector helpers ----

void ref_axpy_f32(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
void ref_scale_f32(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}
float ref_sum_squares_f32(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return float(s);
}

void ref_attn_scores(const float* q, int64_t q_stride, int64_t n_q, const float* k, int64_t k_stride, int64_t n_k,
                     int64_t d, float scale, float* s, int64_t s_stride) {
  for (int64_t r = 0; r < n_q; ++r)
    for (int64_t j = 0; j < n_k; ++j) s[r * s_stride + j] = ref_dot_f32(q + r * q_stride, k + j * k_stride, d) * scale;
}

float ref_exp_shift_sum(float* s, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = exp_poly(s[j] - m);
    sum += s[j];
  }
  return sum;
}

void ref_swiglu_f32(const float* gate, const float* up, float limit, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], u = up[i];
    const float s = g / (1.0f + exp_poly(-g));
    out[i] = limit > 1e-6f ? std::fmin(s, limit) * std::fmin(std::fmax(u, -limit), limit) : s * u;
  }
}

void ref_gemm_acc_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                      int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const float aip = a[i * a_rs + p * a_cs];
      const float* bp = b + p * ldb;
      float* ci = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) ci[j] = std::fma(aip, bp[j], ci[j]);
    }
}

IsaKernels make_scalar() {
  IsaKernels k;
  k.vec_dot[int(DType::F32)] = dot_f32_rows;
  k.vec_dot[int(DType::F16)] = dot_half_rows<fp16_to_fp32>;
  k.vec_dot[int(DType::BF16)] = dot_half_rows<bf16_cvt>;
  k.vec_dot[int(DType::Q8_0)] = dot_block32<BlockQ8_0>;
  k.vec_dot[int(DType::Q4_0)] = dot_block32<BlockQ4_0>;
  k.vec_dot[int(DType::Q5_0)] = dot_block32<BlockQ5_0>;
  k.vec_dot[int(DType::MXFP4)] = dot_block32<BlockMXFP4>;
  k.vec_dot[int(DType::Q4_1)] = dot_block32<BlockQ4_1>;
  k.vec_dot[int(DType::Q5_1)] = dot_block32<BlockQ5_1>;
  k.vec_dot[int(DType::Q2_K)] = dot_k_blocks<BlockQ2_K, q2_k_term>;
  k.vec_dot[int(DType::Q3_K)] = dot_k_blocks<BlockQ3_K, q3_k_term>;
  k.vec_dot[int(DType::Q4_K)] = dot_k_blocks<BlockQ4_K, q4_q5_k_term<BlockQ4_K>>;
  k.vec_dot[int(DType::Q5_K)] = dot_k_blocks<BlockQ5_K, q4_q5_k_term<BlockQ5_K>>;
  k.vec_dot[int(DType::Q6_K)] = dot_k_blocks<BlockQ6_K, q6_k_term>;
  k.vec_dot[int(DType::IQ4_NL)] = dot_block32<BlockIQ4_NL>;
  k.vec_dot[int(DType::IQ2_XXS)] = dot_iq_q8_k<DType::IQ2_XXS>;
  k.vec_dot[int(DType::IQ2_XS)] = dot_iq_q8_k<DType::IQ2_XS>;
  k.vec_dot[int(DType::IQ2_S)] = dot_iq_q8_k<DType::IQ2_S>;
  k.vec_dot[int(DType::IQ3_XXS)] = dot_iq_q8_k<DType::IQ3_XXS>;
  k.vec_dot[int(DType::IQ3_S)] = dot_iq_q8_k<DType::IQ3_S>;
  k.vec_dot[int(DType::IQ1_S)] = dot_iq_q8_k<DType::IQ1_S>;
  k.vec_dot[int(DType::IQ1_M)] = dot_iq_q8_k<DType::IQ1_M>;
  k.vec_dot[int(DType::IQ4_XS)] = dot_iq_q8_k<DType::IQ4_XS>;
  k.vec_dot[int(DType::TQ1_0)] = dot_iq_q8_k<DType::TQ1_0>;
  k.vec_dot[int(DType::TQ2_0)] = dot_iq_q8_k<DType::TQ2_0>;
  k.dot_f32 = ref_dot_f32;
  k.axpy_f32 = ref_axpy_f32;
  k.scale_f32 = ref_scale_f32;
  k.sum_squares_f32 = ref_sum_squares_f32;
  k.attn_scores = ref_attn_scores;
  k.exp_shift_sum = ref_exp_shift_sum;
  k.gemm_acc_f32 = ref_gemm_acc_f32;
  k.swiglu_f32 = ref_swiglu_f32;
  k.kv_scores = ref_kv_scores;
  k.kv_exp_sum = ref_kv_exp_sum;
  k.quantize_q8_0 = quantize_act_q8_0;
  k.quantize_q8_1 = quantize_act_q8_1;
  k.quantize_q8_K = quantize_act_q8_K;
  k.kv_max = ref_kv_max;
  k.kv_accumulate = ref_kv_accumulate;
  return k;
}

}  // namespace

const IsaKernels& scalar_kernels() {
  static const IsaKernels k = make_scalar();
  return k;
}

}  // namespace step35::kernels
