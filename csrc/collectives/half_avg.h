// op=avg on float16 where partial sums are rounded to float16 on the way (the ring and the
// tree over TCP with a 16-bit wire; the hierarchical all-reduce's host level): a partial sum
// of n finite inputs can exceed float16's range (65504) even when their average fits. NCCL
// multiplies each input by 1/n first; that rounds every input (1/3 is not a float). Here
// the partial sums are scaled by 2^-k, k = ceil(log2 n), which is exact, so that none of n
// finite inputs can exceed 65504, and the finished float32 sum is scaled back by 2^k --
// exact too -- before the one division by n. Scaled partial sums round at the same relative
// precision as unscaled ones, so every result that did not overflow is bit for bit what it
// was without the scaling -- bar values under 2^(k-14), subnormal once scaled, which round
// to 2^(k-24) steps instead of 2^-24.
//
// Where: the ring scales in float32 the partial sums it forwards (ring.cc: no extra pass
// over the buffer); the tree and the hierarchical all-reduce scale the whole input first
// (allreduce.cc) and the finished sums back. With 2 ranks neither the ring nor the tree
// rounds a partial sum: nothing is scaled.
#pragma once

#include <cstddef>

#include "core/types.h"

namespace rr::collectives::halfavg {

// k for an avg over `world` ranks whose partial sums are rounded to `t`: 0 (no scaling)
// unless t is float16, op avg and world > 1.
int exponent(DataType t, ReduceOp op, int world);
// dst = src * 2^e, n float16 values, rounded once (src and dst may be the same buffer).
void scaleHalf(const void* src, void* dst, size_t n, int e);
// v = v * 2^e, n float32 values.
void scaleFloat(float* v, size_t n, int e);

}  // namespace rr::collectives::halfavg
