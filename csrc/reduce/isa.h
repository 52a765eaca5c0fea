// Instruction-set dispatch for the CPU reduce kernels (internal to csrc/reduce and tests).
//
// Each ISA has one KernelTable, built in its own file (kernels_scalar.cc, kernels_avx2.cc,
// kernels_avx512.cc) from the same element-wise templates (reduce_kernels.h), so every path
// gives the same bits. The best ISA is detected once (CPUID via __builtin_cpu_supports,
// which also checks that the OS saves the vector registers); setMaxIsa() can lower it,
// e.g. to test the other paths or to avoid AVX-512 down-clocking. Nothing here reads the
// environment: ringreduce/_env.py owns that (tests/cpp/reduce_check.cc maps RINGREDUCE_ISA
// to setMaxIsa itself).
#pragma once

#include <cstddef>

#include "core/types.h"
#include "reduce/reduce.h"

namespace rr::reduce::detail {

enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kNumIsas = 3;

const char* toString(Isa isa);
// Parses "scalar", "avx2" or "avx512"; throws InvalidArgument otherwise.
Isa parseIsa(const char* name);

// The best ISA this CPU and OS support: avx512 needs AVX-512 F/BW/VL/DQ plus F16C, avx2
// needs AVX2 plus F16C (every AVX2 CPU has it, but we check). Detected once.
Isa bestIsa();
// The ISA used by getReduceFn/widen/finalize: bestIsa() unless lowered by setMaxIsa().
Isa activeIsa();
// Caps the active ISA at `isa` (clamped to bestIsa()). Thread-safe and may be called at any
// time: functions returned earlier stay valid, and every path gives identical bits.
void setMaxIsa(Isa isa);

// One ISA's kernels. Null entries are combinations the table does not serve (16-bit float
// reduce rows); the public functions validate arguments before indexing.
struct KernelTable {
  ReduceFn reduce[kNumDataTypes][kNumReduceOps];
  // 16-bit float -> float32, n elements; pointers need not be aligned.
  void (*widenHalf)(const void* src, float* dst, size_t n);
  void (*widenBf16)(const void* src, float* dst, size_t n);
  // float32 -> 16-bit float: dst[i] = round(acc[i] / divisor); divisor 1 skips the division
  // (dividing by 1 changes no bits that survive the rounding).
  void (*narrowHalf)(const float* acc, void* dst, size_t n, int divisor);
  void (*narrowBf16)(const float* acc, void* dst, size_t n, int divisor);
  // dst[i] = acc[i] / divisor for float32 / float64; acc and dst may be equal.
  void (*divF32)(const void* acc, void* dst, size_t n, int divisor);
  void (*divF64)(const void* acc, void* dst, size_t n, int divisor);
};

const KernelTable& scalarKernels();
const KernelTable& avx2Kernels();    // only valid when bestIsa() >= kAvx2
const KernelTable& avx512Kernels();  // only valid when bestIsa() >= kAvx512
// The table for `isa`; throws InvalidArgument if this CPU cannot run it.
const KernelTable& kernelsFor(Isa isa);

// The public API (reduce.h) on an explicit ISA path, for tests that compare paths in one
// process. Same argument checks and exceptions as the public functions.
ReduceFn reduceFnFor(Isa isa, DataType t, ReduceOp op);
void widenFor(Isa isa, DataType t, const void* src, float* dst, size_t n);
void finalizeFor(Isa isa, DataType t, ReduceOp op, int world, const void* acc, void* dst,
                 size_t n);

}  // namespace rr::reduce::detail
