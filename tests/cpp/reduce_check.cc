// Standalone check of the CPU reduce kernels (csrc/reduce) against plain scalar references.
//
//   g++ -std=c++17 -O2 -I csrc csrc/reduce/*.cc csrc/core/types.cc
//       tests/cpp/reduce_check.cc -o reduce_check
//   ./reduce_check [--isa scalar|avx2|avx512] [--list-isas] [--bench]
//
// Every ISA path this CPU supports is run through the detail::*For hooks and compared bit
// for bit with the reference, so all paths agree with each other. --isa (or RINGREDUCE_ISA)
// also caps the public entry points (getReduceFn/widen/finalize) at that path, which are
// then checked the same way; asking for a path the CPU lacks is a failure. --list-isas
// prints the supported paths; --bench prints throughput instead of checking.
// Prints "reduce_check: N passed, M failed" and exits non-zero when M > 0.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "reduce/half.h"
#include "reduce/isa.h"
#include "reduce/reduce.h"

using rr::DataType;
using rr::ReduceOp;
using rr::reduce::detail::Isa;
namespace rd = rr::reduce::detail;

namespace {

int gPassed = 0, gFailed = 0;
std::vector<Isa> gPaths;  // every path this CPU runs; kPublic below stands for the API
constexpr int kPublic = -1;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++gPassed;
  } else if (++gFailed <= 30) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

std::string pathName(int p) {
  return p == kPublic ? std::string("public(") + rr::reduce::isaName() + ")"
                      : rd::toString(static_cast<Isa>(p));
}

rr::reduce::ReduceFn reduceFn(int p, DataType t, ReduceOp op) {
  return p == kPublic ? rr::reduce::getReduceFn(t, op) : rd::reduceFnFor(Isa(p), t, op);
}
void widenOn(int p, DataType t, const void* s, float* d, size_t n) {
  p == kPublic ? rr::reduce::widen(t, s, d, n) : rd::widenFor(Isa(p), t, s, d, n);
}
void finalizeOn(int p, DataType t, ReduceOp op, int w, const void* a, void* d, size_t n) {
  p == kPublic ? rr::reduce::finalize(t, op, w, a, d, n)
               : rd::finalizeFor(Isa(p), t, op, w, a, d, n);
}
std::vector<int> allPaths() {
  std::vector<int> v;
  for (Isa i : gPaths) v.push_back(static_cast<int>(i));
  v.push_back(kPublic);
  return v;
}

template <class T>
uint64_t bitsOf(T v) {
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}

// ---- references: written independently of csrc/reduce, from the contract in reduce.h ----

template <class T>
T refCombine(ReduceOp op, T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: return std::isnan(a) ? a : a + b;
      case ReduceOp::kProd: return std::isnan(a) ? a : a * b;
      case ReduceOp::kMin: return (a < b || std::isnan(a)) ? a : b;
      case ReduceOp::kMax: return (a > b || std::isnan(a)) ? a : b;
      default: break;  // bitwise ops have no float kernels
    }
  } else {  // wrap: do it mod 2^64, then truncate to T's width
    const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: return static_cast<T>(ua + ub);
      case ReduceOp::kProd: return static_cast<T>(ua * ub);
      case ReduceOp::kMin: return a < b ? a : b;
      case ReduceOp::kMax: return a > b ? a : b;
      case ReduceOp::kBand: return static_cast<T>(ua & ub);
      case ReduceOp::kBor: return static_cast<T>(ua | ub);
      case ReduceOp::kBxor: return static_cast<T>(ua ^ ub);
    }
  }
  return a;
}

float refHalfToFloat(uint16_t h) {
  const bool neg = h & 0x8000;
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  if (e == 31 && m != 0) {  // quiet NaN, payload kept (what VCVTPH2PS does)
    return rr::reduce::bitsFloat((neg ? 0x80000000u : 0u) | 0x7FC00000u | (uint32_t(m) << 13));
  }
  const double mag = e == 31  ? INFINITY
                     : e == 0 ? std::ldexp(m, -24)
                              : std::ldexp(1024 + m, e - 25);
  return static_cast<float>(neg ? -mag : mag);
}

