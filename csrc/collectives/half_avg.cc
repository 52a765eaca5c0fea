#include "collectives/half_avg.h"

#include <algorithm>
#include <vector>

#include "reduce/reduce.h"

namespace rr::collectives::halfavg {

void prescale(void* buf, size_t count, int n) {
  constexpr size_t kBlock = 16384;  // float32 staging, 64 KiB
  std::vector<float> wide(std::min(count, kBlock));
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t len = std::min(kBlock, count - off);
    reduce::widen(DataType::kFloat16, p + off * 2, wide.data(), len);
    reduce::finalize(DataType::kFloat16, ReduceOp::kAvg, n, wide.data(), p + off * 2, len);
  }
}

}  // namespace rr::collectives::halfavg
