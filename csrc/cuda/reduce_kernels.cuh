// The CUDA reduce kernels and their launch logic, as templates. reduce_kernels.cu includes
// this once with RR_CUDA_LAUNCH defined as a real <<<grid, block, 0, stream>>> launch; the
// tests include it into a host program with RR_CUDA_LAUNCH running every (block, thread) of
// the grid in turn (tests/test_gpu.py::test_kernels_emulated_on_host_match_cpu_kernels),
// which checks the indexing, packing and tails against the CPU kernels without a GPU. That
// is sound because every kernel here is element-wise: no shared memory, no synchronisation.
//
// Element-wise semantics (see reduce/reduce_kernels.h, which this mirrors):
//  - float sum/prod: a NaN already in dst stays; otherwise the IEEE result.
//  - integer sum/prod: computed in the unsigned type of the same width, so they wrap.
//  - min/max: (a < b || a is NaN) ? a : b (and > for max): NaN on either side gives NaN.
//  - 16-bit floats: widened to float32 exactly, reduced in float32, rounded once (narrow).
//
// Launch shape: a grid-stride loop over 16-byte packs when every pointer allows it, then a
// grid-stride loop over the remaining elements. 256 threads a block, at most 8192 blocks.
#pragma once

#if !defined(RR_CUDA_LAUNCH)
#error "define RR_CUDA_LAUNCH(kernel, blocks, threads, stream, ...) before including this"
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/types.h"
#include "cuda/half_device.cuh"

namespace rr::cuda::kern::impl {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;

// The type integer arithmetic is done in (unsigned: wraps), or T itself for floats.
template <class T, bool = std::is_integral_v<T>>
struct ArithOf {
  using type = std::make_unsigned_t<T>;
};
template <class T>
struct ArithOf<T, false> {
  using type = T;
};

template <class T, ReduceOp kOp>
__device__ __forceinline__ T combine(T a, T b) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  using U = typename ArithOf<T>::type;
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    if constexpr (kFloat) {
      const T r = a + b;
      return (a != a) ? a : r;
    } else {
      // Through `unsigned` (or wider) so that 8-bit promotion to int cannot overflow.
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) +
                                           static_cast<W>(static_cast<U>(b))));
    }
  } else if constexpr (kOp == ReduceOp::kProd) {
    if constexpr (kFloat) {
      const T r = a * b;
      return (a != a) ? a : r;
    } else {
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) *
                                           static_cast<W>(static_cast<U>(b))));
    }
  } else if constexpr (kOp == ReduceOp::kMin) {
    const T r = (a < b) ? a : b;
    if constexpr (kFloat) return (a != a) ? a : r;
    return r;
  } else {
    static_assert(kOp == ReduceOp::kMax, "unhandled op");
    const T r = (a > b) ? a : b;
    if constexpr (kFloat) return (a != a) ? a : r;
    return r;
  }
}

// N elements of T loaded/stored as one aligned access.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements of T in one 16-byte pack.
template <class T>
struct PackOf {
  static constexpr int value = 16 / static_cast<int>(sizeof(T));
};

inline bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

inline unsigned blocksFor(size_t units) {
  size_t b = (units + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<unsigned>(b);
}

__device__ __forceinline__ size_t globalThread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t gridThreads() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// ---- dst OP= src ----------------------------------------------------------------------

template <class T, ReduceOp kOp>
__global__ void reduceKernel(T* dst, const T* src, size_t n, size_t nPacks) {
  constexpr int N = PackOf<T>::value;
  using P = Pack<T, N>;
  const size_t stride = gridThreads();
  for (size_t j = globalThread(); j < nPacks; j += stride) {
    P a = reinterpret_cast<const P*>(dst)[j];
    const P b = reinterpret_cast<const P*>(src)[j];
#pragma unroll
    for (int k = 0; k < N; ++k) a.v[k] = combine<T, kOp>(a.v[k], b.v[k]);
    reinterpret_cast<P*>(dst)[j] = a;
  }
  for (size_t i = nPacks * N + globalThread(); i < n; i += stride) {
    dst[i] = combine<T, kOp>(dst[i], src[i]);
  }
}

template <class T, ReduceOp kOp>
int launchReduce(void* dst, const void* src, size_t n, void* stream) {
  if (n == 0) return 0;
  constexpr int N = PackOf<T>::value;
  const bool vec = aligned(dst, 16) && aligned(src, 16);
  const size_t nPacks = vec ? n / N : 0;
  const unsigned blocks = blocksFor(vec ? nPacks + (n % N) : n);
  return RR_CUDA_LAUNCH((reduceKernel<T, kOp>), blocks, kThreads, stream,
                        static_cast<T*>(dst), static_cast<const T*>(src), n, nPacks);
}

// ---- dst = acc / divisor ----------------------------------------------------------------

template <class T>
__device__ __forceinline__ T divideOne(T x, int divisor) {
  if constexpr (std::is_floating_point_v<T>) {
    return x / static_cast<T>(divisor);
  } else {
    using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
    return static_cast<T>(static_cast<Wide>(x) / static_cast<Wide>(divisor));
  }
}

template <class T>
__global__ void divideKernel(const T* acc, T* dst, size_t n, int divisor) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) dst[i] = divideOne(acc[i], divisor);
}

