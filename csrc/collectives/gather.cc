// Gather, direct: every rank sends its block straight to the root, which receives block p
// into out + p * count (no staging copies, no relaying: each byte crosses the wire once).
// The root takes the blocks in rank order; senders block only until their socket buffer
// (or the root) has taken the frame. With every rank on one host: shm_rooted.cc.
//
//     r1 ---.
//     r2 ----> root
//     r3 ---'
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"

namespace rr::collectives {

void gather(Communicator& c, const void* in, void* out, size_t count, DataType dtype, int root) {
  const int n = c.world(), me = c.rank();
  const size_t bytes = count * elementSize(dtype);
  c.checkUsable();  // before `out` is touched
  if (me == root && bytes > 0) {
    char* mine = static_cast<char*>(out) + static_cast<size_t>(me) * bytes;
    if (mine != in) std::memmove(mine, in, bytes);
  }
  if (bytes == 0 || n == 1) {
    c.skip();
    return;
  }
  const Algorithm a = planDirect(c, CollectiveKind::kGather, bytes * static_cast<size_t>(n));
  transport::FrameHeader h = c.begin(CollectiveKind::kGather, dtype, ReduceOp::kSum, root, a,
                                     count, bytes * static_cast<size_t>(n));
  if (a == Algorithm::kShm) {
    shm::gather(c, h, static_cast<const char*>(in), static_cast<char*>(out), bytes, root);
    return;
  }
  if (me != root) {
    transport::SendOp s;
    s.reset(h, in, bytes);
    c.sendRecv(root, &s, -1, nullptr);
    return;
  }
  for (int p = 0; p < n; ++p) {
    if (p == root) continue;
    transport::RecvOp r;
    r.reset(h, static_cast<char*>(out) + static_cast<size_t>(p) * bytes, bytes);
    c.sendRecv(-1, nullptr, p, &r);
  }
}

}  // namespace rr::collectives
