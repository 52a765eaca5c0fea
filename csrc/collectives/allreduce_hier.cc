// Hierarchical all-reduce for several hosts with L ranks each (shared memory inside a host,
// TCP between hosts). The buffer is cut into L slices; local rank l drives slice l:
//
//   host A: a0 a1      1. all-reduce inside each host over shared memory (op sum)
//   host B: b0 b1      2. a0 <-> b0 ring all-reduce slice 0 over TCP, a1 <-> b1 slice 1,
//                         all slices at once, so every rank's NIC/core share works
//                      3. inside each host, local rank l broadcasts its finished slice l
//
// Each slice is reduced by exactly one cross-host ring and then copied, so every rank gets
// identical bits. avg divides once, by the total number of ranks, at the end of step 2.
// float16 avg (half_avg.h): step 1 scales each local sum of L values by 2^-ceil(log2 L)
// before rounding it, step 2's ring scales a partial sum of m hosts' sums by
// 2^-ceil(log2 m) as it goes and its finished sums back by 2^ceil(log2 L): no rounded sum
// exceeds 65504, and no input is rounded before it is added.
// 16-bit floats are rounded after the local level, then as the cross-host ring rounds them:
// once per hop with a 16-bit wire (RINGREDUCE_HALF_WIRE=16), else once.
#include <algorithm>
#include <vector>

#include "collectives/allreduce_impl.h"
#include "collectives/half_avg.h"
#include "collectives/shm_algos.h"
#include "core/chunking.h"
#include "core/error.h"

namespace rr::collectives {

void allreduceHier(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
                   const std::vector<int>& slicePeers) {
  transport::shm::ShmDomain& d = *c.shm();
  const int L = d.world(), me = d.rank();
  const size_t es = elementSize(a.dtype);
  const bool halfAvg = halfavg::applies(a.dtype, a.op, c.world());
  // 1. local sum (avg finishes in step 2)
  AllreduceArgs local = a;
  if (a.op == ReduceOp::kAvg) local.op = ReduceOp::kSum;
  if (halfAvg) local.sumScaleExp = chunking::ceilLog2(L);
  shm::allreduce(c, h, local);
  // 2. my slice across hosts (16-bit floats add in float32 again; see allreduce_ring.cc)
  const size_t off = chunking::chunkOffset(a.count, L, me), len = chunking::chunkLen(a.count, L, me);
  RR_CHECK(slicePeers.size() > 1, "hierarchical all-reduce needs several hosts");
  if (len > 0) {
    AllreduceArgs g = a;
    g.count = len;
    g.dst = a.dst + off * es;
    g.acc = g.dst;
    g.halfWire = halfOnWire(c, a.dtype);
    g.halfAvgHops = halfAvg && g.halfWire;
    g.inputScaleExp = local.sumScaleExp;
    if (g.halfWire) {
      g.accElem = es;
    } else if (isHalf(a.dtype)) {
      float* acc = reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kAcc, len * 4));
      reduce::widen(a.dtype, g.dst, acc, len);
      g.acc = reinterpret_cast<char*>(acc);
    }
    // Frames keep the collective's total count: a peer checks them (also as early data)
    // against the header of the collective it is in.
    allreduceRing(c, h, g, &slicePeers);
  }
  // 3. every local rank broadcasts its finished slice to the others
  for (int l = 0; l < L; ++l) {
    const size_t o = chunking::chunkOffset(a.count, L, l), n = chunking::chunkLen(a.count, L, l);
    transport::FrameHeader bh = h;
    bh.kind = static_cast<uint8_t>(CollectiveKind::kBroadcast);
    bh.root = l;
    bh.count = n;
    if (n > 0) shm::broadcast(c, bh, a.dst + o * es, n * es, l);
  }
}

}  // namespace rr::collectives
