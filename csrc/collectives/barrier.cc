// Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k.
// After ceil(log2 n) rounds every rank has (transitively) heard from every other rank,
// for any n, not only powers of two. Frames carry no payload.
#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "core/chunking.h"

namespace rr::collectives {

void barrier(Communicator& c) {
  const int n = c.world(), r = c.rank();
  if (n == 1) {
    c.skip();
    return;
  }
  const Algorithm a = planBarrier(c);
  transport::FrameHeader h =
      c.begin(CollectiveKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, a, 0, 0);
  if (a == Algorithm::kShm) {
    shm::barrier(c, h);
    return;
  }
  uint32_t round = 0;
  for (int dist = 1; dist < n; dist <<= 1, ++round) {
    h.step = round;
    transport::SendOp s;
    transport::RecvOp rv;
    s.reset(h, nullptr, 0);
    rv.reset(h, nullptr, 0);
    c.sendRecv(chunking::mod(r + dist, n), &s, chunking::mod(r - dist, n), &rv);
  }
}

}  // namespace rr::collectives