// Nearest representable (ties to even) with `mant` stored bits, min normal 2^minExp.
double refRound(double a, int mant, int minExp) {
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, minExp);
  const double q = std::ldexp(1.0, exp - mant);
  return std::nearbyint(a / q) * q;  // a / q is exact; nearbyint rounds half to even
}

uint16_t refFloatToHalf(float f) {
  const uint32_t u = rr::reduce::floatBits(f);
  const uint16_t sign = (u >> 16) & 0x8000;
  if (std::isnan(f)) return sign | 0x7E00 | ((u >> 13) & 0x3FF);  // quiet, top payload
  const double v = refRound(std::fabs(double(f)), 10, -14);
  if (v > 65504.0) return sign | 0x7C00;
  if (v < 0x1p-14) return sign | static_cast<uint16_t>(v / 0x1p-24);
  int e;
  const double fr = std::frexp(v, &e);  // v = fr * 2^e
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) | int((fr * 2 - 1) * 1024));
}

uint16_t refFloatToBf16(float f) {
  const uint32_t u = rr::reduce::floatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint16_t sign = (u >> 16) & 0x8000;
  const double v = refRound(std::fabs(double(f)), 7, -126);
  if (v > 0x1.FEp127) return sign | 0x7F80;
  return sign | static_cast<uint16_t>(rr::reduce::floatBits(static_cast<float>(v)) >> 16);
}

// Computes references with FTZ/DAZ off even while a check runs with them on (DAZ would
// turn a subnormal float into 0 on its way to double, breaking the bfloat16 reference).
struct DefaultMxcsr {
#if defined(__x86_64__) || defined(__i386__)
  unsigned saved = _mm_getcsr();
  DefaultMxcsr() { _mm_setcsr(saved & ~0x8040u); }
  ~DefaultMxcsr() { _mm_setcsr(saved); }
#endif
};

// ---- data ----

std::mt19937_64 gRng(12345);

template <class T>
T randomValue() {
  if constexpr (std::is_floating_point_v<T>) {
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    static const T specials[] = {T(0), -T(0), INFINITY, -INFINITY, NAN, -NAN,
                                 std::numeric_limits<T>::denorm_min(),
                                 std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
                                 -std::numeric_limits<T>::max(), T(1), T(-1)};
    const int r = static_cast<int>(gRng() % 10);
    if (r < 6) return std::ldexp(T(int64_t(gRng() % 2000001) - 1000000), int(gRng() % 40) - 30);
    if (r < 8) return specials[gRng() % (sizeof(specials) / sizeof(T))];
    Bits b = static_cast<Bits>(gRng());  // anything: NaN payloads, sNaN, subnormals, ...
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
  } else {
    return static_cast<T>(gRng());
  }
}

// A buffer of n T's starting `skew` bytes into its storage (so it is misaligned).
struct Buf {
  std::vector<char> raw;
  char* p;
  Buf(size_t bytes, size_t skew) : raw(bytes + skew + 64), p(raw.data() + skew) {}
};

// ---- checks ----

const size_t kLengths[] = {0, 1, 3, 15, 16, 17, 63, 65, 1000, 4097};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd, ReduceOp::kMin,
                         ReduceOp::kMax};
// Integers: no avg kernel (their avg is a sum in int64, collectives/int_avg.h), the bitwise
// ops instead.
const ReduceOp kIntOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

template <class T>
std::vector<ReduceOp> opsFor() {
  if constexpr (std::is_floating_point_v<T>) return {std::begin(kOps), std::end(kOps)};
  return {std::begin(kIntOps), std::end(kIntOps)};
}

