// K-quant encoders (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), bit-exact with ggml's reference
// quantizers as llama-quantize runs them when no importance matrix is given.
//
// How a super-block of 256 is encoded, common to all five types:
//   1. each sub-block (16 or 32 elements) gets its own best float scale (and, for the
//      "affine" types Q2_K/Q4_K/Q5_K, a min) by a small search, minimising a weighted
//      squared (Q4_K/Q5_K) or absolute (Q2_K) error;
//   2. those per-sub-block floats are themselves quantized to 4/6/8-bit integers against
//      one f16 super-scale d (and dmin);
//   3. every element is re-quantized against the now *rounded* sub-block scale
//      d_f16·sc (and dmin_f16·m), which is what a decoder will multiply by.
// Bytes only match llama-quantize if every float operation happens in the same order and
// precision, so the expressions below keep the reference's evaluation order (left to
// right, one float rounding per operation, no fused multiply-add: this file is compiled
// with -ffp-contract=off, see CMakeLists.txt) and its rounding helper (ties to even).
// The scalar searches are the reference (quantize_row_*_ref); the same searches run four
// sub-blocks per vector instruction for quantize_row_fast, lane by lane identical.
// Block layouts: docs/architecture.md, "Weight types and block layouts" (the decoders are
// in quants.cpp).
#include "tensor/quants_kquant_encode.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "tensor/fp16.h"
#include "tensor/quant_rounding.h"
#include "tensor/quants.h"
#include "tensor/quants_iq.h"
#include "tensor/type_traits.h"

namespace step35 {

namespace {

constexpr int kSuperBlock = 256;
// Sub-block maxima below this count as an all-zero sub-block.
constexpr float kZeroGroupMax = 1e-15f;

inline int clamp_int(int v, int lo, int hi) { return std::min(std::max(v, lo), hi); }

// ---- sub-block scale searches ------------------------------------------------------------

// Affine fit x ≈ scale·q + min, q in [0, nmax], min <= 0 (the caller stores -min >= 0).
// Starts from the plain min/max mapping, then tries nstep+1 candidate inverse scales
// (nmax + rmin + rdelta·k) / (max - min); for each it rounds, solves the weighted
// least-squares scale and min for those levels, and keeps the candidate with the lowest
// weighted error (absolute if use_abs_error, else squared). q receives the chosen levels.
struct AffineSearch {
  int nmax;
  float rmin;
  float rdelta;
  int nstep;
  bool use_abs_error;
};

float fit_affine(int n, const float* x, const float* w, const AffineSearch& s, uint8_t* q, float* neg_min) {
  float lo = x[0];
  float hi = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < lo) lo = x[i];
    if (x[i] > hi) hi = x[i];
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;  // the decoder subtracts a non-negative offset: min is at most 0
  if (hi == lo) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    *neg_min = -lo;
    return 0.0f;
  }
  auto error_of = [&](float diff) { return s.use_abs_error ? std::fabs(diff) : diff * diff; };

  float inv_scale = float(s.nmax) / (hi - lo);
  float scale = 1 / inv_scale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    q[i] = uint8_t(clamp_int(nearest_int(inv_scale * (x[i] - lo)), 0, s.nmax));
    const float diff = scale * float(q[i]) + lo - x[i];
    best_error += w[i] * error_of(diff);
  }
  if (s.nstep < 1) {
    *neg_min = -lo;
    return scale;
  }
  uint8_t trial[32];
  for (int step = 0; step <= s.nstep; ++step) {
    inv_scale = (s.rmin + s.rdelta * float(step) + float(s.nmax)) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(inv_scale * (x[i] - lo)), 0, s.nmax);
      trial[i] = uint8_t(l);
      const float fl = float(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    // Weighted least squares for x ≈ a·l + b over the trial levels.
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float trial_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float trial_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (trial_min > 0) {  // not representable: pin min to 0 and refit the scale alone
        trial_min = 0;
        trial_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = trial_scale * float(trial[i]) + trial_min - x[i];
        error += w[i] * error_of(diff);
      }
      if (error < best_error) {
        for (int i = 0; i < n; ++i) q[i] = trial[i];
        best_error = error;
        scale = trial_scale;
        lo = trial_min;
      }
    }
  }
  *neg_min = -lo;
  return scale;
}

