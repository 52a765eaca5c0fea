// The AVX-512 path: 64-byte vectors (F/BW for 8-bit lanes, DQ for 64-bit multiplies, VL for
// the narrower conversions), F16C-style conversions through VCVTPS2PH/VCVTPH2PS on zmm.
// Only the functions below carry the target attribute; they are reached only after
// bestIsa() confirmed the CPU and OS support all of these features.
#include "reduce/isa.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#include "reduce/half.h"

#define RR_KERNEL_NS kern_avx512
#define RR_KERNEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c")))
#include "reduce/reduce_kernels.h"

namespace rr::reduce::detail {
namespace {

namespace kern = ::rr::reduce::kern_avx512;

constexpr int kBytes = 64;

template <class T, ReduceOp kOp>
struct Avx512Reduce {
  RR_KERNEL_TARGET static void run(void* dst, const void* src, size_t n) {
    kern::reduceVec<T, kOp, kBytes>(dst, src, n);
  }
};

RR_KERNEL_TARGET void widenHalfAvx512(const void* src, float* dst, size_t n) {
  const char* s = static_cast<const char*>(src);
  char* d = reinterpret_cast<char*>(dst);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i * 2));
    // maskz with a full mask is the plain instruction; the unmasked intrinsic trips GCC 12's
    // -Wmaybe-uninitialized on _mm512_undefined_ps() inside the header (GCC PR 105593).
    _mm512_storeu_ps(d + i * 4, _mm512_maskz_cvtph_ps(0xFFFF, h));
  }
  for (; i < n; ++i) {
    kern::store<float>(d + i * 4, halfToFloat(kern::load<uint16_t>(s + i * 2)));
  }
}

RR_KERNEL_TARGET void widenBf16Avx512(const void* src, float* dst, size_t n) {
  kern::widenBf16Loop<kBytes>(src, dst, n);
}

template <bool kDivide>
RR_KERNEL_TARGET void narrowHalfLoop(const float* acc, void* dst, size_t n, int divisor) {
  const char* a = reinterpret_cast<const char*>(acc);
  char* d = static_cast<char*>(dst);
  const float w = static_cast<float>(divisor);
  const __m512 wv = _mm512_set1_ps(w);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 f = _mm512_loadu_ps(a + i * 4);
    if constexpr (kDivide) f = _mm512_div_ps(f, wv);
    const __m256i h =  // maskz: see widenHalfAvx512
        _mm512_maskz_cvtps_ph(0xFFFF, f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i * 2), h);
  }
  for (; i < n; ++i) {
    float f = kern::load<float>(a + i * 4);
    if constexpr (kDivide) f = f / w;
    kern::store<uint16_t>(d + i * 2, floatToHalf(f));
  }
}

RR_KERNEL_TARGET void narrowHalfAvx512(const float* acc, void* dst, size_t n, int divisor) {
  if (divisor == 1) {
    narrowHalfLoop<false>(acc, dst, n, divisor);
  } else {
    narrowHalfLoop<true>(acc, dst, n, divisor);
  }
}

RR_KERNEL_TARGET void narrowBf16Avx512(const float* acc, void* dst, size_t n, int divisor) {
  if (divisor == 1) {
    kern::narrowBf16Loop<false, kBytes>(acc, dst, n, divisor);
  } else {
    kern::narrowBf16Loop<true, kBytes>(acc, dst, n, divisor);
  }
}

RR_KERNEL_TARGET void divF32Avx512(const void* acc, void* dst, size_t n, int divisor) {
  kern::divideLoop<float, kBytes>(acc, dst, n, divisor);
}

RR_KERNEL_TARGET void divF64Avx512(const void* acc, void* dst, size_t n, int divisor) {
  kern::divideLoop<double, kBytes>(acc, dst, n, divisor);
}

KernelTable makeAvx512Table() {
  KernelTable t;
  kern::fillReduceTable<Avx512Reduce>(t);
  t.widenHalf = &widenHalfAvx512;
  t.widenBf16 = &widenBf16Avx512;
  t.narrowHalf = &narrowHalfAvx512;
  t.narrowBf16 = &narrowBf16Avx512;
  t.divF32 = &divF32Avx512;
  t.divF64 = &divF64Avx512;
  return t;
}

}  // namespace

const KernelTable& avx512Kernels() {
  static const KernelTable table = makeAvx512Table();
  return table;
}

}  // namespace rr::reduce::detail

#else  // not x86: bestIsa() never returns kAvx512, so this is unreachable.

namespace rr::reduce::detail {
const KernelTable& avx512Kernels() { return scalarKernels(); }
}  // namespace rr::reduce::detail

#endif