template <class T>
void checkReduce(DataType t) {
  for (ReduceOp op : opsFor<T>()) {
    for (size_t n : kLengths) {
      std::vector<T> a(n), b(n), want(n), wantSelf(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = randomValue<T>();
        b[i] = randomValue<T>();
        want[i] = refCombine(op, a[i], b[i]);
        wantSelf[i] = refCombine(op, a[i], a[i]);
      }
      for (int p : allPaths()) {
        const std::string what = pathName(p) + " " + rr::toString(t) + " " +
                                 rr::toString(op) + " n=" + std::to_string(n);
        for (size_t skew : {size_t(0), size_t(1)}) {
          Buf d(n * sizeof(T), skew), s(n * sizeof(T), 3 - 2 * skew);
          if (n) std::memcpy(d.p, a.data(), n * sizeof(T));
          if (n) std::memcpy(s.p, b.data(), n * sizeof(T));
          reduceFn(p, t, op)(d.p, s.p, n);
          check(n == 0 || std::memcmp(d.p, want.data(), n * sizeof(T)) == 0,
                what + " skew=" + std::to_string(skew));
        }
        std::vector<T> self = a;  // dst == src is allowed
        reduceFn(p, t, op)(self.data(), self.data(), n);
        check(n == 0 || std::memcmp(self.data(), wantSelf.data(), n * sizeof(T)) == 0,
              what + " dst==src");
      }
    }
  }
}

template <class T>
void checkNanPropagation(DataType t) {
  const T qnan = std::numeric_limits<T>::quiet_NaN();
  const T snan = std::numeric_limits<T>::signaling_NaN();
  const T xs[] = {T(1), T(-2), T(0), -T(0), INFINITY, -INFINITY, qnan, -qnan, snan, T(1e30)};
  std::vector<T> a, b;  // every pair, in both orders, padded so vector bodies see NaNs
  for (T x : xs) {
    for (T y : xs) {
      for (int rep = 0; rep < 20; ++rep) {
        a.push_back(x);
        b.push_back(y);
      }
    }
  }
  for (ReduceOp op : kOps) {
    for (int p : allPaths()) {
      std::vector<T> d1 = a, d2 = b;
      reduceFn(p, t, op)(d1.data(), b.data(), a.size());
      reduceFn(p, t, op)(d2.data(), a.data(), a.size());
      bool ok = true;
      for (size_t i = 0; i < a.size(); ++i) {
        const bool nanIn = std::isnan(a[i]) || std::isnan(b[i]);
        ok &= !nanIn || (std::isnan(d1[i]) && std::isnan(d2[i]));
        ok &= bitsOf(d1[i]) == bitsOf(refCombine(op, a[i], b[i]));
      }
      check(ok, pathName(p) + " NaN propagation " + rr::toString(t) + " " + rr::toString(op));
    }
  }
}

// bool bytes hold 0 or 1: sum/max/bor = or, prod/min/band = and, bxor = xor; nothing else.
void checkBool() {
  const std::pair<ReduceOp, int> ops[] = {
      {ReduceOp::kSum, '|'},  {ReduceOp::kMax, '|'},  {ReduceOp::kBor, '|'},
      {ReduceOp::kProd, '&'}, {ReduceOp::kMin, '&'},  {ReduceOp::kBand, '&'},
      {ReduceOp::kBxor, '^'}};
  for (auto [op, how] : ops) {
    for (size_t n : kLengths) {
      std::vector<uint8_t> a(n), b(n), want(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = gRng() & 1;
        b[i] = gRng() & 1;
        want[i] = how == '|' ? (a[i] | b[i]) : how == '&' ? (a[i] & b[i]) : (a[i] ^ b[i]);
      }
      for (int p : allPaths()) {
        std::vector<uint8_t> d = a;
        reduceFn(p, DataType::kBool, op)(d.data(), b.data(), n);
        check(d == want, pathName(p) + " bool " + rr::toString(op) + " n=" + std::to_string(n));
      }
    }
  }
}

void checkIntegerWrap() {
  for (int p : allPaths()) {
    int8_t a8[] = {127, -128, 16, -1}, b8[] = {1, -1, 16, -128};
    reduceFn(p, DataType::kInt8, ReduceOp::kSum)(a8, b8, 4);
    check(a8[0] == -128 && a8[1] == 127 && a8[2] == 32 && a8[3] == 127, pathName(p) + " int8 wrap");
    int32_t a32[] = {INT32_MAX, 65536}, b32[] = {1, 65536};
    reduceFn(p, DataType::kInt32, ReduceOp::kProd)(a32, b32, 2);
    check(a32[0] == INT32_MAX && a32[1] == 0, pathName(p) + " int32 prod wrap");
    int64_t a64[] = {INT64_MAX, INT64_MIN}, b64[] = {1, -1};
    reduceFn(p, DataType::kInt64, ReduceOp::kSum)(a64, b64, 2);
    check(a64[0] == INT64_MIN && a64[1] == INT64_MAX, pathName(p) + " int64 sum wrap");
  }
}

