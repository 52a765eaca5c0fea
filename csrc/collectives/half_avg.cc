#include "collectives/half_avg.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/chunking.h"
#include "reduce/reduce.h"

namespace rr::collectives::halfavg {

int exponent(DataType t, ReduceOp op, int world) {
  if (t != DataType::kFloat16 || op != ReduceOp::kAvg || world < 2) return 0;
  return chunking::ceilLog2(world);
}

void scaleHalf(const void* src, void* dst, size_t n, int e) {
  // Through float32 in blocks on the stack: widen, scale (exact), round once.
  constexpr size_t kBlock = 1024;
  float tmp[kBlock];
  const auto* s = static_cast<const uint16_t*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t off = 0; off < n; off += kBlock) {
    const size_t len = std::min(kBlock, n - off);
    reduce::widen(DataType::kFloat16, s + off, tmp, len);
    scaleFloat(tmp, len, e);
    reduce::finalize(DataType::kFloat16, ReduceOp::kSum, 1, tmp, d + off, len);
  }
}

void scaleFloat(float* v, size_t n, int e) {
  const float m = std::ldexp(1.0f, e);
  for (size_t i = 0; i < n; ++i) v[i] *= m;
}

}  // namespace rr::collectives::halfavg
