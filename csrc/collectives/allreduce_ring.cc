// Ring all-reduce = reduce-scatter + all-gather over the ring engine (ring.h).
//
// With n ranks each rank sends and receives 2(n-1)/n of the buffer -- bandwidth-optimal.
// Steps 0..n-2 reduce: after them rank r holds the complete reduction of chunk (r+1) mod n
// in `acc`; that chunk is finalized (avg division, rounding float32 -> 16-bit) segment by
// segment as it completes, straight into the user's buffer. Steps n-1..2n-3 circulate the
// finished chunks in the user's dtype. Every chunk is reduced by exactly one chain of ranks
// and then copied, so all ranks end with bit-identical results.
//
// 16-bit floats: with a 16-bit wire (the default) the reduce steps send 16-bit partials too
// -- each rank adds its values in float32 and rounds once before passing the chunk on, so a
// chunk's sum is rounded n-1 times (n-2 hops + the final one) and each rank sends
// 2(n-1)/n * count * 2 bytes. With RINGREDUCE_HALF_WIRE=32 the partials travel as float32
// (`acc` is a widened copy) and are rounded once, for 1.5x the bytes. A float16 avg
// sends a 16-bit partial sum of m values scaled by 2^-ceil(log2 m) so that none overflows
// (ring.h, half_avg.h); under the hierarchical all-reduce the inputs arrive scaled (its host level
// rounds to 16 bits too) and the finished sums are scaled back here.
#include <algorithm>

#include "collectives/allreduce_impl.h"
#include "collectives/half_avg.h"
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
  // One scratch slot: the received segment, then (16-bit wire) two float32 segments.
  const size_t recvBytes = (p.segElems * a.accElem + 63) / 64 * 64;
  char* scratch = c.scratch().get(comm::ScratchArena::kRecv,
                                  recvBytes + (a.halfWire ? 2 * p.segElems * sizeof(float) : 0));
  p.recvScratch = scratch;
  p.reduceFn = a.reduceFn;
  if (a.halfWire) {
    p.halfWire = true;
    p.half = a.dtype;
    p.wide = reinterpret_cast<float*>(scratch + recvBytes);
  }
  p.scaleHops = a.halfAvgHops;
  if (a.needsFinalize()) {
    p.onFinal = [&a, &p, world](char* vals, size_t off, size_t len) {
      if (a.inputScaleExp) halfavg::scaleFloat(reinterpret_cast<float*>(vals), len, a.inputScaleExp);
      reduce::finalize(a.dtype, a.op, world, vals, p.dst + off * p.dstElem, len);
    };
  }
  runRing(c, h, p);
}

}  // namespace rr::collectives