template <class T>
void checkFinalize(DataType t) {
  for (ReduceOp op : kOps) {
    for (int world : {1, 3, 7, 200}) {
      for (size_t n : kLengths) {
        std::vector<T> acc(n), want(n);
        for (size_t i = 0; i < n; ++i) {
          acc[i] = randomValue<T>();
          want[i] = acc[i];  // avg over world 1 is a copy too (x / 1 would quiet an sNaN)
          if (op == ReduceOp::kAvg && world != 1) {
            if constexpr (std::is_floating_point_v<T>) {
              want[i] = acc[i] / static_cast<T>(world);
            } else {
              want[i] = static_cast<T>(static_cast<int64_t>(acc[i]) / world);
            }
          }
        }
        for (int p : allPaths()) {
          const std::string what = pathName(p) + " finalize " + rr::toString(t) + " " +
                                   rr::toString(op) + " world=" + std::to_string(world) +
                                   " n=" + std::to_string(n);
          std::vector<T> inPlace = acc;
          finalizeOn(p, t, op, world, inPlace.data(), inPlace.data(), n);
          check(n == 0 || std::memcmp(inPlace.data(), want.data(), n * sizeof(T)) == 0,
                what + " in place");
          Buf out(n * sizeof(T), 1);
          finalizeOn(p, t, op, world, acc.data(), out.p, n);
          check(n == 0 || std::memcmp(out.p, want.data(), n * sizeof(T)) == 0, what);
        }
      }
    }
  }
}

// Converts `in` (float32) to 16-bit type t on path p, misaligned, and compares with ref.
void checkNarrow(int p, DataType t, ReduceOp op, int world, const std::vector<float>& in,
                 const std::string& label) {
  const size_t n = in.size();
  Buf acc(n * 4, 2), out(n * 2, 1);
  if (n) std::memcpy(acc.p, in.data(), n * 4);
  // acc.p is not float-aligned; the interface takes float*, but pointers need not be aligned.
  finalizeOn(p, t, op, world, reinterpret_cast<const float*>(acc.p), out.p, n);
  std::vector<uint16_t> want(n);
  {
    DefaultMxcsr normal;
    for (size_t i = 0; i < n; ++i) {
      const float x = op == ReduceOp::kAvg ? in[i] / static_cast<float>(world) : in[i];
      want[i] = t == DataType::kFloat16 ? refFloatToHalf(x) : refFloatToBf16(x);
    }
  }
  size_t bad = 0, firstBad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t got;
    std::memcpy(&got, out.p + 2 * i, 2);
    if (got != want[i] && bad++ == 0) firstBad = i;
  }
  char msg[160];
  std::snprintf(msg, sizeof msg, " (%zu wrong, first: %a = 0x%08x)", bad,
                n ? in[firstBad] : 0.0f, n ? rr::reduce::floatBits(in[firstBad]) : 0u);
  check(bad == 0, pathName(p) + " " + rr::toString(t) + " " + label + (bad ? msg : ""));
}

