// Element-wise reduce templates, compiled once per instruction set.
//
// This header is a per-ISA template: each kernels_<isa>.cc defines
//   RR_KERNEL_NS      the namespace for its copy (kern_scalar, kern_avx2, kern_avx512)
//   RR_KERNEL_TARGET  its GCC target attribute (empty for the scalar path)
// and then includes it once. Every function below carries RR_KERNEL_TARGET itself. That is
// the point: GCC 12 lowers vector compares in a default-target function to a mask type the
// AVX-512 code cannot use, so a shared default-target helper inlined into an AVX-512 caller
// turns `(a < b) ? a : b` into ~2000 scalar instructions. Separate namespaces keep the copies
// apart (no ODR clash between an AVX-512 and a baseline instantiation of the same template).
//
// The vector loops use GCC vector extensions (`T __attribute__((vector_size(B)))`) rather
// than trusting the auto-vectoriser: the code is vectorised at -O2 as well as -O3, needs no
// __restrict (dst == src is allowed), and the lane width is the template's kBytes.
//
// Determinism: each output element depends only on dst[i] and src[i] through one operation,
// so lane width, unrolling and tails cannot change results. combineInto() is written once
// for scalars and vectors alike, so the scalar tail and the vector body are the same formula:
//  - float sum/prod: if dst[i] is NaN the result is dst[i] itself, otherwise the IEEE
//    result. Without the select, NaN + NaN would return whichever operand the compiler put
//    first (x86 keeps the first source's payload), which may differ between paths.
//  - integer sum/prod: computed in the unsigned type of the same width, so they wrap.
//  - min/max: (a < b || a is NaN) ? a : b (and > for max): NaN on either side gives NaN.
//
// Contract for the loops: dst and src may be the same pointer but must not otherwise
// overlap; pointers need not be aligned (all access goes through memcpy).
#if !defined(RR_KERNEL_NS) || !defined(RR_KERNEL_TARGET)
#error "define RR_KERNEL_NS and RR_KERNEL_TARGET before including reduce/reduce_kernels.h"
#endif
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "csrc/reduce relies on IEEE semantics (NaN tests, no reassociation): no -ffast-math"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/types.h"
#include "reduce/half.h"
#include "reduce/isa.h"

#define RR_KFN inline __attribute__((always_inline)) RR_KERNEL_TARGET