template <class T>
int launchDivide(const void* acc, void* dst, size_t n, int divisor, void* stream) {
  if (n == 0) return 0;
  return RR_CUDA_LAUNCH((divideKernel<T>), blocksFor(n), kThreads, stream,
                        static_cast<const T*>(acc), static_cast<T*>(dst), n, divisor);
}

// ---- 16-bit floats -----------------------------------------------------------------------

template <DataType kT>
__device__ __forceinline__ float widenOne(uint16_t h) {
  if constexpr (kT == DataType::kFloat16) return dev::halfToFloat(h);
  else return dev::bf16ToFloat(h);
}

template <DataType kT>
__device__ __forceinline__ uint16_t narrowOne(float f) {
  if constexpr (kT == DataType::kFloat16) return dev::floatToHalf(f);
  else return dev::floatToBf16(f);
}

// Packs of 4: 16 bytes of float32, 8 bytes of 16-bit floats.
template <DataType kT, ReduceOp kOp>
__global__ void accumulateKernel(float* acc, const uint16_t* src, size_t n, size_t nPacks) {
  using PF = Pack<float, 4>;
  using PH = Pack<uint16_t, 4>;
  const size_t stride = gridThreads();
  for (size_t j = globalThread(); j < nPacks; j += stride) {
    PF a = reinterpret_cast<const PF*>(acc)[j];
    const PH b = reinterpret_cast<const PH*>(src)[j];
#pragma unroll
    for (int k = 0; k < 4; ++k) a.v[k] = combine<float, kOp>(a.v[k], widenOne<kT>(b.v[k]));
    reinterpret_cast<PF*>(acc)[j] = a;
  }
  for (size_t i = nPacks * 4 + globalThread(); i < n; i += stride) {
    acc[i] = combine<float, kOp>(acc[i], widenOne<kT>(src[i]));
  }
}

template <DataType kT, ReduceOp kOp>
int launchAccumulate(float* acc, const void* src, size_t n, void* stream) {
  if (n == 0) return 0;
  const bool vec = aligned(acc, 16) && aligned(src, 8);
  const size_t nPacks = vec ? n / 4 : 0;
  const unsigned blocks = blocksFor(vec ? nPacks + (n % 4) : n);
  return RR_CUDA_LAUNCH((accumulateKernel<kT, kOp>), blocks, kThreads, stream,
                        acc, static_cast<const uint16_t*>(src), n, nPacks);
}

template <DataType kT>
__global__ void widenKernel(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = globalThread(); i < n; i += gridThreads()) dst[i] = widenOne<kT>(src[i]);
}

template <DataType kT>
int launchWiden(const void* src, float* dst, size_t n, void* stream) {
  if (n == 0) return 0;
  return RR_CUDA_LAUNCH((widenKernel<kT>), blocksFor(n), kThreads, stream,
                        static_cast<const uint16_t*>(src), dst, n);
}

template <DataType kT>
__global__ void narrowKernel(const float* acc, uint16_t* dst, size_t n, int divisor) {
  const float w = static_cast<float>(divisor);
  for (size_t i = globalThread(); i < n; i += gridThreads()) {
    float f = acc[i];
    if (divisor != 1) f = f / w;
    dst[i] = narrowOne<kT>(f);
  }
}

template <DataType kT>
int launchNarrow(const float* acc, void* dst, size_t n, int divisor, void* stream) {
  if (n == 0) return 0;
  return RR_CUDA_LAUNCH((narrowKernel<kT>), blocksFor(n), kThreads, stream,
                        acc, static_cast<uint16_t*>(dst), n, divisor);
}

}  // namespace rr::cuda::kern::impl