// Levels l = round(inv_scale·x) clamped to [-nmax, nmax-1], stored biased by `bias` in q, and
// their weighted sums Σw·x·l and Σw·l² with w = x².
struct LevelSums {
  float lx = 0;
  float l2 = 0;
};

LevelSums symmetric_levels(int n, const float* x, float inv_scale, int nmax, int bias, int8_t* q) {
  LevelSums sums;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(inv_scale * x[i]), -nmax, nmax - 1);
    q[i] = int8_t(l + bias);
    const float w = x[i] * x[i];
    sums.lx += w * x[i] * float(l);
    sums.l2 += w * float(l) * float(l);
  }
  return sums;
}

// The first step of both symmetric fits: the element of largest magnitude maps to -nmax.
// An all-zero sub-block (largest magnitude below kZeroGroupMax) gives signed_max 0 and
// zeroed levels.
struct SymmetricStart {
  float signed_max = 0;
  LevelSums sums;
};

SymmetricStart symmetric_start(int n, const float* x, int nmax, int bias, int8_t* q) {
  const SignedAbsMax peak = signed_absmax(x, n);
  if (peak.abs < kZeroGroupMax) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return {};
  }
  return {peak.value, symmetric_levels(n, x, float(-nmax) / peak.value, nmax, bias, q)};
}

// Symmetric fit x ≈ scale·(q - nmax), q - nmax in [-nmax, nmax-1], for Q6_K. The scale's
// sign follows the element of largest magnitude so that element maps to -nmax (the side
// with one more level). Least-squares scale weighted by x², then 18 nearby inverse scales
// (nmax ± 0.1k, k = 1..9); keeps the one maximising (Σw·x·l)² / Σw·l², i.e. the smallest
// weighted squared error at its optimal scale. q receives the levels biased by +nmax
// (all zeros for an all-zero sub-block).
float fit_symmetric_q6(int n, const float* x, int8_t* q) {
  constexpr int nmax = 32;
  const SymmetricStart start = symmetric_start(n, x, nmax, nmax, q);
  if (start.signed_max == 0) return 0.0f;
  const float signed_max = start.signed_max;
  LevelSums sums = start.sums;
  float scale = sums.l2 != 0 ? sums.lx / sums.l2 : 0.0f;
  float best = scale * sums.lx;
  int8_t trial[kSuperBlock];
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    sums = symmetric_levels(n, x, -(float(nmax) + 0.1f * float(k)) / signed_max, nmax, nmax, trial);
    if (sums.l2 > 0 && sums.lx * sums.lx > best * sums.l2) {
      for (int i = 0; i < n; ++i) q[i] = trial[i];
      scale = sums.lx / sums.l2;
      best = scale * sums.lx;
    }
  }
  return scale;
}

// Symmetric fit for Q3_K (levels -4..3, weights x²): start from the max-magnitude mapping,
// then up to five passes of coordinate descent, moving one element at a time to the level
// that is optimal given all the others, whenever that raises (Σw·x·l)² / Σw·l².
// q receives the levels biased by +4 (all zeros for an all-zero sub-block).
float fit_symmetric_q3(int n, const float* x, int8_t* q) {
  constexpr int nmax = 4;
  const SymmetricStart start = symmetric_start(n, x, nmax, 0, q);
  if (start.signed_max == 0) return 0.0f;
  float sum_lx = start.sums.lx, sum_l2 = start.sums.l2;
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      // The sums without element i.
      float lx = sum_lx - w * x[i] * float(q[i]);
      if (lx > 0) {
        float l2 = sum_l2 - w * float(q[i]) * float(q[i]);
        const int candidate = clamp_int(nearest_int(x[i] * l2 / lx), -nmax, nmax - 1);
        if (candidate != q[i]) {
          lx += w * x[i] * float(candidate);
          l2 += w * float(candidate) * float(candidate);
          if (l2 > 0 && lx * lx * sum_l2 > sum_lx * sum_lx * l2) {
            q[i] = int8_t(candidate);
            sum_lx = lx;
            sum_l2 = l2;
            ++changed;
          }
        }
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) q[i] = int8_t(q[i] + nmax);
  return sum_l2 > 0.0f ? sum_lx / sum_l2 : 0.0f;
}

