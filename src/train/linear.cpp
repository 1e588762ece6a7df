#include "train/linear.h"

#include <algorithm>
#include <vector>

#include "exec/thread_pool.h"
#include "tensor/kernels.h"
#include "tensor/quants.h"

namespace step35::train {

namespace {

// Rows dequantized together: their F32 copies (32 x n_in floats, 512 KiB at n_in 4096)
// stay in L2 while every token row passes over them, so each token row is read from
// memory once per block instead of once per weight row.
constexpr int64_t kRowBlock = 32;

// The rows [o0, o1) of w as F32: F32 weights in place, others dequantized into buf.
const float* rows_f32(const WeightMatrix& w, int64_t o0, int64_t o1, std::vector<float>& buf) {
  if (w.type == DType::F32) return reinterpret_cast<const float*>(w.row(o0));
  buf.resize(size_t((o1 - o0) * w.n_in));
  for (int64_t o = o0; o < o1; ++o) dequantize_row_ref(w.type, w.row(o), buf.data() + (o - o0) * w.n_in, w.n_in);
  return buf.data();
}

// Rows of W per step of the input gradient: the k of each gemm_acc_f32 call. Its column
// chunks (k x 64 floats, 32 KiB) then stay in L1 while every 4-token tile passes over
// them, and each dx tile is loaded and stored once per 128 rows (91-115 GMAC/s at 2
// threads on a 3072 x 1024 Q4_K matrix and 512 tokens, dequantization included).
constexpr int64_t kBackwardRowBlock = 128;

// Runs fn(begin, end) over [0, n) split between the pool's threads, or at once without
// one or when the work (multiply-adds) is small.
template <typename Fn>
void split(int64_t n, ThreadPool* pool, double work, Fn&& fn) {
  if (!pool || pool->n_threads() == 1 || n < 2 || work < kMinParallelWork) {
    fn(int64_t(0), n);
    return;
  }
  pool->parallel_for(n, [&](int64_t b, int64_t e, int) {
    if (b < e) fn(b, e);
  });
}

}  // namespace

WeightMatrix f32_matrix(const float* data, int64_t n_in, int64_t n_out) {
  WeightMatrix w;
  w.data = reinterpret_cast<const uint8_t*>(data);
  w.type = DType::F32;
  w.n_in = n_in;
  w.n_out = n_out;
  w.row_bytes = size_t(n_in) * sizeof(float);
  return w;
}

namespace {

// The Native product: the token rows converted once, then the engine's kernels over row
// blocks (each block's weights stay in L1 while the token groups pass over them).
void linear_forward_native(const WeightMatrix& w, kernels::ActType act, const float* x, int64_t ldx, int64_t n_tok,
                           float* y, int64_t ldy, ThreadPool* pool) {
  const size_t stride = kernels::act_row_bytes(act, w.n_in);
  // The workers reach the calling thread's buffer through this reference (a thread_local
  // named inside the lambdas would be each worker's own, empty, instance).
  thread_local std::vector<uint8_t> converted;
  std::vector<uint8_t>& rows = converted;
  rows.resize(stride * size_t(n_tok));
  split(n_tok, pool, double(w.n_in) * double(n_tok) * 64, [&](int64_t t0, int64_t t1) {
    kernels::convert_activations(act, x + t0 * ldx, t1 - t0, w.n_in, ldx, rows.data() + size_t(t0) * stride);
  });
  kernels::ActRows xs;
  xs.type = act;
  xs.data = rows.data();
  xs.stride = stride;
  xs.n_tok = n_tok;
  const int64_t gran = std::max<int64_t>(kRowBlock, kernels::row_granularity(w));
  const int64_t n_blocks = (w.n_out + gran - 1) / gran;
  split(n_blocks, pool, double(w.n_in) * double(w.n_out) * double(n_tok), [&](int64_t b0, int64_t b1) {
    kernels::matmul(w, b0 * gran, std::min(w.n_out, b1 * gran), xs, y, ldy);
  });
}

}  // namespace

void linear_forward(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy,
                    ThreadPool* pool, Precision precision) {
  if (n_tok <= 0) return;
  if (precision == Precision::Native) {
    const kernels::ActType act = kernels::act_type(w.type, Precision::Native);
    if (act != kernels::ActType::F32) return linear_forward_native(w, act, x, ldx, n_tok, y, ldy, pool);
  }
  const int64_t n_blocks = (w.n_out + kRowBlock - 1) / kRowBlock;
  split(n_blocks, pool, double(w.n_in) * double(w.n_out) * double(n_tok), [&](int64_t b0, int64_t b1) {
    // Each thread's own, kept between calls: a fresh 512 KiB vector per call is an mmap,
    // page faults and an munmap every time.
    thread_local std::vector<float> buf;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kRowBlock, o1 = std::min(w.n_out, o0 + kRowBlock);
      const float* rows = rows_f32(w, o0, o1, buf);
      for (int64_t t = 0; t < n_tok; ++t) {
        const float* xt = x + t * ldx;
        float* yt = y + t * ldy;
        for (int64_t o = o0; o < o1; ++o) yt[o] = kernels::dot_f32(rows + (o - o0) * w.n_in, xt, w.n_in);
      }
    }
  });
}

void linear_backward_input(const WeightMatrix& w, const float* dy, int64_t ldy, int64_t n_tok, float* dx,
                           int64_t ldx, ThreadPool* pool) {
  if (n_tok <= 0) return;
  // Threads take token ranges (each dequantizes every block: cheap next to the n_tok
  // multiply-adds per weight), so one dx row is only ever written by one thread; within a
  // block the register tiles of gemm_acc_f32 keep 4 dx rows' sums while the block's rows
  // pass, instead of a load and a store of dx per weight row.
  split(n_tok, pool, double(w.n_in) * double(w.n_out) * double(n_tok), [&](int64_t t0, int64_t t1) {
    // Each thread's own, kept between calls: a fresh 512 KiB vector per call is an mmap,
    // page faults and an munmap every time.
    thread_local std::vector<float> buf;
    for (int64_t o0 = 0; o0 < w.n_out; o0 += kBackwardRowBlock) {
      const int64_t o1 = std::min(w.n_out, o0 + kBackwardRowBlock);
      const float* rows = rows_f32(w, o0, o1, buf);
      kernels::gemm_acc_f32(t1 - t0, w.n_in, o1 - o0, dy + t0 * ldy + o0, ldy, 1, rows, w.n_in, dx + t0 * ldx, ldx);
    }
  });
}

void linear_backward_weight(const float* x, int64_t ldx, const float* dy, int64_t ldy, int64_t n_tok, int64_t n_in,
                            int64_t n_out, float* g, ThreadPool* pool) {
  if (n_tok <= 0) return;
  // Gradient rows per job: gemm_acc_f32 passes 4 of them at a time over a column chunk of
  // every token row, so 16 rows read each chunk of x four times from cache, not memory.
  constexpr int64_t kRows = 16;
  const int64_t n_blocks = (n_out + kRows - 1) / kRows;
  split(n_blocks, pool, double(n_in) * double(n_out) * double(n_tok), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kRows, o1 = std::min(n_out, o0 + kRows);
      // A[o][t] = dy[t][o]: dy read column-wise through the strides.
      kernels::gemm_acc_f32(o1 - o0, n_in, n_tok, dy + o0, 1, ldy, x, ldx, g + o0 * n_in, n_in);
    }
  });
}

}  // namespace step35::train
