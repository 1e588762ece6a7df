// The AVX2 + FMA + F16C (256-bit) kernel table. Built with per-file target flags (CMakeLists.txt);
// kernels.cpp calls it only on CPUs that have these extensions.
#if defined(__x86_64__)

#include "tensor/kernels_x86.inc"

namespace step35::kernels {
const IsaKernels& avx2_kernels() {
  static const IsaKernels table = make_table();
  return table;
}
}  // namespace step35::kernels
#else
#include <stdexcept>

#include "tensor/kernels_impl.h"
namespace step35::kernels {
const IsaKernels& avx2_kernels() { throw std::logic_error("avx2 kernels: not an x86-64 build"); }
}  // namespace step35::kernels
#endif
