// Views of weight matrices stored in place in the mapped GGUF, and the matrix-vector
// products the model is built from.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/dtype.h"

namespace step35 {

class ThreadPool;

// The matrices of a 3-D tensor repacked one at a time when first used (routed experts:
// most of a MoE file, and how many of them a deployment ever routes to is not known at
// load). Matrix m's copy at base + m * mat_bytes may be read once ready[m] is set; the
// owner (the Model) writes it before setting the flag.
struct LazyPacked {
  uint8_t* base = nullptr;
  size_t mat_bytes = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> ready;
  bool is_ready(int64_t m) const { return ready[size_t(m)].load(std::memory_order_acquire) != 0; }
};

// The matrices of a 3-D tensor that an expert cache (src/offload) holds in memory read
// from disk, when the file is not mapped for them (a memory budget): matrix m's rows are at
// where[m] while the cache keeps it there, and the mapping's rows are still correct (only
// slower) when it does not.
struct ResidentMatrices {
  std::unique_ptr<std::atomic<const uint8_t*>[]> where;
  const uint8_t* at(int64_t m) const { return where[size_t(m)].load(std::memory_order_acquire); }
};

struct WeightMatrix;

// Replacements of some matrices of a 3-D tensor (fine-tuned experts, model patches):
// matrix m is mats[m] where that has data. A replacement may have its own type.
struct MatrixSlots {
  std::vector<WeightMatrix> mats;  // n_mat entries
};

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
  // Set instead of `packed` when the matrices are repacked on first use: matrix(m) then
  // carries the copy of m once it is ready, and the GGUF rows until then.
  const LazyPacked* lazy = nullptr;
  // Matrices replaced by others (3-D tensors only), or null; matrix(m) returns them.
  const MatrixSlots* slots = nullptr;
  // Matrices an expert cache holds (3-D tensors under a memory budget), or null.
  const ResidentMatrices* resident = nullptr;

  bool present() const { return data != nullptr; }
  size_t mat_bytes() const { return row_bytes * size_t(n_out); }
  size_t total_bytes() const { return mat_bytes() * size_t(n_mat); }
  const uint8_t* row(int64_t r, int64_t mat = 0) const {
    return data + size_t(mat) * mat_bytes() + size_t(r) * row_bytes;
  }
  WeightMatrix matrix(int64_t mat) const;  // one expert of a 3-D tensor (below)
  // Whether matrix(mat) is a replacement (of any type).
  bool replaced(int64_t mat) const;
};

inline bool WeightMatrix::replaced(int64_t mat) const {
  return slots && slots->mats[size_t(mat)].data != nullptr;
}

inline WeightMatrix WeightMatrix::matrix(int64_t mat) const {
  if (replaced(mat)) return slots->mats[size_t(mat)];
  WeightMatrix m = *this;
  m.data = data + size_t(mat) * mat_bytes();
  if (packed) m.packed = packed + size_t(mat) * packed_mat_bytes;
  if (resident)
    if (const uint8_t* p = resident->at(mat)) m.data = p;
  if (lazy && lazy->is_ready(mat)) {
    m.packed = lazy->base + size_t(mat) * lazy->mat_bytes;
    m.packed_mat_bytes = lazy->mat_bytes;
  }
  m.lazy = nullptr;
  m.slots = nullptr;
  m.resident = nullptr;
  m.n_mat = 1;
  return m;
}

// Dequantizes row r of w into dst[n_in].
void dequantize_row(const WeightMatrix& w, int64_t r, float* dst);

}  // namespace step35