namespace rr::reduce::RR_KERNEL_NS {

// Vectors are passed by reference only: a by-value vector argument or return would draw
// -Wpsabi warnings on the scalar path (and these are always inlined anyway).
template <class X>
RR_KFN void loadTo(X& v, const char* p) {
  std::memcpy(&v, p, sizeof(X));
}

template <class X>
RR_KFN void storeFrom(char* p, const X& v) {
  std::memcpy(p, &v, sizeof(X));
}

// Pins a loaded vector in a register (emits nothing). Without it GCC folds the src load
// into AVX-512 merge-masked ops (`vaddps (mem), a, r{k}` for the NaN select); on the AMD
// EPYC test machine (lscpu: family 25, model 17) such masked memory operands cut DRAM-bound
// float sum from ~20 to ~14 GB/s, while in-cache speed is unchanged.
template <class X>
RR_KFN void inRegister(X& v) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// Scalar shorthands.
template <class T>
RR_KFN T load(const char* p) {
  T v;
  loadTo(v, p);
  return v;
}

template <class T>
RR_KFN void store(char* p, T v) {
  storeFrom(p, v);
}

// Inside a template, GCC 12 loses the vector attribute of a typedef whose element type is
// not dependent (`typedef float V __attribute__((vector_size(kBytes)))` acts like float in
// places), so vector types are always spelled through this.
template <class T, int kBytes>
struct VecOf {
  typedef T type __attribute__((vector_size(kBytes)));
};

// The type integer arithmetic is done in (unsigned: wraps), or T itself for floats.
template <class T, bool = std::is_integral_v<T>>
struct ArithOf {
  using type = std::make_unsigned_t<T>;
};
template <class T>
struct ArithOf<T, false> {
  using type = T;
};

// One element-wise step, a = a OP b. X is T or a vector of T; XU is the matching unsigned
// type (scalar or vector) used for integer sum/prod. C-style casts are value conversions for
// scalars (modular for integers) and bit reinterpretations for same-sized vectors: both
// wrap. Scalar 8-bit lanes go through `unsigned` so int promotion cannot overflow.
template <class T, ReduceOp kOp, class X, class XU>
RR_KFN void combineInto(X& a, const X& b) {
  constexpr bool kFloat = std::is_floating_point_v<T>;
  constexpr bool kSmallScalar = sizeof(X) < sizeof(unsigned);
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    if constexpr (kFloat) {
      const X r = a + b;
      a = (a != a) ? a : r;
    } else if constexpr (kSmallScalar) {
      a = (X)(XU)((unsigned)(XU)a + (unsigned)(XU)b);
    } else {
      a = (X)((XU)a + (XU)b);
    }
  } else if constexpr (kOp == ReduceOp::kProd) {
    if constexpr (kFloat) {
      const X r = a * b;
      a = (a != a) ? a : r;
    } else if constexpr (kSmallScalar) {
      a = (X)(XU)((unsigned)(XU)a * (unsigned)(XU)b);
    } else {
      a = (X)((XU)a * (XU)b);
    }
  } else if constexpr (kOp == ReduceOp::kMin) {
    if constexpr (kFloat) {
      const X r = (a < b) ? a : b;
      a = (a != a) ? a : r;
    } else {
      a = (a < b) ? a : b;
    }
  } else if constexpr (kOp == ReduceOp::kBand || kOp == ReduceOp::kBor ||
                       kOp == ReduceOp::kBxor) {
    static_assert(!kFloat, "bitwise ops are for integer types");
    if constexpr (kOp == ReduceOp::kBand) a = a & b;
    if constexpr (kOp == ReduceOp::kBor) a = a | b;
    if constexpr (kOp == ReduceOp::kBxor) a = a ^ b;
  } else {
    static_assert(kOp == ReduceOp::kMax, "unhandled op");
    if constexpr (kFloat) {
      const X r = (a > b) ? a : b;
      a = (a != a) ? a : r;
    } else {
      a = (a > b) ? a : b;
    }
  }
}

template <class T, ReduceOp kOp>
RR_KFN void reduceScalar(char* d, const char* s, size_t n) {
  using U = typename ArithOf<T>::type;
  for (size_t i = 0; i < n; ++i) {
    const size_t off = i * sizeof(T);
    T a = load<T>(d + off);
    combineInto<T, kOp, T, U>(a, load<T>(s + off));
    store<T>(d + off, a);
  }
}

// dst[i] = dst[i] OP src[i] with kBytes-wide vectors, four per iteration, scalar head/tail.
template <class T, ReduceOp kOp, int kBytes>
RR_KFN void reduceVec(void* dst, const void* src, size_t n) {
  using U = typename ArithOf<T>::type;
  using V = typename VecOf<T, kBytes>::type;
  using VU = typename VecOf<U, kBytes>::type;
  constexpr size_t kLanes = kBytes / sizeof(T);
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Peel scalar elements until dst is vector-aligned (when it is element-aligned): a 64-byte
  // access that straddles two cache lines costs ~10% of in-cache bandwidth.
  const uintptr_t mis = reinterpret_cast<uintptr_t>(d) % kBytes;
  size_t i = (mis % sizeof(T) == 0) ? ((kBytes - mis) % kBytes) / sizeof(T) : 0;
  if (i > n) i = n;
  reduceScalar<T, kOp>(d, s, i);
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    char* dp = d + i * sizeof(T);
    const char* sp = s + i * sizeof(T);
    // Four named vectors, not arrays: with `V a[4]` GCC 12 keeps them on the stack and the
    // AVX2 path runs slower than scalar.
    V a0, a1, a2, a3, b0, b1, b2, b3;
    loadTo(a0, dp);
    loadTo(a1, dp + kBytes);
    loadTo(a2, dp + 2 * kBytes);
    loadTo(a3, dp + 3 * kBytes);
    loadTo(b0, sp);
    loadTo(b1, sp + kBytes);
    loadTo(b2, sp + 2 * kBytes);
    loadTo(b3, sp + 3 * kBytes);
    inRegister(b0);
    inRegister(b1);
    inRegister(b2);
    inRegister(b3);
    combineInto<T, kOp, V, VU>(a0, b0);
    combineInto<T, kOp, V, VU>(a1, b1);
    combineInto<T, kOp, V, VU>(a2, b2);
    combineInto<T, kOp, V, VU>(a3, b3);
    storeFrom(dp, a0);
    storeFrom(dp + kBytes, a1);
    storeFrom(dp + 2 * kBytes, a2);
    storeFrom(dp + 3 * kBytes, a3);
  }
  for (; i + kLanes <= n; i += kLanes) {
    char* dp = d + i * sizeof(T);
    V a, b;
    loadTo(a, dp);
    loadTo(b, s + i * sizeof(T));
    inRegister(b);
    combineInto<T, kOp, V, VU>(a, b);
    storeFrom(dp, a);
  }
  reduceScalar<T, kOp>(d + i * sizeof(T), s + i * sizeof(T), n - i);
}