// ---- the same searches, several sub-blocks at a time ----------------------------------------
// Lane j of a vector works on sub-block j: x[i][j] is element i of sub-block j. Every lane
// performs exactly the float operations of the scalar search above, in the same order
// (lanes never mix; selects replace branches), so the results are identical, while one
// vector instruction advances four sub-blocks (GCC/Clang vector extensions, 16-byte
// vectors: SSE2 on a baseline x86-64 build, NEON on ARM). Lanes the scalar code
// leaves early (all-equal or all-zero sub-blocks) compute throwaway values (possibly
// inf/NaN, never undefined behaviour) that are replaced at the end. quantize_row_fast uses
// these; the tests check it against quantize_row_ref.

// Four float / int32 lanes.
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));

template <typename F, typename I>
inline I round_nearest_lanes(F v) {
  return (std::bit_cast<I>(v + 12582912.0f) & 0x007fffff) - 0x00400000;
}

// |v| lane by lane (the sign bit cleared, as fabs).
inline F4 abs_lanes(F4 v) { return std::bit_cast<F4>(std::bit_cast<I4>(v) & 0x7fffffff); }

template <typename I>
inline I clamp_lanes(I v, int lo, int hi) {
  const I vlo = I{} + lo, vhi = I{} + hi;
  v = v < vlo ? vlo : v;
  return v > vhi ? vhi : v;
}

