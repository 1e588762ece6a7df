// Row access helpers of WeightMatrix (the matrix products are in kernels.h).
#include "tensor/quants.h"
#include "tensor/tensor.h"

namespace step35 {

void dequantize_row(const WeightMatrix& w, int64_t r, float* dst) {
  dequantize_row_ref(w.type, w.row(r), dst, w.n_in);
}

}  // namespace step35
