// The AVX-512 F/BW/VL/DQ with VNNI and BF16 kernel table. Built with per-file target flags (CMakeLists.txt);
// kernels.cpp calls it only on CPUs that have these extensions.
#if defined(__x86_64__)
#define STEP35_X86_AVX512 1
// GCC 12's AVX-512 headers trip its own uninitialized-variable warnings (false positives).
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "tensor/kernels_x86.inc"

namespace step35::kernels {
const IsaKernels& avx512_kernels() {
  static const IsaKernels table = make_table();
  return table;
}
}  // namespace step35::kernels
#else
#include <stdexcept>

#include "tensor/kernels_impl.h"
namespace step35::kernels {
const IsaKernels& avx512_kernels() { throw std::logic_error("avx512 kernels: not an x86-64 build"); }
}  // namespace step35::kernels
#endif