template <bool kAbsError>
void fit_affine_lanes(const F4* x, const F4* w, int len, const AffineSearch& s, I4* q,
                      float* scale_out, float* neg_min_out) {
  using F = F4;
  using I = I4;
  constexpr int N = 4;
  auto error_of = [](F diff) {
    if constexpr (kAbsError)
      return abs_lanes(diff);
    else
      return diff * diff;
  };
  F lo = x[0], hi = x[0];
  const F sum_w0 = w[0];
  F sum_w = sum_w0, sum_x = sum_w0 * x[0];
  for (int i = 1; i < len; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  const F zero = F{};
  lo = lo > zero ? zero : lo;
  const I flat = hi == lo;
  const F flat_min = lo;

  F inv_scale = float(s.nmax) / (hi - lo);
  F scale = 1 / inv_scale;
  F best_error = zero;
  for (int i = 0; i < len; ++i) {
    q[i] = clamp_lanes(round_nearest_lanes<F, I>(inv_scale * (x[i] - lo)), 0, s.nmax);
    const F diff = scale * __builtin_convertvector(q[i], F) + lo - x[i];
    best_error += w[i] * error_of(diff);
  }
  I trial[32];
  for (int step = 0; step <= s.nstep; ++step) {
    inv_scale = (s.rmin + s.rdelta * float(step) + float(s.nmax)) / (hi - lo);
    F sum_l = zero, sum_l2 = zero, sum_xl = zero;
    for (int i = 0; i < len; ++i) {
      trial[i] = clamp_lanes(round_nearest_lanes<F, I>(inv_scale * (x[i] - lo)), 0, s.nmax);
      const F fl = __builtin_convertvector(trial[i], F);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const F det = sum_w * sum_l2 - sum_l * sum_l;
    const F a = (sum_w * sum_xl - sum_x * sum_l) / det;
    const F b = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    const I pin = b > zero;  // min would be positive: pinned to 0, scale refitted alone
    const F trial_scale = pin ? sum_xl / sum_l2 : a;
    const F trial_min = pin ? zero : b;
    F error = zero;
    for (int i = 0; i < len; ++i) {
      const F diff = trial_scale * __builtin_convertvector(trial[i], F) + trial_min - x[i];
      error += w[i] * error_of(diff);
    }
    const I better = (det > zero) & (error < best_error);
    best_error = better ? error : best_error;
    scale = better ? trial_scale : scale;
    lo = better ? trial_min : lo;
    for (int i = 0; i < len; ++i) q[i] = better ? trial[i] : q[i];
  }
  for (int i = 0; i < len; ++i) q[i] = flat ? I{} : q[i];
  for (int j = 0; j < N; ++j) {
    scale_out[j] = flat[j] ? 0.0f : scale[j];
    neg_min_out[j] = flat[j] ? -flat_min[j] : -lo[j];
  }
}

// symmetric_levels for four sub-blocks at once, the levels biased by +nmax.
struct LaneSums {
  F4 lx = F4{};
  F4 l2 = F4{};
};

LaneSums symmetric_levels_lanes(const F4* x, int len, F4 inv_scale, int nmax, I4* q) {
  LaneSums sums;
  for (int i = 0; i < len; ++i) {
    const I4 l = clamp_lanes(round_nearest_lanes<F4, I4>(inv_scale * x[i]), -nmax, nmax - 1);
    q[i] = l + nmax;
    const F4 fl = __builtin_convertvector(l, F4);
    const F4 w = x[i] * x[i];
    sums.lx += w * x[i] * fl;
    sums.l2 += w * fl * fl;
  }
  return sums;
}

// fit_symmetric_q6 for four sub-blocks of 16 at once; q receives the biased levels.
void fit_symmetric_q6_lanes(const F4* x, I4* q, float* scale_out) {
  using F = F4;
  using I = I4;
  constexpr int nmax = 32, len = 16;
  const F zero = F{};
  F amax = zero, signed_max = zero;
  for (int i = 0; i < len; ++i) {
    const F ax = abs_lanes(x[i]);
    const I larger = ax > amax;
    amax = larger ? ax : amax;
    signed_max = larger ? x[i] : signed_max;
  }
  LaneSums sums = symmetric_levels_lanes(x, len, float(-nmax) / signed_max, nmax, q);
  F scale = sums.l2 != zero ? sums.lx / sums.l2 : zero;
  F best = scale * sums.lx;
  I trial[len];
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    sums = symmetric_levels_lanes(x, len, -(float(nmax) + 0.1f * float(k)) / signed_max, nmax, trial);
    const I better = (sums.l2 > zero) & (sums.lx * sums.lx > best * sums.l2);
    const F s = sums.lx / sums.l2;
    scale = better ? s : scale;
    best = better ? s * sums.lx : best;
    for (int i = 0; i < len; ++i) q[i] = better ? trial[i] : q[i];
  }
  const I all_zero = amax < kZeroGroupMax;
  for (int i = 0; i < len; ++i) q[i] = all_zero ? I{} : q[i];
  for (int j = 0; j < 4; ++j) scale_out[j] = all_zero[j] ? 0.0f : scale[j];
}

// ---- stage 1 (per-sub-block fits) of each encoder, scalar or lane-parallel --------------

// Four consecutive sub-blocks of len elements as len vectors: lane j of xt[i] is element i of
// sub-block j.
void load_lanes(const float* x, int len, F4* xt) {
  for (int i = 0; i < len; ++i)
    for (int j = 0; j < 4; ++j) xt[i][j] = x[len * j + i];
}

// The inverse for the levels: lane j of qt[i] back to L[len·j + i].
template <typename Level>
void store_lanes(const I4* qt, int len, Level* L) {
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < len; ++i) L[len * j + i] = Level(qt[i][j]);
}