void checkConversions(const char* mode) {
  const std::string m = mode;
  // All 65536 patterns, widened, on every path; then narrowed back (round trip).
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    const bool f16 = t == DataType::kFloat16;
    for (int p : allPaths()) {
      for (size_t n : {size_t(65536), size_t(65531)}) {  // 65531: vector tails
        Buf src(n * 2, 1), dst(n * 4, 3);
        std::memcpy(src.p, all.data(), n * 2);
        widenOn(p, t, src.p, reinterpret_cast<float*>(dst.p), n);
        size_t bad = 0;
        std::vector<float> wide(n);
        std::memcpy(wide.data(), dst.p, n * 4);
        {
          DefaultMxcsr normal;
          for (size_t i = 0; i < n; ++i) {
            const float want =
                f16 ? refHalfToFloat(all[i]) : rr::reduce::bitsFloat(uint32_t(i) << 16);
            bad += rr::reduce::floatBits(wide[i]) != rr::reduce::floatBits(want);
          }
        }
        check(bad == 0, pathName(p) + " " + rr::toString(t) + " widen all patterns n=" +
                            std::to_string(n) + m + " wrong=" + std::to_string(bad));
        // Round trip: every non-NaN comes back unchanged; NaNs come back quiet.
        std::vector<uint16_t> back(n);
        finalizeOn(p, t, ReduceOp::kSum, 1, wide.data(), back.data(), n);
        bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const bool nan = f16 ? (i & 0x7C00) == 0x7C00 && (i & 0x3FF)
                               : (i & 0x7F80) == 0x7F80 && (i & 0x7F);
          bad += back[i] != (nan ? (i | (f16 ? 0x200 : 0x40)) : i);
        }
        check(bad == 0, pathName(p) + " " + rr::toString(t) + " round trip" + m);
      }
    }
  }
  // float32 -> 16-bit on floats around every rounding boundary: all sign/exponent/top
  // mantissa bit combinations times low bits that are exact, just above/below a tie, a tie.
  std::vector<float> halfIn, bfIn;
  std::mt19937 rng(7);
  for (uint32_t top = 0; top < (1u << 19); ++top) {
    for (uint32_t low : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x1FFFu, uint32_t(rng() & 0x1FFFu)}) {
      halfIn.push_back(rr::reduce::bitsFloat(top << 13 | low));
    }
  }
  for (uint32_t top = 0; top < (1u << 16); ++top) {
    for (uint32_t low : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, uint32_t(rng() & 0xFFFFu)}) {
      bfIn.push_back(rr::reduce::bitsFloat(top << 16 | low));
    }
  }
  for (int p : allPaths()) {
    checkNarrow(p, DataType::kFloat16, ReduceOp::kSum, 1, halfIn, "narrow boundaries" + m);
    checkNarrow(p, DataType::kBFloat16, ReduceOp::kSum, 1, bfIn, "narrow boundaries" + m);
    if (m.empty()) {  // avg divides in float32 first; with DAZ/FTZ the division itself flushes
      checkNarrow(p, DataType::kFloat16, ReduceOp::kAvg, 3, halfIn, "avg world=3");
      checkNarrow(p, DataType::kBFloat16, ReduceOp::kAvg, 3, bfIn, "avg world=3");
      for (size_t n : kLengths) {
        std::vector<float> v(halfIn.begin() + 5000, halfIn.begin() + 5000 + n);
        checkNarrow(p, DataType::kFloat16, ReduceOp::kAvg, 2, v, "n=" + std::to_string(n));
        checkNarrow(p, DataType::kBFloat16, ReduceOp::kMax, 2, v, "n=" + std::to_string(n));
      }
    }
  }
#if defined(__x86_64__) || defined(__i386__)
  // The software conversions against the F16C instructions themselves, where present.
  if (__builtin_cpu_supports("f16c")) {
    struct Hw {
      __attribute__((target("f16c"))) static uint16_t narrow(float f) {
        return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
      }
      __attribute__((target("f16c"))) static float widen(uint16_t h) { return _cvtsh_ss(h); }
    };
    size_t bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      bad += rr::reduce::floatBits(rr::reduce::halfToFloat(uint16_t(h))) !=
             rr::reduce::floatBits(Hw::widen(uint16_t(h)));
    }
    for (float f : halfIn) bad += rr::reduce::floatToHalf(f) != Hw::narrow(f);
    check(bad == 0, "software float16 == F16C" + m + " wrong=" + std::to_string(bad));
  }
#endif
}

