// The portable path: plain element loops (the compiler may still use SSE2, which gives the
// same bits) and the software float16 conversions from half.h.
#include <cstring>

#include "reduce/half.h"
#include "reduce/isa.h"

#define RR_KERNEL_NS kern_scalar
#define RR_KERNEL_TARGET
#include "reduce/reduce_kernels.h"

namespace rr::reduce::detail {
namespace {

namespace kern = ::rr::reduce::kern_scalar;

template <class T, ReduceOp kOp>
struct ScalarReduce {
  static void run(void* dst, const void* src, size_t n) {
    kern::reduceScalar<T, kOp>(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
};

void widenHalfScalar(const void* src, float* dst, size_t n) {
  const char* s = static_cast<const char*>(src);
  char* d = reinterpret_cast<char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    kern::store<float>(d + i * 4, halfToFloat(kern::load<uint16_t>(s + i * 2)));
  }
}

void widenBf16Scalar(const void* src, float* dst, size_t n) {
  kern::widenBf16Loop<0>(src, dst, n);
}

template <bool kDivide>
void narrowHalfLoop(const float* acc, void* dst, size_t n, int divisor) {
  const char* a = reinterpret_cast<const char*>(acc);
  char* d = static_cast<char*>(dst);
  const float w = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) {
    float f = kern::load<float>(a + i * 4);
    if constexpr (kDivide) f = f / w;
    kern::store<uint16_t>(d + i * 2, floatToHalf(f));
  }
}

void narrowHalfScalar(const float* acc, void* dst, size_t n, int divisor) {
  if (divisor == 1) {
    narrowHalfLoop<false>(acc, dst, n, divisor);
  } else {
    narrowHalfLoop<true>(acc, dst, n, divisor);
  }
}

void narrowBf16Scalar(const float* acc, void* dst, size_t n, int divisor) {
  if (divisor == 1) {
    kern::narrowBf16Loop<false, 0>(acc, dst, n, divisor);
  } else {
    kern::narrowBf16Loop<true, 0>(acc, dst, n, divisor);
  }
}

void divF32Scalar(const void* acc, void* dst, size_t n, int divisor) {
  kern::divideLoop<float, 0>(acc, dst, n, divisor);
}

void divF64Scalar(const void* acc, void* dst, size_t n, int divisor) {
  kern::divideLoop<double, 0>(acc, dst, n, divisor);
}

KernelTable makeScalarTable() {
  KernelTable t;
  kern::fillReduceTable<ScalarReduce>(t);
  t.widenHalf = &widenHalfScalar;
  t.widenBf16 = &widenBf16Scalar;
  t.narrowHalf = &narrowHalfScalar;
  t.narrowBf16 = &narrowBf16Scalar;
  t.divF32 = &divF32Scalar;
  t.divF64 = &divF64Scalar;
  return t;
}

}  // namespace

const KernelTable& scalarKernels() {
  static const KernelTable table = makeScalarTable();
  return table;
}

}  // namespace rr::reduce::detail