// The affine fits of n_sub sub-blocks of kLen, four at a time: weights(xt, wt) gives the
// weights of four transposed sub-blocks.
template <bool kAbsError, int kLen, typename Weights>
void fit_affine_subblocks_lanes(const float* x, int n_sub, const AffineSearch& search, uint8_t* L, float* scales,
                                float* mins, Weights weights) {
  for (int g = 0; g < n_sub / 4; ++g) {  // sub-blocks 4g .. 4g+3
    F4 xt[kLen], wt[kLen];
    load_lanes(x + 4 * kLen * g, kLen, xt);
    weights(xt, wt);
    I4 qt[kLen];
    fit_affine_lanes<kAbsError>(xt, wt, kLen, search, qt, scales + 4 * g, mins + 4 * g);
    store_lanes(qt, kLen, L + 4 * kLen * g);
  }
}

// Q4_K/Q5_K: eight sub-blocks of 32, weights = the sub-block's rms plus each element's
// magnitude (large values matter more). Fills L[256], scales[8], mins[8].
template <bool kLanes>
void fit_k4_subblocks(const float* x, const AffineSearch& search, uint8_t* L, float* scales, float* mins) {
  if constexpr (!kLanes) {
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
      const float rms = std::sqrt(sum_x2 / 32);
      float w[32];
      for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
      scales[j] = fit_affine(32, xs, w, search, L + 32 * j, &mins[j]);
    }
  } else {
    fit_affine_subblocks_lanes<false, 32>(x, 8, search, L, scales, mins, [](const F4* xt, F4* wt) {
      F4 sum_x2 = F4{};
      for (int i = 0; i < 32; ++i) sum_x2 += xt[i] * xt[i];
      F4 rms;
      for (int j = 0; j < 4; ++j) rms[j] = std::sqrt(sum_x2[j] / 32);
      for (int i = 0; i < 32; ++i) wt[i] = rms + abs_lanes(xt[i]);
    });
  }
}

// Q2_K: sixteen sub-blocks of 16, weights |x|, absolute error.
template <bool kLanes>
void fit_q2_subblocks(const float* x, const AffineSearch& search, uint8_t* L, float* scales, float* mins) {
  if constexpr (!kLanes) {
    for (int j = 0; j < 16; ++j) {
      float w[16];
      for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
      scales[j] = fit_affine(16, x + 16 * j, w, search, L + 16 * j, &mins[j]);
    }
  } else {
    fit_affine_subblocks_lanes<true, 16>(x, 16, search, L, scales, mins, [](const F4* xt, F4* wt) {
      for (int i = 0; i < 16; ++i) wt[i] = abs_lanes(xt[i]);
    });
  }
}

// Q6_K: sixteen sub-blocks of 16.
template <bool kLanes>
void fit_q6_subblocks(const float* x, int8_t* L, float* scales) {
  if constexpr (!kLanes) {
    for (int j = 0; j < 16; ++j) scales[j] = fit_symmetric_q6(16, x + 16 * j, L + 16 * j);
  } else {
    for (int g = 0; g < 4; ++g) {  // sub-blocks 4g .. 4g+3
      const float* xg = x + 64 * g;
      F4 xt[16];
      load_lanes(xg, 16, xt);
      I4 qt[16];
      fit_symmetric_q6_lanes(xt, qt, scales + 4 * g);
      store_lanes(qt, 16, L + 64 * g);
    }
  }
}

// The largest of n sub-block scales and of their mins, each at least 0.
std::pair<float, float> largest_scale_and_min(const float* scales, const float* mins, int n) {
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < n; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  return {max_scale, max_min};
}

// ---- Q4_K / Q5_K: eight sub-blocks of 32, 6-bit scale and min each -----------------------

// Packs 6-bit scales sc[8] and mins m[8] into the 12 bytes architecture.md "Weight types and block
// layouts" describes (the inverse of the decoder's unpacking: sub-blocks 0..3 in the low 6 bits of
// bytes 0..7, sub-blocks 4..7 as nibbles in bytes 8..11 with their top 2 bits in bits 6..7 of bytes
// 0..7).
void pack_k4_scales(const uint8_t* sc, const uint8_t* m, uint8_t* out) {
  for (int b = 0; b < 4; ++b) {
    out[b] = sc[b];
    out[b + 4] = m[b];
  }
  for (int b = 4; b < 8; ++b) {
    out[b + 4] = uint8_t((sc[b] & 15) | ((m[b] & 15) << 4));
    out[b - 4] |= uint8_t((sc[b] >> 4) << 6);
    out[b] |= uint8_t((m[b] >> 4) << 6);
  }
}

