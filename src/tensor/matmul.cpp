// Scalar matrix products over in-place weights. Rows are dequantized once into a
// per-thread buffer and then dotted with every token of the batch, so a weight row is
// streamed from memory once per call (the SIMD kernels of the performance work replace
// the inner loops; this remains the reference).
#include <vector>

#include "runtime/thread_pool.h"
#include "tensor/quants.h"
#include "tensor/tensor.h"

namespace step35 {

void dequantize_row(const WeightMatrix& w, int64_t r, float* dst) {
  dequantize_row_ref(w.type, w.row(r), dst, w.n_in);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: a fixed order that the compiler can keep in registers.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void matmul_impl(const WeightMatrix& w, const float* x, const int32_t* rows, int64_t n_tok,
                        float* y, ThreadPool& pool) {
  const int64_t n_in = w.n_in, n_out = w.n_out;
  pool.parallel_for(n_out, [&](int64_t begin, int64_t end, int) {
    thread_local std::vector<float> row_buf;
    if (w.type != DType::F32 && int64_t(row_buf.size()) < n_in) row_buf.resize(size_t(n_in));
    for (int64_t o = begin; o < end; ++o) {
      const float* wr;
      if (w.type == DType::F32) {
        wr = reinterpret_cast<const float*>(w.row(o));
      } else {
        dequantize_row(w, o, row_buf.data());
        wr = row_buf.data();
      }
      for (int64_t t = 0; t < n_tok; ++t) {
        const float* xt = x + (rows ? int64_t(rows[t]) : t) * n_in;
        y[t * n_out + o] = dot_f32(wr, xt, n_in);
      }
    }
  });
}

void matmul(const WeightMatrix& w, const float* x, int64_t n_tok, float* y, ThreadPool& pool) {
  matmul_impl(w, x, nullptr, n_tok, y, pool);
}

void matmul_rows(const WeightMatrix& w, const float* x, const int32_t* rows, int64_t n_rows,
                 float* y, ThreadPool& pool) {
  matmul_impl(w, x, rows, n_rows, y, pool);
}

}  // namespace step35