// dst[i] = acc[i] / divisor (float32 or float64), kBytes-wide vectors (0: scalar only).
template <class T, int kBytes>
RR_KFN void divideLoop(const void* acc, void* dst, size_t n, int divisor) {
  const char* a = static_cast<const char*>(acc);
  char* d = static_cast<char*>(dst);
  const T w = static_cast<T>(divisor);
  size_t i = 0;
  if constexpr (kBytes > 0) {
    using V = typename VecOf<T, kBytes>::type;
    constexpr size_t kLanes = kBytes / sizeof(T);
    for (; i + kLanes <= n; i += kLanes) {
      V v;
      loadTo(v, a + i * sizeof(T));
      v = v / w;
      storeFrom(d + i * sizeof(T), v);
    }
  }
  for (; i < n; ++i) {
    store<T>(d + i * sizeof(T), load<T>(a + i * sizeof(T)) / w);
  }
}

// float32 -> bfloat16 (optionally divided first) with kBytes-wide float vectors (0: scalar).
// The vector body is half.h's floatToBf16 written on lanes.
template <bool kDivide, int kBytes>
RR_KFN void narrowBf16Loop(const float* acc, void* dst, size_t n, int divisor) {
  const char* a = reinterpret_cast<const char*>(acc);
  char* d = static_cast<char*>(dst);
  const float w = static_cast<float>(divisor);
  size_t i = 0;
  if constexpr (kBytes > 0) {
    using VF = typename VecOf<float, kBytes>::type;
    using VU = typename VecOf<uint32_t, kBytes>::type;
    using VH = typename VecOf<uint16_t, kBytes / 2>::type;
    constexpr size_t kLanes = kBytes / 4;
    for (; i + kLanes <= n; i += kLanes) {
      VF f;
      loadTo(f, a + i * 4);
      if constexpr (kDivide) f = f / w;
      const VU x = (VU)f;
      const VU rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
      const VU nan = (x >> 16) | 0x40u;
      const VU r = ((x & 0x7FFFFFFFu) > 0x7F800000u) ? nan : rounded;
      const VH h = __builtin_convertvector(r, VH);
      storeFrom(d + i * 2, h);
    }
  }
  for (; i < n; ++i) {
    float f = load<float>(a + i * 4);
    if constexpr (kDivide) f = f / w;
    store<uint16_t>(d + i * 2, floatToBf16(f));
  }
}

