// Views of weight matrices stored in place in the mapped GGUF, and the matrix-vector
// products the model is built from.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace step35 {

class ThreadPool;

// One weight tensor {n_in, n_out[, n_mat]}: n_mat matrices of n_out rows, each row n_in
// elements of `type`, rows contiguous (GGUF layout). A 1-D tensor is one row (n_out = 1).
struct WeightMatrix {
  const uint8_t* data = nullptr;
  DType type = DType::F32;
  int64_t n_in = 0, n_out = 0, n_mat = 1;
  size_t row_bytes = 0;
  // The same rows repacked 16 at a time for the AVX-512 kernels (tensor/repack.h), or null.
  // Owned by whoever repacked them (the Model); `data` stays valid and is used for row
  // ranges that do not start and end on a 16-row boundary.
  const uint8_t* packed = nullptr;
  size_t packed_mat_bytes = 0;  // bytes of one matrix in `packed`

  bool present() const { return data != nullptr; }
  size_t mat_bytes() const { return row_bytes * size_t(n_out); }
  size_t total_bytes() const { return mat_bytes() * size_t(n_mat); }
  const uint8_t* row(int64_t r, int64_t mat = 0) const {
    return data + size_t(mat) * mat_bytes() + size_t(r) * row_bytes;
  }
  WeightMatrix matrix(int64_t mat) const {  // one expert of a 3-D tensor
    WeightMatrix m = *this;
    m.data = data + size_t(mat) * mat_bytes();
    if (packed) m.packed = packed + size_t(mat) * packed_mat_bytes;
    m.n_mat = 1;
    return m;
  }
};

// Dequantizes row r of w into dst[n_in].
void dequantize_row(const WeightMatrix& w, int64_t r, float* dst);

}  // namespace step35
