// Element-wise reduction kernels for the CPU, chosen once per (dtype, op).
//
// Contract: every function is pure (no allocation, no locking), safe to call from any
// thread, and deterministic: the same inputs give bit-identical outputs on every rank and
// every CPU (AVX-512, AVX2 or scalar paths all produce the same bits). Pointers need not
// be aligned. n is an element count and may be 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/types.h"

namespace rr::reduce {

// dst[i] = dst[i] OP src[i] for n elements of type t, where t is the *accumulate* type
// (float16/bfloat16 never reach here; they are widened to float32 first).
// Avg reduces like sum; the division happens once in finalize().
// Min/max propagate NaN (a NaN on either side gives NaN), so the result does not depend
// on argument order.
using ReduceFn = void (*)(void* dst, const void* src, size_t n);
ReduceFn getReduceFn(DataType t, ReduceOp op);

// Widen n 16-bit floats (t = kFloat16 or kBFloat16) to float32.
void widen(DataType t, const void* src, float* dst, size_t n);

// Finish a reduction over `world` contributions and store it in the user's type:
//  - t is the user's dtype; acc holds n values of accumulateType(t);
//  - for kAvg the values are divided by world (integers: truncating division, as C does);
//  - for float16/bfloat16 the float32 values are rounded once (round-to-nearest-even).
// acc and dst may alias when t is not a 16-bit float. For ops other than avg on
// non-16-bit types this is a copy (or nothing when acc == dst).
void finalize(DataType t, ReduceOp op, int world, const void* acc, void* dst, size_t n);

// Name of the instruction set picked at run time ("avx512", "avx2" or "scalar").
const char* isaName();

}  // namespace rr::reduce