// Steps 1-3 for one Q4_K/Q5_K super-block: fills d, dmin, the packed scales and the final
// levels L[256] in [0, nmax].
template <bool kLanes>
void encode_k4_scales_and_levels(const float* x, const AffineSearch& search, uint16_t* d_out, uint16_t* dmin_out,
                                 uint8_t* packed_scales, uint8_t* L) {
  float scales[8], mins[8];
  fit_k4_subblocks<kLanes>(x, search, L, scales, mins);
  const auto [max_scale, max_min] = largest_scale_and_min(scales, mins, 8);
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    // Narrowed to 8 bits before the clamp, as the reference does (only a negative scale,
    // which the search can return for degenerate data, wraps).
    sc[j] = uint8_t(nearest_int(inv_scale * scales[j]));
    m[j] = uint8_t(nearest_int(inv_min * mins[j]));
    if (sc[j] > 63) sc[j] = 63;
    if (m[j] > 63) m[j] = 63;
  }
  pack_k4_scales(sc, m, packed_scales);
  *d_out = fp32_to_fp16(max_scale / 63.f);
  *dmin_out = fp32_to_fp16(max_min / 63.f);

  // Re-quantize against the scales a decoder will actually use.
  const int nmax = search.nmax;
  for (int j = 0; j < 8; ++j) {
    const float d = fp16_to_fp32(*d_out) * float(sc[j]);
    if (d == 0) continue;  // keeps the search's levels (all decode to -dmin·m anyway)
    const float dm = fp16_to_fp32(*dmin_out) * float(m[j]);
    for (int l = 0; l < 32; ++l) L[32 * j + l] = uint8_t(clamp_int(nearest_int((x[32 * j + l] + dm) / d), 0, nmax));
  }
}

template <bool kLanes>
void encode_q4_k(const float* x, BlockQ4_K* y) {
  static constexpr AffineSearch kSearch{15, -1.0f, 0.1f, 20, false};
  uint8_t L[kSuperBlock];
  encode_k4_scales_and_levels<kLanes>(x, kSearch, &y->d, &y->dmin, y->scales, L);
  // Chunk c of 64 elements: first 32 in the low nibbles of qs[32c..], next 32 in the high.
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) y->qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

