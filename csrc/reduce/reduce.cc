// Public entry points of the CPU reduce kernels: argument checks, then a lookup in the
// active ISA's KernelTable (isa.h). Integer averaging lives here because no x86 vector
// unit divides integers; it is the same scalar loop on every path.
#include "reduce/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "reduce/isa.h"

namespace rr::reduce {
namespace detail {
namespace {

void checkDataType(DataType t, const char* fn) {
  if (static_cast<int>(t) >= kNumDataTypes) {
    RR_THROW(InvalidArgument, fn, ": unknown dtype code ", static_cast<int>(t));
  }
}

void checkOp(ReduceOp op, const char* fn) {
  if (static_cast<int>(op) >= kNumReduceOps) {
    RR_THROW(InvalidArgument, fn, ": unknown reduce op code ", static_cast<int>(op));
  }
}

void checkPointers(const void* a, const void* b, size_t n, const char* fn) {
  if (n > 0 && (a == nullptr || b == nullptr)) {
    RR_THROW(InvalidArgument, fn, ": null buffer for ", n, " elements");
  }
}

// dst[i] = acc[i] / world, truncating toward zero as C does. The quotient is computed in
// 64 bits so that world need not fit in T (|quotient| <= |acc[i]|, so it fits back).
template <class T>
void divideIntegers(const void* acc, void* dst, size_t n, int world) {
  const char* a = static_cast<const char*>(acc);
  char* d = static_cast<char*>(dst);
  using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
  const Wide w = static_cast<Wide>(world);
  for (size_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, a + i * sizeof(T), sizeof(T));
    const T q = static_cast<T>(static_cast<Wide>(x) / w);
    std::memcpy(d + i * sizeof(T), &q, sizeof(T));
  }
}

}  // namespace

ReduceFn reduceFnFor(Isa isa, DataType t, ReduceOp op) {
  checkDataType(t, "getReduceFn");
  checkOp(op, "getReduceFn");
  if (isHalf(t)) {
    RR_THROW(InvalidArgument, "getReduceFn: ", toString(t),
             " is reduced in float32; widen() it and use accumulateType()");
  }
  ReduceFn fn = kernelsFor(isa).reduce[static_cast<int>(t)][static_cast<int>(op)];
  if (fn == nullptr) {
    RR_THROW(InvalidArgument, "getReduceFn: no kernel for ", toString(t), " ", toString(op));
  }
  return fn;
}

void widenFor(Isa isa, DataType t, const void* src, float* dst, size_t n) {
  checkDataType(t, "widen");
  if (!isHalf(t)) {
    RR_THROW(InvalidArgument, "widen: ", toString(t),
             " is not a 16-bit float (only float16 and bfloat16 are widened)");
  }
  checkPointers(src, dst, n, "widen");
  if (n == 0) return;
  const KernelTable& k = kernelsFor(isa);
  (t == DataType::kFloat16 ? k.widenHalf : k.widenBf16)(src, dst, n);
}

void finalizeFor(Isa isa, DataType t, ReduceOp op, int world, const void* acc, void* dst,
                 size_t n) {
  checkDataType(t, "finalize");
  checkOp(op, "finalize");
  if (world < 1) {
    RR_THROW(InvalidArgument, "finalize: world size must be >= 1, got ", world);
  }
  checkPointers(acc, dst, n, "finalize");
  if (n == 0) return;
  const KernelTable& k = kernelsFor(isa);
  const int divisor = (op == ReduceOp::kAvg) ? world : 1;
  if (isHalf(t)) {
    // acc holds float32 here, dst 16-bit values: overlapping them is a caller bug (e.g.
    // passing the user's 16-bit buffer as acc), so say so instead of reading garbage.
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(acc), d0 = reinterpret_cast<uintptr_t>(dst);
    if (a0 < d0 + 2 * n && d0 < a0 + 4 * n) {
      RR_THROW(InvalidArgument, "finalize: for ", toString(t),
               " the float32 accumulator and the output must not overlap");
    }
    const float* a = static_cast<const float*>(acc);
    (t == DataType::kFloat16 ? k.narrowHalf : k.narrowBf16)(a, dst, n, divisor);
    return;
  }
  // Not avg, or avg over one rank: a copy, bit for bit (x / 1 would quiet a signalling NaN).
  // memmove because acc and dst may be the same buffer.
  if (divisor == 1) {
    if (acc != dst) std::memmove(dst, acc, n * elementSize(t));
    return;
  }
  switch (t) {
    case DataType::kFloat32: k.divF32(acc, dst, n, divisor); return;
    case DataType::kFloat64: k.divF64(acc, dst, n, divisor); return;
    case DataType::kInt8: divideIntegers<int8_t>(acc, dst, n, divisor); return;
    case DataType::kUInt8: divideIntegers<uint8_t>(acc, dst, n, divisor); return;
    case DataType::kInt32: divideIntegers<int32_t>(acc, dst, n, divisor); return;
    case DataType::kInt64: divideIntegers<int64_t>(acc, dst, n, divisor); return;
    case DataType::kInt16: divideIntegers<int16_t>(acc, dst, n, divisor); return;
    case DataType::kUInt16: divideIntegers<uint16_t>(acc, dst, n, divisor); return;
    case DataType::kUInt32: divideIntegers<uint32_t>(acc, dst, n, divisor); return;
    case DataType::kUInt64: divideIntegers<uint64_t>(acc, dst, n, divisor); return;
    case DataType::kBool: break;  // refused by checkReduction
    case DataType::kFloat16:
    case DataType::kBFloat16: break;  // handled above
  }
  RR_THROW(InvalidArgument, "finalize: unsupported dtype ", toString(t));
}

}  // namespace detail

ReduceFn getReduceFn(DataType t, ReduceOp op) {
  return detail::reduceFnFor(detail::activeIsa(), t, op);
}

void widen(DataType t, const void* src, float* dst, size_t n) {
  detail::widenFor(detail::activeIsa(), t, src, dst, n);
}

void finalize(DataType t, ReduceOp op, int world, const void* acc, void* dst, size_t n) {
  detail::finalizeFor(detail::activeIsa(), t, op, world, acc, dst, n);
}

const char* isaName() { return detail::toString(detail::activeIsa()); }

}  // namespace rr::reduce
