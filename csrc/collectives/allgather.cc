// Ring all-gather: the copy half of the ring (ring.h) with no reduce steps. Rank r starts by
// sending its own block; after n-1 steps every block has travelled around the ring.
#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/ring.h"

namespace rr::collectives {

void allgather(Communicator& c, const void* in, void* out, size_t count, DataType dtype) {
  const int n = c.world();
  const size_t es = elementSize(dtype);
  char* dst = static_cast<char*>(out);
  char* mine = dst + static_cast<size_t>(c.rank()) * count * es;
  c.checkUsable();  // before the first byte lands in `out`: a failed call leaves it as it was
  if (count > 0 && in != mine) std::memmove(mine, in, count * es);
  if (count == 0 || n == 1) {
    c.skip();
    return;
  }
  const size_t total = count * es * static_cast<size_t>(n);
  const Algorithm a = planGatherAll(c, CollectiveKind::kAllGather, total, count * es);
  transport::FrameHeader h =
      c.begin(CollectiveKind::kAllGather, dtype, ReduceOp::kSum, 0, a, count, total);
  if (a == Algorithm::kShm) {  // from `mine`: an `in` straddling blocks was overwritten above
    shm::allgather(c, h, mine, dst, count * es);
    return;
  }
  RingPlan p;
  p.count = count * static_cast<size_t>(n);
  p.steps = n - 1;
  p.rsSteps = 0;
  p.dst = dst;
  p.dstElem = es;
  p.segElems = std::max<size_t>(1, c.options().segmentBytes / es);
  runRing(c, h, p);
}

}  // namespace rr::collectives