void checkErrors() {
  auto throwsInvalid = [](auto fn) {
    try {
      fn();
    } catch (const rr::InvalidArgument&) {
      return true;
    } catch (...) {
    }
    return false;
  };
  using namespace rr::reduce;
  check(throwsInvalid([] { getReduceFn(DataType::kFloat16, ReduceOp::kSum); }), "f16 reduce");
  check(throwsInvalid([] { getReduceFn(DataType::kBFloat16, ReduceOp::kMax); }), "bf16 reduce");
  check(throwsInvalid([] { getReduceFn(DataType(42), ReduceOp::kSum); }), "bad dtype");
  check(throwsInvalid([] { getReduceFn(DataType::kFloat32, ReduceOp(9)); }), "bad op");
  check(throwsInvalid([] { getReduceFn(DataType::kInt32, ReduceOp::kAvg); }), "int avg kernel");
  check(throwsInvalid([] { getReduceFn(DataType::kFloat64, ReduceOp::kBand); }), "float band");
  check(throwsInvalid([] { rr::checkReduction(DataType::kBool, ReduceOp::kAvg); }), "bool avg");
  rr::checkReduction(DataType::kInt32, ReduceOp::kAvg);  // accepted: exact (int_avg.h)
  check(throwsInvalid([] { rr::checkReduction(DataType::kFloat32, ReduceOp::kBxor); }),
        "float bxor");
  rr::checkReduction(DataType::kUInt64, ReduceOp::kBand);  // accepted
  rr::checkReduction(DataType::kBFloat16, ReduceOp::kAvg);  // accepted
  float f[4] = {};
  check(throwsInvalid([&] { widen(DataType::kFloat32, f, f, 1); }), "widen f32");
  check(throwsInvalid([&] { finalize(DataType::kInt32, ReduceOp::kAvg, 0, f, f, 1); }),
        "world 0");
  check(throwsInvalid([&] { finalize(DataType::kInt32, ReduceOp::kSum, 1, nullptr, f, 1); }),
        "null acc");
  check(throwsInvalid([&] { finalize(DataType::kBFloat16, ReduceOp::kAvg, 2, f, f + 1, 2); }),
        "16-bit finalize with overlapping acc/dst");
  finalize(DataType::kFloat16, ReduceOp::kAvg, 2, nullptr, nullptr, 0);  // n = 0: no-op
  widen(DataType::kBFloat16, nullptr, nullptr, 0);
  getReduceFn(DataType::kFloat64, ReduceOp::kSum)(nullptr, nullptr, 0);
  check(true, "n = 0 with null pointers");
}

template <class Fn>
double bestSeconds(Fn fn, size_t reps) {
  double best = 1e30;
  for (int trial = 0; trial < 5; ++trial) {
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t r = 0; r < reps; ++r) fn();
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / double(reps));
  }
  return best;
}

// Throughput per path; "array" is the float32 operand size, GB/s(traffic) counts every
// byte read and written (3x the array for reduce, 1.5x for the 16-bit conversions).
void bench() {
  std::printf("%-8s %-18s %9s %12s %14s\n", "isa", "kernel", "array", "GB/s(array)",
              "GB/s(traffic)");
  for (size_t bytes : {size_t(256) << 10, size_t(8) << 20, size_t(64) << 20}) {
    const size_t n = bytes / 4, reps = std::max<size_t>(1, (size_t(256) << 20) / bytes);
    std::vector<float> a(n, 1.0f), b(n, 1e-30f), acc(n, 1.0f);
    std::vector<uint16_t> h(n, 0x3C00);
    auto report = [&](const char* isa, const char* name, double sec, double traffic) {
      std::printf("%-8s %-18s %8zuK %12.1f %14.1f\n", isa, name, bytes >> 10,
                  bytes / sec / 1e9, traffic * bytes / sec / 1e9);
    };
    report("-", "memcpy", bestSeconds([&] { std::memcpy(a.data(), b.data(), bytes); }, reps), 2);
    for (Isa isa : gPaths) {
      const char* name = rd::toString(isa);
      auto timeReduce = [&](DataType t, ReduceOp op) {
        auto fn = rd::reduceFnFor(isa, t, op);
        return bestSeconds([&] { fn(a.data(), b.data(), bytes / rr::elementSize(t)); }, reps);
      };
      auto timeFinalize = [&](DataType t) {
        return bestSeconds(
            [&] { rd::finalizeFor(isa, t, ReduceOp::kAvg, 3, acc.data(), h.data(), n); }, reps);
      };
      report(name, "f32 sum", timeReduce(DataType::kFloat32, ReduceOp::kSum), 3);
      report(name, "f32 min", timeReduce(DataType::kFloat32, ReduceOp::kMin), 3);
      report(name, "i8 prod", timeReduce(DataType::kInt8, ReduceOp::kProd), 3);
      report(name, "f16 widen",
             bestSeconds([&] { rd::widenFor(isa, DataType::kFloat16, h.data(), acc.data(), n); },
                         reps), 1.5);
      report(name, "f16 avg finalize", timeFinalize(DataType::kFloat16), 1.5);
      report(name, "bf16 avg finalize", timeFinalize(DataType::kBFloat16), 1.5);
    }
  }
}

}  // namespace

