// Kernel dispatch: CPU feature detection, ISA selection (STEP35_ISA, force_isa), the
// activation converters and the matrix-product driver over the per-ISA dot products
// (kernels_ref.cpp, kernels_avx2.cpp, kernels_avx512.cpp).
#include "tensor/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "tensor/fp16.h"
#include "tensor/kernels_impl.h"
#include "tensor/repack.h"
#include "tensor/quants.h"

namespace step35::kernels {

namespace {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false, avx_vnni = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, vnni = false, bf16 = false;
  bool os_avx = false, os_avx512 = false;
};

CpuFeatures detect_cpu() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_avx = (lo & 0x6) == 0x6;            // XMM and YMM state
    f.os_avx512 = (lo & 0xE6) == 0xE6;       // plus opmask, ZMM0-15 upper halves, ZMM16-31
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.vnni = (c >> 11) & 1;
    const unsigned max_sub = a;
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx_vnni = (a >> 4) & 1;
      f.bf16 = (a >> 5) & 1;
    }
  }
#endif
  return f;
}

const CpuFeatures& cpu() {
  static const CpuFeatures f = detect_cpu();
  return f;
}

// One CPU feature a level needs: its name in messages, and whether this CPU has it.
struct Feature {
  const char* name;
  bool present;
};

// The features `isa` needs (the OS's saving of the vector state counts as one).
std::vector<Feature> features_needed(Isa isa) {
  const CpuFeatures& f = cpu();
  std::vector<Feature> v;
  if (isa == Isa::Scalar) return v;
  v = {{"avx (OS support)", f.os_avx}, {"avx2", f.avx2}, {"fma", f.fma}, {"f16c", f.f16c}};
  if (isa == Isa::Avx2Vnni) v.push_back({"avx-vnni", f.avx_vnni});
  if (isa >= Isa::Avx512) {
    v.insert(v.end(), {{"avx512 (OS support)", f.os_avx512},
                       {"avx512f", f.avx512f},
                       {"avx512bw", f.avx512bw},
                       {"avx512vl", f.avx512vl},
                       {"avx512dq", f.avx512dq}});
  }
  if (isa >= Isa::Avx512Vnni) v.push_back({"avx512-vnni", f.vnni});
  if (isa >= Isa::Avx512Bf16) v.push_back({"avx512-bf16", f.bf16});
  return v;
}

bool isa_available(Isa isa) { return missing_features(isa).empty(); }

// "LEVEL (the vector features this CPU has)".
std::string cpu_summary_of(Isa isa) {
  const CpuFeatures& f = cpu();
  std::string feats;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!feats.empty()) feats += ' ';
    feats += name;
  };
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx_vnni, "avx-vnni");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512dq, "avx512dq");
  add(f.vnni, "avx512-vnni");
  add(f.bf16, "avx512-bf16");
  return std::string(isa_name(isa)) + " (" + (feats.empty() ? "no vector extensions" : feats) + ")";
}

const IsaKernels& table_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512Bf16: return avx512_bf16_kernels();
    case Isa::Avx512Vnni: return avx512_vnni_kernels();
    case Isa::Avx512: return avx512_kernels();
    case Isa::Avx2Vnni: return avx2_vnni_kernels();
    case Isa::Avx2: return avx2_kernels();
    case Isa::Scalar: break;
  }
  return scalar_kernels();
}

// The level in use, chosen on first use (STEP35_ISA or the best available).
std::atomic<const IsaKernels*> g_table{nullptr};
std::atomic<Isa> g_isa{Isa::Scalar};
std::once_flag g_init;

void init_isa() {
  std::call_once(g_init, [] {
    Isa isa = available_isas().back();
    if (const char* env = std::getenv("STEP35_ISA"); env && *env) {
      isa = isa_from_name(env);
      const std::string missing = missing_features(isa);
      if (!missing.empty())
        throw std::invalid_argument(std::string("STEP35_ISA=") + env + ": this CPU lacks " + missing +
                                    " (it runs: " + cpu_summary_of(available_isas().back()) + ")");
    }
    g_isa.store(isa);
    g_table.store(&table_for(isa));
  });
}

