// op=avg on float16 where partial sums are rounded to 16 bits on the way (over TCP with
// RINGREDUCE_HALF_WIRE=16, the default; the hierarchical all-reduce's local level always):
// a sum of n values above 65504 / n is inf in float16 although their average fits. So each
// input is scaled by 1/n first (in float32, rounded once to float16: exact when n is a power
// of two) and the collective sums, as NCCL's ncclAvg pre-multiplies floating-point inputs.
// bfloat16 has float32's range; shared memory and RINGREDUCE_HALF_WIRE=32 add in float32.
#pragma once

#include <cstddef>

#include "core/types.h"

namespace rr::collectives::halfavg {

// Whether an avg of `t` whose partials are rounded to 16 bits (`rounds`) is pre-scaled.
inline bool applies(DataType t, ReduceOp op, bool rounds) {
  return rounds && op == ReduceOp::kAvg && t == DataType::kFloat16;
}

// buf[i] = float16(float(buf[i]) / n), in place.
void prescale(void* buf, size_t count, int n);

}  // namespace rr::collectives::halfavg
