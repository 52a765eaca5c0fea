// Scatter, direct: the root sends block p of `in` straight to rank p (each byte crosses the
// wire once); every other rank receives its block into `out`. The mirror of gather.cc.
// With every rank on one host: shm_rooted.cc.
//
//           .---> r1
//     root -----> r2
//           '---> r3
#include <cstring>

#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"

namespace rr::collectives {

void scatter(Communicator& c, const void* in, void* out, size_t count, DataType dtype, int root) {
  const int n = c.world(), me = c.rank();
  const size_t bytes = count * elementSize(dtype);
  c.checkUsable();  // before `out` is touched
  auto keepMine = [&] {  // the root's own block
    if (me != root || bytes == 0) return;
    const char* mine = static_cast<const char*>(in) + static_cast<size_t>(me) * bytes;
    if (mine != out) std::memmove(out, mine, bytes);
  };
  if (bytes == 0 || n == 1) {
    keepMine();
    c.skip();
    return;
  }
  const Algorithm a = planDirect(c, CollectiveKind::kScatter, bytes * static_cast<size_t>(n));
  transport::FrameHeader h = c.begin(CollectiveKind::kScatter, dtype, ReduceOp::kSum, root, a,
                                     count, bytes * static_cast<size_t>(n));
  if (a == Algorithm::kShm) {
    shm::scatter(c, h, static_cast<const char*>(in), static_cast<char*>(out), bytes, root);
    return;
  }
  if (me != root) {
    transport::RecvOp r;
    r.reset(h, out, bytes);
    c.sendRecv(-1, nullptr, root, &r);
    return;
  }
  // Start with the rank after the root, so that ranks are served in a rotating order.
  for (int i = 1; i < n; ++i) {
    const int p = (root + i) % n;
    transport::SendOp s;
    s.reset(h, static_cast<const char*>(in) + static_cast<size_t>(p) * bytes, bytes);
    c.sendRecv(p, &s, -1, nullptr);
  }
  // Last: the receivers copy their blocks out of their sockets while the root copies its own
  // (first, it delayed every receiver by a copy of a block: 2 ranks, 32 MiB, ~5 ms).
  keepMine();
}

}  // namespace rr::collectives
