// Micro-benchmarks of the kernels: matmul of one weight type at one ISA level for a few
// token counts (decode = 1 token, 2 / 4 = one multi-token tile, prefill = 8 / 64 tokens),
// one MoE step's expert products, activation conversion, row quantization (what `step35
// quantize` runs), and the attention helpers. Run: build/bin/step35_microbench [--benchmark_filter=q4_K]
// Bytes/s counts weight bytes streamed (the decode roofline quantity).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/kernels_impl.h"
#include "tensor/kv_kernels.h"
#include "tensor/repack.h"
#include "tensor/quants.h"
#include "tensor/quants_kquant_encode.h"

namespace step35 {
namespace {

using kernels::ActType;
using kernels::Isa;

struct Case {
  std::vector<uint8_t> w_bytes;
  WeightMatrix w;
  std::vector<uint8_t> acts;
  kernels::ActRows x;
  std::vector<float> y;
};

Case make_case(DType t, Precision p, int64_t n_out, int64_t n_in, int64_t n_tok) {
  Case c;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t rb = *row_bytes(t, n_in);
  c.w_bytes.resize(rb * size_t(n_out));
  std::vector<float> row(static_cast<size_t>(n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    uint8_t* dst = c.w_bytes.data() + rb * size_t(o);
    if (t == DType::MXFP4) {
      for (size_t i = 0; i < rb; ++i) dst[i] = uint8_t(i % 17 == 0 ? 125 : rng());
      continue;
    }
    for (float& v : row) v = nd(rng);
    if (quantize_row_ref(t, row.data(), dst, n_in)) continue;
    // The IQ / TQ types without an encoder: random codes, every block's F16 scale 1/16
    // (IQ1_M keeps its scattered scale bits random but the top nibble, for a finite scale).
    const DTypeInfo& info = dtype_info(t);
    for (size_t i = 0; i < rb; ++i) dst[i] = uint8_t(rng());
    for (size_t b = 0; b < rb / info.block_bytes; ++b) {
      uint8_t* blk = dst + b * info.block_bytes;
      if (t == DType::IQ1_M) {
        blk[55] = uint8_t((blk[55] & 0x0f) | 0x30);
      } else {
        const size_t off = t == DType::TQ1_0 ? 52 : t == DType::TQ2_0 ? 64 : 0;
        blk[off] = 0x00;
        blk[off + 1] = 0x2c;
      }
    }
  }
  c.w = {c.w_bytes.data(), t, n_in, n_out, 1, rb};
  const ActType at = kernels::act_type(t, p);
  std::vector<float> xf(size_t(n_tok * n_in));
  for (float& v : xf) v = nd(rng);
  const size_t stride = kernels::act_row_bytes(at, n_in);
  c.acts.resize(stride * size_t(n_tok));
  kernels::convert_activations(at, xf.data(), n_tok, n_in, n_in, c.acts.data());
  c.x.type = at;
  c.x.data = c.acts.data();
  c.x.stride = stride;
  c.x.n_tok = n_tok;
  c.y.resize(size_t(n_tok * n_out));
  return c;
}

// n_out 2048: 2.25 MiB of Q4_K weights at 2048×2048, past L2 like a real layer but inside
// L3; n_out 65536 (72 MiB) streams them from memory.
void bm_matmul(benchmark::State& st, DType t, Isa isa, Precision p, int64_t n_out) {
  kernels::force_isa(isa);
  const int64_t n_tok = st.range(0);
  Case c = make_case(t, p, n_out, 2048, n_tok);
  for (auto _ : st) {
    kernels::matmul(c.w, 0, c.w.n_out, c.x, c.y.data(), c.w.n_out);
    benchmark::DoNotOptimize(c.y.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(c.w.mat_bytes()));
  st.counters["tok/s"] = benchmark::Counter(double(st.iterations()) * double(n_tok), benchmark::Counter::kIsRate);
}

// A matrix repacked 16 rows at a time (tensor/repack.h, the AVX-512 levels). Bytes/s counts
// the GGUF bytes of the matrix (the expanded IQ code layouts read more).
void bm_matmul_repacked(benchmark::State& st, DType type, Isa isa, int64_t n_out) {
  kernels::force_isa(isa);
  const int64_t n_tok = st.range(0);
  Case c = make_case(type, Precision::Native, n_out, 2048, n_tok);
  const kernels::AlignedBytes packed = kernels::repack(c.w);
  for (auto _ : st) {
    kernels::matmul(c.w, 0, c.w.n_out, c.x, c.y.data(), c.w.n_out);
    benchmark::DoNotOptimize(c.y.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(c.w.mat_bytes()));
  st.counters["tok/s"] = benchmark::Counter(double(st.iterations()) * double(n_tok), benchmark::Counter::kIsRate);
}

// One MoE decode step's expert products as the bench model has them: 8 experts, each a
// 256x1024 Q4_K gate and up matrix and a 1024x256 Q6_K down matrix, separately allocated
// (small scattered matrices: what the tile kernels' software prefetch is for).
void bm_moe_experts(benchmark::State& st, Isa isa) {
  kernels::force_isa(isa);
  const int64_t n_tok = st.range(0);
  std::vector<Case> gate, up, down;
  for (int e = 0; e < 8; ++e) {
    gate.push_back(make_case(DType::Q4_K, Precision::Native, 256, 1024, n_tok));
    up.push_back(make_case(DType::Q4_K, Precision::Native, 256, 1024, n_tok));
    down.push_back(make_case(DType::Q6_K, Precision::Native, 1024, 256, n_tok));
  }
  int64_t bytes = 0;
  for (int e = 0; e < 8; ++e) bytes += int64_t(gate[e].w.mat_bytes() + up[e].w.mat_bytes() + down[e].w.mat_bytes());
  for (auto _ : st) {
    for (std::vector<Case>* v : {&gate, &up, &down})
      for (Case& c : *v) kernels::matmul(c.w, 0, c.w.n_out, c.x, c.y.data(), c.w.n_out);
    benchmark::DoNotOptimize(down[7].y.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * bytes);
}

void bm_convert(benchmark::State& st, ActType t, Isa isa) {
  kernels::force_isa(isa);
  const int64_t n = 4096;
  std::vector<float> x(static_cast<size_t>(n));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<uint8_t> dst(kernels::act_row_bytes(t, n));
  for (auto _ : st) {
    kernels::convert_activations(t, x.data(), 1, n, n, dst.data());
    benchmark::DoNotOptimize(dst.data());
  }
}

// One KV cache block (32 positions, head 128) against R query rows: scores, exp, weighted
// values, as the streaming attention runs it per block. R = 8 is one decoded token of the
// benchmark model's full layers (16 query heads on 2 KV heads); R = 64 an 8-token prefill tile.
void bm_attention_block(benchmark::State& st, DType t, Isa isa) {
  kernels::force_isa(isa);
  const int64_t D = 128, R = st.range(0);
  const int32_t bs = 32;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(D));
  std::vector<uint8_t> kb(size_t(bs) * *row_bytes(t, D)), vb(kb.size());
  for (int32_t j = 0; j < bs; ++j) {
    for (float& f : row) f = nd(rng);
    kernels::kv_store_key(t, row.data(), D, kb.data(), bs, j);
    kernels::kv_store_value(t, row.data(), D, vb.data(), bs, j);
  }
  const size_t qb = kernels::attn_query_bytes(t, D);
  std::vector<uint8_t> q(qb * size_t(R));
  for (int64_t r = 0; r < R; ++r) {
    for (float& f : row) f = nd(rng);
    kernels::attn_convert_query(t, row.data(), D, q.data() + qb * size_t(r));
  }
  std::vector<float> s(size_t(R * bs)), acc(size_t(R * D));
  for (auto _ : st) {
    kernels::attn_scores(t, q.data(), qb, R, kb.data(), bs, bs, D, 0.088f, s.data(), bs);
    for (int64_t r = 0; r < R; ++r) kernels::attn_exp_sum(s.data() + r * bs, bs, 3.0f);
    kernels::attn_accumulate(t, s.data(), bs, R, vb.data(), bs, D, acc.data(), D);
    benchmark::DoNotOptimize(acc.data());
  }
  st.counters["query_key_pairs/s"] =
      benchmark::Counter(double(st.iterations()) * double(bs * R), benchmark::Counter::kIsRate);
}

// What `step35 quantize` runs per row (quantize_row_fast) at one ISA level: weights per
// second for a 4096-value row of normal values. The IQ4 types take the level's searches.
void bm_quantize_row(benchmark::State& st, DType t, Isa isa) {
  kernels::force_isa(isa);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> row(4096);
  for (float& v : row) v = nd(rng);
  std::vector<uint8_t> out(*row_bytes(t, int64_t(row.size())));
  for (auto _ : st) {
    quantize_row_fast(t, row.data(), out.data(), int64_t(row.size()));
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * int64_t(row.size()));
}

void register_all() {
  const DType types[] = {DType::Q4_K,    DType::Q6_K,   DType::F32,     DType::Q8_0,   DType::F16,   DType::Q5_K,
                         DType::BF16,    DType::MXFP4,  DType::Q4_0,    DType::Q4_1,   DType::Q5_0,  DType::Q5_1,
                         DType::Q2_K,    DType::Q3_K,   DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                         DType::IQ3_S,   DType::IQ1_S,  DType::IQ1_M,   DType::IQ4_NL, DType::IQ4_XS, DType::TQ1_0,
                         DType::TQ2_0};
  for (Isa isa : kernels::available_isas()) {
    const std::string in = kernels::isa_name(isa);
    for (DType t : types) {
      benchmark::RegisterBenchmark(("matmul/" + std::string(dtype_name(t)) + "/" + in).c_str(), bm_matmul, t, isa,
                                   Precision::Native, 2048)
          ->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("matmul_dram/q4_K/" + in).c_str(), bm_matmul, DType::Q4_K, isa, Precision::Native,
                                 65536)
        ->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond);
    kernels::force_isa(isa);
    if (kernels::active_table().x16_dot[unsigned(DType::Q4_K)] != nullptr) {
      // Rows repacked 16 at a time (tensor/repack.h), as the model holds its shared matrices.
      benchmark::RegisterBenchmark(("matmul/q4_K_x16/" + in).c_str(), bm_matmul_repacked, DType::Q4_K, isa, 2048)
          ->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("matmul_dram/q4_K_x16/" + in).c_str(), bm_matmul_repacked, DType::Q4_K, isa, 65536)
          ->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("matmul/q6_K_x16/" + in).c_str(), bm_matmul_repacked, DType::Q6_K, isa, 2048)
          ->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("matmul_dram/q6_K_x16/" + in).c_str(), bm_matmul_repacked, DType::Q6_K, isa, 65536)
          ->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("matmul/q5_K_x16/" + in).c_str(), bm_matmul_repacked, DType::Q5_K, isa, 2048)
          ->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
      for (DType t : {DType::IQ4_XS, DType::IQ3_S, DType::IQ3_XXS, DType::IQ2_S, DType::IQ2_XS, DType::IQ2_XXS,
                      DType::IQ1_M, DType::IQ1_S, DType::TQ2_0, DType::TQ1_0})
        benchmark::RegisterBenchmark(("matmul/" + std::string(dtype_name(t)) + "_x16/" + in).c_str(),
                                     bm_matmul_repacked, t, isa, 2048)
            ->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(64)->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("matmul_dram/iq4_xs_x16/" + in).c_str(), bm_matmul_repacked, DType::IQ4_XS, isa, 65536)
          ->Arg(1)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("moe_experts/" + in).c_str(), bm_moe_experts, isa)
        ->Arg(1)->Arg(4)->Unit(benchmark::kMicrosecond);
    for (DType t : {DType::IQ4_XS, DType::IQ4_NL, DType::Q4_K, DType::Q6_K})
      benchmark::RegisterBenchmark(("quantize_row/" + std::string(dtype_name(t)) + "/" + in).c_str(), bm_quantize_row,
                                   t, isa)
          ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("matmul_exact/q4_K/" + in).c_str(), bm_matmul, DType::Q4_K, isa, Precision::Exact, 2048)
        ->Arg(1)->Unit(benchmark::kMicrosecond);
    for (ActType a : {ActType::Q8_K, ActType::Q8_0, ActType::Q8_1, ActType::F16, ActType::BF16})
      benchmark::RegisterBenchmark(("convert/" + std::string(kernels::act_type_name(a)) + "/" + in).c_str(), bm_convert,
                                   a, isa);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0})
      benchmark::RegisterBenchmark(("attention_block/" + std::string(dtype_name(t)) + "/" + in).c_str(),
                                   bm_attention_block, t, isa)
          ->Arg(8)->Arg(64);
  }
}

}  // namespace
}  // namespace step35

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  step35::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