const IsaKernels& active() {
  const IsaKernels* t = g_table.load(std::memory_order_acquire);
  if (t) return *t;
  init_isa();
  return *g_table.load();
}

}  // namespace

const IsaKernels& active_table() { return active(); }

namespace {

VecDotFn vec_dot_for(DType t) {
  const unsigned id = unsigned(t);
  if (id >= 40) return nullptr;
  VecDotFn f = active().vec_dot[id];
  return f ? f : scalar_kernels().vec_dot[id];
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx2Vnni: return "avx2-vnni";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Vnni: return "avx512-vnni";
    case Isa::Avx512Bf16: return "avx512-bf16";
  }
  return "?";
}

Isa isa_from_name(const std::string& name) {
  std::string names;
  for (Isa isa : kAllIsas) {
    if (name == isa_name(isa)) return isa;
    names += names.empty() ? "" : ", ";
    names += isa_name(isa);
  }
  throw std::invalid_argument("STEP35_ISA: expected one of " + names + ", got '" + name + "'");
}

std::string missing_features(Isa isa) {
  std::string missing;
  for (const Feature& f : features_needed(isa))
    if (!f.present) missing += std::string(missing.empty() ? "" : " ") + f.name;
  return missing;
}

std::vector<Isa> available_isas() {
  std::vector<Isa> v;
  for (Isa isa : kAllIsas)
    if (isa_available(isa)) v.push_back(isa);
  return v;
}

Isa active_isa() {
  active();
  return g_isa.load();
}

void force_isa(Isa isa) {
  if (!isa_available(isa))
    throw std::invalid_argument(std::string("force_isa: this CPU cannot run ") + isa_name(isa) + ": it lacks " +
                                missing_features(isa));
  init_isa();
  g_isa.store(isa);
  g_table.store(&table_for(isa), std::memory_order_release);
}

std::string cpu_summary() { return cpu_summary_of(active_isa()); }

// ---------------------------------------------------------------------------------------
// Activations

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

ActType act_type(DType weight, Precision p) {
  if (p == Precision::Exact) return ActType::F32;
  const TypeTraits* tt = type_traits(uint32_t(weight));
  if (!tt) throw std::invalid_argument("act_type: unsupported weight type");
  return tt->act;
}

