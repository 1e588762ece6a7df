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

// Below this many multiply-adds a product runs on the calling thread: waking the pool
// costs more than it saves (and much more when other processes hold the cores).
constexpr double kMinParallelWork = 1 << 20;

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

void linear_forward(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy,
                    ThreadPool* pool) {
  if (n_tok <= 0) return;
  const int64_t n_blocks = (w.n_out + kRowBlock - 1) / kRowBlock;
  split(n_blocks, pool, double(w.n_in) * double(w.n_out) * double(n_tok), [&](int64_t b0, int64_t b1) {
    std::vector<float> buf;
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
  // multiply-adds per weight), so one dx row is only ever written by one thread.
  split(n_tok, pool, double(w.n_in) * double(w.n_out) * double(n_tok), [&](int64_t t0, int64_t t1) {
    std::vector<float> buf;
    for (int64_t o0 = 0; o0 < w.n_out; o0 += kRowBlock) {
      const int64_t o1 = std::min(w.n_out, o0 + kRowBlock);
      const float* rows = rows_f32(w, o0, o1, buf);
      for (int64_t t = t0; t < t1; ++t) {
        const float* dyt = dy + t * ldy;
        float* dxt = dx + t * ldx;
        for (int64_t o = o0; o < o1; ++o)
          if (dyt[o] != 0.0f) kernels::axpy_f32(dyt[o], rows + (o - o0) * w.n_in, dxt, w.n_in);
      }
    }
  });
}

void linear_backward_weight(const float* x, int64_t ldx, const float* dy, int64_t ldy, int64_t n_tok, int64_t n_in,
                            int64_t n_out, float* g, ThreadPool* pool) {
  if (n_tok <= 0) return;
  constexpr int64_t kRows = 8;  // gradient rows per pass over the token rows
  const int64_t n_blocks = (n_out + kRows - 1) / kRows;
  split(n_blocks, pool, double(n_in) * double(n_out) * double(n_tok), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kRows, o1 = std::min(n_out, o0 + kRows);
      for (int64_t t = 0; t < n_tok; ++t) {
        const float* xt = x + t * ldx;
        const float* dyt = dy + t * ldy;
        for (int64_t o = o0; o < o1; ++o)
          if (dyt[o] != 0.0f) kernels::axpy_f32(dyt[o], xt, g + o * n_in, n_in);
      }
    }
  });
}

}  // namespace step35::train
