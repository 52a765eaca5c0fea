// Ring all-reduce = reduce-scatter + all-gather over the ring engine (ring.h).
//
// With n ranks each rank sends and receives 2(n-1)/n of the buffer -- bandwidth-optimal.
// Steps 0..n-2 reduce: after them rank r holds the complete reduction of chunk (r+1) mod n
// in `acc`; that chunk is finalized (avg division, rounding float32 -> 16-bit) segment by
// segment as it completes, straight into the user's buffer. Steps n-1..2n-3 circulate the
// finished chunks in the user's dtype. Every chunk is reduced by exactly one chain of ranks
// and then copied, so all ranks end with bit-identical results.
#include <algorithm>

#include "collectives/allreduce_impl.h"
#include "collectives/ring.h"

namespace rr::collectives {

void allreduceRing(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
                   const std::vector<int>* members) {
  const int n = members ? static_cast<int>(members->size()) : c.world();
  const int world = c.world();
  RingPlan p;
  p.members = members;
  p.count = a.count;
  p.steps = 2 * (n - 1);
  p.rsSteps = n - 1;
  p.shift = 0;
  p.acc = a.acc;
  p.accElem = a.accElem;
  p.dst = a.dst;
  p.dstElem = elementSize(a.dtype);
  p.segElems = std::max<size_t>(1, c.options().segmentBytes / a.accElem);
  p.recvScratch = c.scratch().get(comm::ScratchArena::kRecv, p.segElems * a.accElem);
  p.reduceFn = a.reduceFn;
  if (a.needsFinalize()) {
    p.onFinal = [&a, &p, world](size_t off, size_t len) {
      reduce::finalize(a.dtype, a.op, world, p.acc + off * p.accElem, p.dst + off * p.dstElem, len);
    };
  }
  runRing(c, h, p);
}

}  // namespace rr::collectives
