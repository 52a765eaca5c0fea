// The exported CUDA reduce launchers (launch.h), instantiated from reduce_kernels.cuh: the
// device twin of the CPU kernels in reduce/ (same formulas, so a GPU rank and a CPU rank
// produce the same bits for the same inputs, NaN payloads aside: the GPU's arithmetic
// returns a canonical NaN where x86 keeps an operand's payload).
// Built without --use_fast_math: IEEE division and no flush-to-zero, as on the CPU.
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/launch.h"

// Launch on the caller's stream and report the launch's error code (0 = success).
#define RR_CUDA_LAUNCH(kernel, blocks, threads, stream, ...)                      \
  (kernel<<<(blocks), (threads), 0, static_cast<cudaStream_t>(stream)>>>(__VA_ARGS__), \
   static_cast<int>(cudaGetLastError()))
#include "cuda/reduce_kernels.cuh"

namespace rr::cuda::kern {

using impl::launchAccumulate;
using impl::launchDivide;
using impl::launchNarrow;
using impl::launchReduce;
using impl::launchWiden;

#define RR_DEFINE_REDUCE(tag, dt, ctype, optag, op)                                \
  int reduce_##tag##_##optag(void* dst, const void* src, size_t n, void* stream) { \
    return launchReduce<ctype, ReduceOp::op>(dst, src, n, stream);                 \
  }
RR_CUDA_REDUCE_KERNELS(RR_DEFINE_REDUCE)
#undef RR_DEFINE_REDUCE

#define RR_DEFINE_ACCUMULATE(tag, dt, optag, op)                                          \
  int accumulate_##tag##_##optag(float* acc, const void* src, size_t n, void* stream) {   \
    return launchAccumulate<DataType::dt, ReduceOp::op>(acc, src, n, stream);             \
  }
RR_CUDA_ACCUMULATE_KERNELS(RR_DEFINE_ACCUMULATE)
#undef RR_DEFINE_ACCUMULATE

#define RR_DEFINE_DIVIDE(tag, dt, ctype)                                                 \
  int divide_##tag(const void* acc, void* dst, size_t n, int divisor, void* stream) {    \
    return launchDivide<ctype>(acc, dst, n, divisor, stream);                            \
  }
RR_CUDA_DIRECT_TYPES(RR_DEFINE_DIVIDE)
#undef RR_DEFINE_DIVIDE

#define RR_DEFINE_HALF(tag, dt)                                                            \
  int widen_##tag(const void* src, float* dst, size_t n, void* stream) {                   \
    return launchWiden<DataType::dt>(src, dst, n, stream);                                 \
  }                                                                                        \
  int narrow_##tag(const float* acc, void* dst, size_t n, int divisor, void* stream) {     \
    return launchNarrow<DataType::dt>(acc, dst, n, divisor, stream);                       \
  }
RR_CUDA_HALF_TYPES(RR_DEFINE_HALF)
#undef RR_DEFINE_HALF

#define RR_STR2(...) #__VA_ARGS__
#define RR_STR(...) RR_STR2(__VA_ARGS__)
const char* compiledArchs() {
#ifdef __CUDA_ARCH_LIST__
  return RR_STR(__CUDA_ARCH_LIST__);
#else
  return "";
#endif
}

}  // namespace rr::cuda::kern