int run(int argc, char** argv) {
  const char* want = std::getenv("RINGREDUCE_ISA");
  bool doBench = false, list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--isa" && i + 1 < argc) {
      want = argv[++i];
    } else if (a == "--bench") {
      doBench = true;
    } else if (a == "--list-isas") {
      list = true;
    } else {
      std::fprintf(stderr, "usage: %s [--isa scalar|avx2|avx512] [--list-isas] [--bench]\n",
                   argv[0]);
      return 2;
    }
  }
  for (int i = 0; i <= static_cast<int>(rd::bestIsa()); ++i) {
    gPaths.push_back(static_cast<Isa>(i));
  }
  if (list) {
    for (Isa i : gPaths) std::printf("%s\n", rd::toString(i));
    return 0;
  }
  if (want != nullptr && *want != '\0') {
    const Isa isa = rd::parseIsa(want);
    rd::setMaxIsa(isa);
    check(std::strcmp(rr::reduce::isaName(), want) == 0,
          std::string("forced ISA ") + want + " is active (CPU best: " +
              rd::toString(rd::bestIsa()) + ", active: " + rr::reduce::isaName() + ")");
  }
  std::printf("reduce_check: isa=%s (best %s)\n", rr::reduce::isaName(),
              rd::toString(rd::bestIsa()));
  if (doBench) {
    bench();
    return 0;
  }
  checkReduce<float>(DataType::kFloat32);
  checkReduce<double>(DataType::kFloat64);
  checkReduce<int8_t>(DataType::kInt8);
  checkReduce<uint8_t>(DataType::kUInt8);
  checkReduce<int32_t>(DataType::kInt32);
  checkReduce<int64_t>(DataType::kInt64);
  checkReduce<int16_t>(DataType::kInt16);
  checkReduce<uint16_t>(DataType::kUInt16);
  checkReduce<uint32_t>(DataType::kUInt32);
  checkReduce<uint64_t>(DataType::kUInt64);
  checkBool();
  checkNanPropagation<float>(DataType::kFloat32);
  checkNanPropagation<double>(DataType::kFloat64);
  checkIntegerWrap();
  checkFinalize<float>(DataType::kFloat32);
  checkFinalize<double>(DataType::kFloat64);
  checkFinalize<int8_t>(DataType::kInt8);
  checkFinalize<uint8_t>(DataType::kUInt8);
  checkFinalize<int32_t>(DataType::kInt32);
  checkFinalize<int64_t>(DataType::kInt64);
  checkConversions("");
#if defined(__x86_64__) || defined(__i386__)
  // The conversions must not depend on MXCSR: rerun them with flush-to-zero and
  // denormals-are-zero set (as torch.set_flush_denormal(True) does).
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040);
  checkConversions(" [FTZ+DAZ]");
  _mm_setcsr(csr);
#endif
  checkErrors();
  std::printf("reduce_check: %d passed, %d failed\n", gPassed, gFailed);
  return gFailed == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "reduce_check: error: %s\n", e.what());
    std::printf("reduce_check: %d passed, %d failed\n", gPassed, gFailed + 1);
    return 1;
  }
}
