// The AVX2 path: 32-byte vectors, F16C for float16. Compiled for x86-64 baseline like every
// other file; only the functions below carry target("avx2,f16c"), and they are reached only
// after bestIsa() confirmed the CPU has both.
#include "reduce/isa.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "reduce/half.h"

#define RR_KERNEL_NS kern_avx2
#define RR_KERNEL_TARGET __attribute__((target("avx2,f16c")))
#include "reduce/reduce_kernels.h"

namespace rr::reduce::detail {
namespace {

namespace kern = ::rr::reduce::kern_avx2;

constexpr int kBytes = 32;

template <class T, ReduceOp kOp>
struct Avx2Reduce {
  RR_KERNEL_TARGET static void run(void* dst, const void* src, size_t n) {
    kern::reduceVec<T, kOp, kBytes>(dst, src, n);
  }
};

RR_KERNEL_TARGET void widenHalfAvx2(const void* src, float* dst, size_t n) {
  const char* s = static_cast<const char*>(src);
  char* d = reinterpret_cast<char*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * 2));
    _mm256_storeu_ps(reinterpret_cast<float*>(d + i * 4), _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    kern::store<float>(d + i * 4, halfToFloat(kern::load<uint16_t>(s + i * 2)));
  }
}

RR_KERNEL_TARGET void widenBf16Avx2(const void* src, float* dst, size_t n) {
  kern::widenBf16Loop<kBytes>(src, dst, n);
}

template <bool kDivide>
RR_KERNEL_TARGET void narrowHalfLoop(const float* acc, void* dst, size_t n, int divisor) {
  const char* a = reinterpret_cast<const char*>(acc);
  char* d = static_cast<char*>(dst);
  const float w = static_cast<float>(divisor);
  const __m256 wv = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(reinterpret_cast<const float*>(a + i * 4));
    if constexpr (kDivide) f = _mm256_div_ps(f, wv);
    const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i * 2), h);
  }
  for (; i < n; ++i) {
    float f = kern::load<float>(a + i * 4);
    if constexpr (kDivide) f = f / w;
    kern::store<uint16_t>(d + i * 2, floatToHalf(f));
  }
}

RR_KERNEL_TARGET void narrowHalfAvx2(const float* acc, void* dst, size_t n, int divisor) {
  if (divisor == 1) {
    narrowHalfLoop<false>(acc, dst, n, divisor);
  } else {
    narrowHalfLoop<true>(acc, dst, n, divisor);
  }
}

RR_KERNEL_TARGET void narrowBf16Avx2(const float* acc, void* dst, size_t n, int divisor) {
  if (divisor == 1) {
    kern::narrowBf16Loop<false, kBytes>(acc, dst, n, divisor);
  } else {
    kern::narrowBf16Loop<true, kBytes>(acc, dst, n, divisor);
  }
}

RR_KERNEL_TARGET void divF32Avx2(const void* acc, void* dst, size_t n, int divisor) {
  kern::divideLoop<float, kBytes>(acc, dst, n, divisor);
}

RR_KERNEL_TARGET void divF64Avx2(const void* acc, void* dst, size_t n, int divisor) {
  kern::divideLoop<double, kBytes>(acc, dst, n, divisor);
}

KernelTable makeAvx2Table() {
  KernelTable t;
  kern::fillReduceTable<Avx2Reduce>(t);
  t.widenHalf = &widenHalfAvx2;
  t.widenBf16 = &widenBf16Avx2;
  t.narrowHalf = &narrowHalfAvx2;
  t.narrowBf16 = &narrowBf16Avx2;
  t.divF32 = &divF32Avx2;
  t.divF64 = &divF64Avx2;
  return t;
}

}  // namespace

const KernelTable& avx2Kernels() {
  static const KernelTable table = makeAvx2Table();
  return table;
}

}  // namespace rr::reduce::detail

#else  // not x86: bestIsa() never returns kAvx2, so this is unreachable.

namespace rr::reduce::detail {
const KernelTable& avx2Kernels() { return scalarKernels(); }
}  // namespace rr::reduce::detail

#endif