namespace {

// Elements per block and bytes per block of each activation format.
void act_geometry(ActType t, int64_t* block, size_t* bytes) {
  switch (t) {
    case ActType::F32: *block = 1, *bytes = 4; return;
    case ActType::F16:
    case ActType::BF16: *block = 1, *bytes = 2; return;
    case ActType::Q8_0: *block = 32, *bytes = sizeof(ActQ8_0); return;
    case ActType::Q8_1: *block = 32, *bytes = sizeof(ActQ8_1); return;
    case ActType::Q8_K: *block = 256, *bytes = sizeof(ActQ8_K); return;
  }
  throw std::invalid_argument("unknown activation type");
}

// One row of n floats into `t` at dst.
void convert_row(ActType t, const float* x, int64_t n, uint8_t* dst) {
  switch (t) {
    case ActType::F32: std::memcpy(dst, x, size_t(n) * 4); return;
    case ActType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case ActType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(x[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case ActType::Q8_0: active().quantize_q8_0(x, reinterpret_cast<ActQ8_0*>(dst), n); return;
    case ActType::Q8_1: active().quantize_q8_1(x, reinterpret_cast<ActQ8_1*>(dst), n); return;
    case ActType::Q8_K: active().quantize_q8_K(x, reinterpret_cast<ActQ8_K*>(dst), n); return;
  }
}

}  // namespace

size_t act_row_bytes(ActType t, int64_t n) {
  int64_t block;
  size_t bytes;
  act_geometry(t, &block, &bytes);
  if (n < 0 || n % block != 0)
    throw std::invalid_argument(std::string("act_row_bytes: ") + std::to_string(n) + " is not a multiple of the " +
                                act_type_name(t) + " block size");
  return (size_t(n / block) * bytes + 63) / 64 * 64;
}

void convert_activations(ActType t, const float* x, int64_t n_rows, int64_t n, int64_t ld_x, uint8_t* dst) {
  const size_t rb = act_row_bytes(t, n);
  for (int64_t r = 0; r < n_rows; ++r) convert_row(t, x + r * ld_x, n, dst + size_t(r) * rb);
}

void rms_norm_convert(ActType t, const float* x, const float* w, float eps, int64_t n_rows, int64_t n, int64_t ld_x,
                      uint8_t* dst, float* normed) {
  const size_t rb = act_row_bytes(t, n);
  thread_local std::vector<float> row;
  row.resize(size_t(n));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * ld_x;
    const float scale = 1.0f / std::sqrt(sum_squares_f32(xr, n) / float(n) + eps);
    for (int64_t i = 0; i < n; ++i) row[size_t(i)] = xr[i] * scale * w[i];
    convert_row(t, row.data(), n, dst + size_t(r) * rb);
    if (normed) std::memcpy(normed + r * n, row.data(), size_t(n) * 4);
  }
}

void swiglu_convert(ActType t, const float* gate, const float* up, int64_t ld, float limit, int64_t n_rows, int64_t n,
                    uint8_t* dst) {
  const size_t rb = act_row_bytes(t, n);
  thread_local std::vector<float> row;
  row.resize(size_t(n));
  const IsaKernels& k = active();
  for (int64_t r = 0; r < n_rows; ++r) {
    k.swiglu_f32(gate + r * ld, up + r * ld, limit, row.data(), n);
    convert_row(t, row.data(), n, dst + size_t(r) * rb);
  }
}

// ---------------------------------------------------------------------------------------
// Matrix products

namespace {

// Rows per tile of the matrix-matrix path: their weights (a few KiB each) stay in L1/L2
// while every token of the call passes over them, so each weight byte comes from memory once.
constexpr int64_t kTileRows = 8;

const uint8_t* act_row(const ActRows& x, int64_t t) {
  const int64_t r = x.idx ? x.idx[t] : t;
  return x.data + size_t(r) * x.stride;
}

// The level's kernel for rows of type t repacked 16 at a time, or null.
X16DotFn x16_kernel(const IsaKernels& k, DType t) {
  return unsigned(t) < 40 ? k.x16_dot[unsigned(t)] : nullptr;
}

}  // namespace

void matmul(const WeightMatrix& w, int64_t o_begin, int64_t o_end, const ActRows& x, float* y, int64_t ldy) {
  if (o_begin < 0 || o_end > w.n_out || o_begin > o_end) throw std::invalid_argument("matmul: bad row range");
  const DTypeInfo& info = dtype_info(w.type);
  if (w.n_in % info.block_elems != 0) throw std::invalid_argument("matmul: row length not a multiple of the block");
  const ActType native = act_type(w.type, Precision::Native);
  if (x.type == native) {
    const VecDotFn dot = vec_dot_for(w.type);
    if (!dot) throw std::invalid_argument(std::string("matmul: no kernel for ") + dtype_name(w.type));
    const IsaKernels& k = active();
    // Every token count, one included: decode streaming the repacked copy measured 1.15x
    // (1 thread) and 1.05x (2 threads) the GGUF rows in paired A/B runs (bench/ab.sh).
    const auto x16 = x16_kernel(k, w.type);
    if (w.packed && x16 && o_begin % kX16Rows == 0 && o_end % kX16Rows == 0) {
      // Repacked rows (tensor/repack.h): whole 16-row groups, every group of up to
      // kMaxX16Tokens tokens passing over one group while its weights are in L1 (the
      // kernels take 1..4 or 8 tokens: 5..7 go as 4 and the rest).
      const size_t group_bytes = x16_group_bytes(w.type, w.n_in);
      const uint8_t* xs[kMaxX16Tokens];
      const uint8_t* end = w.packed + size_t(o_end / kX16Rows) * group_bytes;
      for (int64_t o = o_begin; o < o_end; o += kX16Rows) {
        const uint8_t* group = w.packed + size_t(o / kX16Rows) * group_bytes;
        for (int64_t t0 = 0; t0 < x.n_tok;) {
          const int64_t left = x.n_tok - t0;
          const int nt = int(left >= kMaxX16Tokens ? kMaxX16Tokens : std::min<int64_t>(4, left));
          for (int t = 0; t < nt; ++t) xs[t] = act_row(x, t0 + t);
          x16(w.n_in, group, end, xs, nt, y + t0 * ldy + o, ldy);
          t0 += nt;
        }
      }
      return;
    }
    if (const TileDotFn tile = k.tile_dot[unsigned(w.type)]) {
      // Tiles of kTileRows rows; every group of up to tile_tokens tokens passes over a tile
      // while its weights are in L1, in calls of up to kMaxTileRows rows each.
      const int max_nt = k.tile_tokens;
      const uint8_t* rows[kMaxTileRows];
      const uint8_t* xs[kMaxTileTokens];
      for (int64_t o0 = o_begin; o0 < o_end; o0 += kTileRows) {
        const int64_t o1 = std::min(o_end, o0 + kTileRows);
        for (int64_t t0 = 0; t0 < x.n_tok; t0 += max_nt) {
          const int nt = int(std::min<int64_t>(max_nt, x.n_tok - t0));
          for (int t = 0; t < nt; ++t) xs[t] = act_row(x, t0 + t);
          for (int64_t r0 = o0; r0 < o1; r0 += kMaxTileRows) {
            const int nr = int(std::min<int64_t>(kMaxTileRows, o1 - r0));
            for (int r = 0; r < nr; ++r) rows[r] = w.row(r0 + r);
            tile(w.n_in, rows, nr, xs, nt, y + t0 * ldy + r0, ldy);
          }
        }
      }
      return;
    }
    if (x.n_tok == 1) {
      const uint8_t* xr = act_row(x, 0);
      for (int64_t o = o_begin; o < o_end; ++o) y[o] = dot(w.n_in, w.row(o), xr);
      return;
    }
    for (int64_t o0 = o_begin; o0 < o_end; o0 += kTileRows) {
      const int64_t o1 = std::min(o_end, o0 + kTileRows);
      for (int64_t t = 0; t < x.n_tok; ++t) {
        const uint8_t* xr = act_row(x, t);
        for (int64_t o = o0; o < o1; ++o) y[t * ldy + o] = dot(w.n_in, w.row(o), xr);
      }
    }
    return;
  }
  if (x.type != ActType::F32)
    throw std::invalid_argument(std::string("matmul: ") + act_type_name(x.type) + " activations cannot multiply " +
                                dtype_name(w.type) + " weights");
  // Exact precision: dequantize each weight row once, dot it with every token in F32.
  const IsaKernels& k = active();
  thread_local std::vector<float> row;
  row.resize(size_t(w.n_in));
  for (int64_t o = o_begin; o < o_end; ++o) {
    dequantize_row_ref(w.type, w.row(o), row.data(), w.n_in);
    for (int64_t t = 0; t < x.n_tok; ++t)
      y[t * ldy + o] = k.dot_f32(row.data(), reinterpret_cast<const float*>(act_row(x, t)), w.n_in);
  }
}

bool has_repacked(DType t) { return x16_kernel(active(), t) != nullptr; }

int64_t row_granularity(const WeightMatrix& w) {
  return w.packed && x16_kernel(active(), w.type) ? kX16Rows : kTileRows;
}

// ---------------------------------------------------------------------------------------
// Vector helpers

float dot_f32(const float* a, const float* b, int64_t n) { return active().dot_f32(a, b, n); }
void axpy_f32(float a, const float* x, float* y, int64_t n) { active().axpy_f32(a, x, y, n); }
void scale_f32(float a, float* y, int64_t n) { active().scale_f32(a, y, n); }
float sum_squares_f32(const float* x, int64_t n) { return active().sum_squares_f32(x, n); }

void attn_scores(const float* q, int64_t q_stride, int64_t n_q, const float* k, int64_t k_stride, int64_t n_k,
                 int64_t d, float scale, float* s, int64_t s_stride) {
  active().attn_scores(q, q_stride, n_q, k, k_stride, n_k, d, scale, s, s_stride);
}
float exp_shift_sum(float* s, int64_t n, float m) { return active().exp_shift_sum(s, n, m); }

void gemm_acc_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  active().gemm_acc_f32(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc);
}

}  // namespace step35::kernels