// bfloat16 -> float32 with kBytes-wide float vectors (0: scalar only).
template <int kBytes>
RR_KFN void widenBf16Loop(const void* src, float* dst, size_t n) {
  const char* s = static_cast<const char*>(src);
  char* d = reinterpret_cast<char*>(dst);
  size_t i = 0;
  if constexpr (kBytes > 0) {
    using VU = typename VecOf<uint32_t, kBytes>::type;
    using VH = typename VecOf<uint16_t, kBytes / 2>::type;
    constexpr size_t kLanes = kBytes / 4;
    for (; i + kLanes <= n; i += kLanes) {
      VH h;
      loadTo(h, s + i * 2);
      const VU x = __builtin_convertvector(h, VU) << 16;
      storeFrom(d + i * 4, x);
    }
  }
  for (; i < n; ++i) {
    store<float>(d + i * 4, bf16ToFloat(load<uint16_t>(s + i * 2)));
  }
}

// Fills the reduce rows of a KernelTable from K<T, op>::run (a per-ISA wrapper that carries
// the target attribute). Floats: sum, avg (the sum kernel), prod, min, max. Integers: those
// but avg (an integer avg runs as a sum in int64: collectives/int_avg.h) plus the bitwise
// ops. 16-bit float rows stay null.
template <class T, template <class, ReduceOp> class K>
inline void fillRow(ReduceFn (&row)[kNumReduceOps]) {
  row[static_cast<int>(ReduceOp::kSum)] = &K<T, ReduceOp::kSum>::run;
  row[static_cast<int>(ReduceOp::kProd)] = &K<T, ReduceOp::kProd>::run;
  row[static_cast<int>(ReduceOp::kMin)] = &K<T, ReduceOp::kMin>::run;
  row[static_cast<int>(ReduceOp::kMax)] = &K<T, ReduceOp::kMax>::run;
  if constexpr (std::is_floating_point_v<T>) {
    row[static_cast<int>(ReduceOp::kAvg)] = &K<T, ReduceOp::kSum>::run;
  } else {
    row[static_cast<int>(ReduceOp::kBand)] = &K<T, ReduceOp::kBand>::run;
    row[static_cast<int>(ReduceOp::kBor)] = &K<T, ReduceOp::kBor>::run;
    row[static_cast<int>(ReduceOp::kBxor)] = &K<T, ReduceOp::kBxor>::run;
  }
}

// bool is one byte holding 0 or 1: or (sum, max, bor), and (prod, min, band), xor (bxor),
// all of which keep values in {0, 1}; as torch's NCCL backend does for bool sum/prod.
template <template <class, ReduceOp> class K>
inline void fillBoolRow(ReduceFn (&row)[kNumReduceOps]) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kBor})
    row[static_cast<int>(op)] = &K<uint8_t, ReduceOp::kBor>::run;
  for (ReduceOp op : {ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kBand})
    row[static_cast<int>(op)] = &K<uint8_t, ReduceOp::kBand>::run;
  row[static_cast<int>(ReduceOp::kBxor)] = &K<uint8_t, ReduceOp::kBxor>::run;
}

template <template <class, ReduceOp> class K>
inline void fillReduceTable(detail::KernelTable& t) {
  for (auto& row : t.reduce) {
    for (auto& fn : row) fn = nullptr;
  }
  fillRow<float, K>(t.reduce[static_cast<int>(DataType::kFloat32)]);
  fillRow<double, K>(t.reduce[static_cast<int>(DataType::kFloat64)]);
  fillRow<int8_t, K>(t.reduce[static_cast<int>(DataType::kInt8)]);
  fillRow<uint8_t, K>(t.reduce[static_cast<int>(DataType::kUInt8)]);
  fillRow<int16_t, K>(t.reduce[static_cast<int>(DataType::kInt16)]);
  fillRow<uint16_t, K>(t.reduce[static_cast<int>(DataType::kUInt16)]);
  fillRow<int32_t, K>(t.reduce[static_cast<int>(DataType::kInt32)]);
  fillRow<uint32_t, K>(t.reduce[static_cast<int>(DataType::kUInt32)]);
  fillRow<int64_t, K>(t.reduce[static_cast<int>(DataType::kInt64)]);
  fillRow<uint64_t, K>(t.reduce[static_cast<int>(DataType::kUInt64)]);
  fillBoolRow<K>(t.reduce[static_cast<int>(DataType::kBool)]);
}

}  // namespace rr::reduce::RR_KERNEL_NS

#undef RR_KFN
