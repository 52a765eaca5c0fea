// op=avg on float16 where partial sums are rounded to float16 on the way (the ring and the
// tree over TCP with a 16-bit wire; the hierarchical all-reduce's host level): a partial sum
// of n finite inputs can exceed float16's range (65504) even when their average fits. NCCL
// multiplies each input by 1/n first; that rounds every input (1/3 is not a float). Here
// the partial sums are scaled by a power of two, which is exact, so that none of n finite
// inputs can exceed 65504, and the finished float32 sum is scaled back -- exact too --
// before the one division by n. Scaled partial sums round at the same relative precision
// as unscaled ones, so every result that did not overflow is bit for bit what it was
// without the scaling -- bar values that are subnormal once scaled, which round to steps
// of 2^(s-24) instead of 2^-24 for a scaling by 2^-s.
//
// Where: the ring and the tree scale in float32 the partial sums they forward (ring.cc,
// allreduce_tree.cc: no extra pass over the buffer), a sum of m values by 2^-ceil(log2 m)
// -- what its count needs, so its values stay within a factor 2 of the inputs' magnitude
// (with 2^-k, k = ceil(log2 n), for every hop, gradients of 1e-4 at 5 ranks went
// subnormal: mean error 2.9x the best, a helper); the hierarchical all-reduce scales each
// host's local sum of L values by 2^-ceil(log2 L) as shared memory rounds it, its ring the
// hosts' partial sums as above, and the finished sums back (allreduce_hier.cc). With 2
// ranks neither the ring nor the tree rounds a partial sum: nothing is scaled.
#pragma once

#include <cstddef>

#include "core/types.h"

namespace rr::collectives::halfavg {

// Whether an avg over `world` ranks whose partial sums are rounded to `t` scales them:
// t is float16, op avg and world > 1.
bool applies(DataType t, ReduceOp op, int world);
// v = v * 2^e, n float32 values.
void scaleFloat(float* v, size_t n, int e);

}  // namespace rr::collectives::halfavg
