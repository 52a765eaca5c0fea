// Raw launchers of the CUDA reduce kernels (defined in reduce_kernels.cu, CUDA build only).
//
// Deliberately free of CUDA headers: g++ compiles dispatch.cc against these declarations,
// and only nvcc sees cuda_runtime.h. A stream is a cudaStream_t passed as void* (0 is the
// legacy default stream, 1 cudaStreamLegacy, 2 cudaStreamPerThread). Every launcher returns
// the cudaError_t of the launch as an int (0 = success) and launches nothing for n == 0.
// Launchers only enqueue work on the stream: they never synchronise. Pointers must be
// device-accessible and aligned to their element type (any allocator's pointers plus an
// element offset are); vector loads are used only where every pointer allows them.
#pragma once

#include <cstddef>

#include "cuda/kernel_list.h"

namespace rr::cuda::kern {

// dst[i] = dst[i] OP src[i] on the accumulate type; dst and src may be equal.
using ReduceLaunch = int (*)(void* dst, const void* src, size_t n, void* stream);
// acc[i] = acc[i] OP widen(src[i]): float32 acc, 16-bit float src.
using AccumulateLaunch = int (*)(float* acc, const void* src, size_t n, void* stream);
// dst[i] = acc[i] / divisor (direct types; integers truncate toward zero in 64 bits).
using DivideLaunch = int (*)(const void* acc, void* dst, size_t n, int divisor, void* stream);
// dst[i] = float32(src[i]) for 16-bit src.
using WidenLaunch = int (*)(const void* src, float* dst, size_t n, void* stream);
// dst[i] = round_to_nearest_even(acc[i] / divisor) as a 16-bit float (divisor 1: no divide).
using NarrowLaunch = int (*)(const float* acc, void* dst, size_t n, int divisor, void* stream);

#define RR_DECLARE_REDUCE(tag, dt, ctype, optag, op) \
  int reduce_##tag##_##optag(void* dst, const void* src, size_t n, void* stream);
RR_CUDA_REDUCE_KERNELS(RR_DECLARE_REDUCE)
#undef RR_DECLARE_REDUCE

#define RR_DECLARE_ACCUMULATE(tag, dt, optag, op) \
  int accumulate_##tag##_##optag(float* acc, const void* src, size_t n, void* stream);
RR_CUDA_ACCUMULATE_KERNELS(RR_DECLARE_ACCUMULATE)
#undef RR_DECLARE_ACCUMULATE

#define RR_DECLARE_DIVIDE(tag, dt, ctype) \
  int divide_##tag(const void* acc, void* dst, size_t n, int divisor, void* stream);
RR_CUDA_DIRECT_TYPES(RR_DECLARE_DIVIDE)
#undef RR_DECLARE_DIVIDE

#define RR_DECLARE_HALF(tag, dt)                                        \
  int widen_##tag(const void* src, float* dst, size_t n, void* stream); \
  int narrow_##tag(const float* acc, void* dst, size_t n, int divisor, void* stream);
RR_CUDA_HALF_TYPES(RR_DECLARE_HALF)
#undef RR_DECLARE_HALF

// "800,900": the SASS architectures this build carries (__CUDA_ARCH_LIST__), "" if unknown.
const char* compiledArchs();

}  // namespace rr::cuda::kern