template <bool kLanes>
void encode_q5_k(const float* x, BlockQ5_K* y) {
  static constexpr AffineSearch kSearch{31, -0.5f, 0.1f, 15, false};
  uint8_t L[kSuperBlock];
  encode_k4_scales_and_levels<kLanes>(x, kSearch, &y->d, &y->dmin, y->scales, L);
  // As Q4_K for the low 4 bits; bit 4 of chunk c's two halves goes to bits 2c, 2c+1 of qh[l].
  std::memset(y->qh, 0, sizeof y->qh);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = L[64 * c + l], hi = L[64 * c + 32 + l];
      y->qs[32 * c + l] = uint8_t((lo & 15) | ((hi & 15) << 4));
      y->qh[l] |= uint8_t(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

// ---- Q6_K: sixteen sub-blocks of 16, signed 8-bit scales ---------------------------------

template <bool kLanes>
void encode_q6_k(const float* x, BlockQ6_K* y) {
  int8_t L[kSuperBlock];
  float scales[16];
  fit_q6_subblocks<kLanes>(x, L, scales);
  const SignedAbsMax peak = signed_absmax(scales, 16);
  const float max_scale = peak.value;
  if (peak.abs < kZeroGroupMax) {  // an all-zero super-block is all-zero bytes
    std::memset(y, 0, sizeof *y);
    y->d = fp32_to_fp16(0.f);
    return;
  }
  // The largest scale maps to -128 so its sign is carried by d.
  const float inv_scale = -128.f / max_scale;
  y->d = fp32_to_fp16(1 / inv_scale);
  for (int j = 0; j < 16; ++j) {
    const int s = nearest_int(inv_scale * scales[j]);
    y->scales[j] = int8_t(s < 127 ? s : 127);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_fp32(y->d) * float(y->scales[j]);
    if (d == 0) continue;
    for (int l = 0; l < 16; ++l) L[16 * j + l] = int8_t(clamp_int(nearest_int(x[16 * j + l] / d), -32, 31) + 32);
  }
  // Half h (128 elements): element 32g + l (group g = 0..3) has its low nibble in
  // ql[64h + l + 32·(g&1)] (low nibble for g < 2, high for g >= 2) and its top two bits
  // in bits 2g..2g+1 of qh[32h + l].
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
      y->ql[64 * h + l] = uint8_t((q1 & 15) | ((q3 & 15) << 4));
      y->ql[64 * h + l + 32] = uint8_t((q2 & 15) | ((q4 & 15) << 4));
      y->qh[32 * h + l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
}

// ---- Q2_K / Q3_K: sixteen sub-blocks of 16, 2-bit levels ---------------------------------

// Packs 256 2-bit values: half h, element 32g + l (g = 0..3) goes to bits 2g..2g+1 of
// qs[32h + l]. Q3_K keeps its third bit in hmask.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* Lh = L + 128 * h;
    for (int l = 0; l < 32; ++l)
      qs[32 * h + l] = uint8_t(Lh[l] | (Lh[l + 32] << 2) | (Lh[l + 64] << 4) | (Lh[l + 96] << 6));
  }
}

template <bool kLanes>
void encode_q2_k(const float* x, BlockQ2_K* y) {
  static constexpr AffineSearch kSearch{3, -0.5f, 0.1f, 15, true};
  uint8_t L[kSuperBlock];
  float scales[16], mins[16];
  fit_q2_subblocks<kLanes>(x, kSearch, L, scales, mins);
  const auto [max_scale, max_min] = largest_scale_and_min(scales, mins, 16);
  // 4-bit scale in the low nibble, 4-bit min in the high nibble of each scales byte.
  if (max_scale > 0) {
    const float inv = 15.f / max_scale;
    for (int j = 0; j < 16; ++j) y->scales[j] = uint8_t(nearest_int(inv * scales[j]));
    y->d = fp32_to_fp16(max_scale / 15.f);
  } else {
    for (int j = 0; j < 16; ++j) y->scales[j] = 0;
    y->d = fp32_to_fp16(0.f);
  }
  if (max_min > 0) {
    const float inv = 15.f / max_min;
    for (int j = 0; j < 16; ++j) y->scales[j] |= uint8_t(uint32_t(nearest_int(inv * mins[j])) << 4);
    y->dmin = fp32_to_fp16(max_min / 15.f);
  } else {
    y->dmin = fp32_to_fp16(0.f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_fp32(y->d) * float(y->scales[j] & 15);
    if (d == 0) continue;
    const float dm = fp16_to_fp32(y->dmin) * float(y->scales[j] >> 4);
    for (int l = 0; l < 16; ++l) L[16 * j + l] = uint8_t(clamp_int(nearest_int((x[16 * j + l] + dm) / d), 0, 3));
  }
  pack_2bit(L, y->qs);
}

void encode_q3_k(const float* x, BlockQ3_K* y) {
  int8_t L[kSuperBlock];
  float scales[16];
  for (int j = 0; j < 16; ++j) scales[j] = fit_symmetric_q3(16, x + 16 * j, L + 16 * j);
  const float max_scale = signed_absmax(scales, 16).value;
  // Sixteen 6-bit scales (biased by 32): low nibbles in bytes 0..7 (sub-blocks 0..7 low
  // nibble, 8..15 high nibble), top two bits of sub-block k in bits 2(k/4) of byte 8 + k%4.
  int sc[16] = {};  // the signed 6-bit scales as a decoder reads them back
  std::memset(y->scales, 0, sizeof y->scales);
  if (max_scale != 0) {
    const float inv_scale = -32.f / max_scale;
    for (int j = 0; j < 16; ++j) {
      // Narrowed to 8 bits before the clamp, as the reference does.
      const int8_t r = int8_t(nearest_int(inv_scale * scales[j]));
      const int biased = clamp_int(r, -32, 31) + 32;
      if (j < 8)
        y->scales[j] = uint8_t(biased & 15);
      else
        y->scales[j - 8] |= uint8_t((biased & 15) << 4);
      y->scales[8 + j % 4] |= uint8_t((biased >> 4) << (2 * (j / 4)));
      sc[j] = biased - 32;
    }
    y->d = fp32_to_fp16(1 / inv_scale);
  } else {
    y->d = fp32_to_fp16(0.f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = fp16_to_fp32(y->d) * float(sc[j]);
    if (d == 0) continue;
    for (int l = 0; l < 16; ++l) L[16 * j + l] = int8_t(clamp_int(nearest_int(x[16 * j + l] / d), -4, 3) + 4);
  }
  // Level bit 2 goes to hmask: element e sets bit e/32 of hmask[e%32]; the low two bits
  // are packed like Q2_K.
  std::memset(y->hmask, 0, sizeof y->hmask);
  uint8_t low[kSuperBlock];
  for (int e = 0; e < kSuperBlock; ++e) {
    int v = L[e];
    if (v > 3) {
      y->hmask[e % 32] |= uint8_t(1u << (e / 32));
      v -= 4;
    }
    low[e] = uint8_t(v);
  }
  pack_2bit(low, y->qs);
}

template <typename Block, void (*Encode)(const float*, Block*)>
void encode_row(const float* src, void* dst, int64_t n) {
  Block* blocks = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / kSuperBlock; ++i) Encode(src + kSuperBlock * i, blocks + i);
}

}  // namespace

void quantize_row_q2_k_ref(const float* src, void* dst, int64_t n) { encode_row<BlockQ2_K, encode_q2_k<false>>(src, dst, n); }
void quantize_row_q3_k_ref(const float* src, void* dst, int64_t n) { encode_row<BlockQ3_K, encode_q3_k>(src, dst, n); }
void quantize_row_q4_k_ref(const float* src, void* dst, int64_t n) { encode_row<BlockQ4_K, encode_q4_k<false>>(src, dst, n); }
void quantize_row_q5_k_ref(const float* src, void* dst, int64_t n) { encode_row<BlockQ5_K, encode_q5_k<false>>(src, dst, n); }
void quantize_row_q6_k_ref(const float* src, void* dst, int64_t n) { encode_row<BlockQ6_K, encode_q6_k<false>>(src, dst, n); }

void quantize_row_q2_k_fast(const float* src, void* dst, int64_t n) { encode_row<BlockQ2_K, encode_q2_k<true>>(src, dst, n); }
void quantize_row_q4_k_fast(const float* src, void* dst, int64_t n) { encode_row<BlockQ4_K, encode_q4_k<true>>(src, dst, n); }
void quantize_row_q5_k_fast(const float* src, void* dst, int64_t n) { encode_row<BlockQ5_K, encode_q5_k<true>>(src, dst, n); }
void quantize_row_q6_k_fast(const float* src, void* dst, int64_t n) { encode_row<BlockQ6_K, encode_q6_k<true>>(src, dst, n); }

bool quantize_row_fast(DType t, const float* src, void* dst, int64_t n) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  if (tt && tt->quantize_fast && n >= 0 && n % tt->block_elems == 0) {
    tt->quantize_fast(src, dst, n);
    return true;
  }
  return quantize_row_ref(t, src, dst, n);  // no fast encoder, or a bad length
}

}  // namespace step35
