#include "collectives/shm_common.h"

#include <cstring>

#include "core/error.h"

namespace rr::collectives::shm {

uint64_t lineRound(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
                   size_t bytes) {
  ShmDomain& d = *c.shm();
  const int n = d.world(), me = d.rank();
  const uint64_t round = d.nextRound();
  // Rewrite our line only when every peer finished reading its previous use.
  uint64_t prev = d.linePrevRound(round);
  int lag = -1;
  if (prev != 0) {
    auto done = [&] {
      for (int r = 0; r < n; ++r)
        if (r != me && d.ctl(r).lineDone.v.load(std::memory_order_acquire) < prev) {
          lag = r;
          return false;
        }
      return true;
    };
    waitFor(c, done, [&] { return lag; });
  }
  d.linePrevRound(round) = round;
  transport::shm::LineHeader& L = d.line(me, round);
  L.seq = h.seq;
  L.kind = h.kind;
  L.dtype = h.dtype;
  L.op = h.op;
  L.algo = h.algo;
  L.root = h.root;
  L.count = h.count;
  if (bytes) std::memcpy(d.linePayload(me, round), payload, bytes);
  L.round.store(round, std::memory_order_release);
  d.notify();
  // Wait for every peer's line of this round, then check it describes the same collective.
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    transport::shm::LineHeader& P = d.line(r, round);
    waitFor(c, [&] { return P.round.load(std::memory_order_acquire) == round; }, [&] { return r; });
    transport::FrameHeader got = h;
    got.seq = P.seq;
    got.kind = P.kind;
    got.dtype = P.dtype;
    got.op = P.op;
    got.algo = P.algo;
    got.root = P.root;
    got.count = P.count;
    std::string mm = transport::describeMismatch(got, h);
    if (!mm.empty())
      throw MismatchError(detail::concat("rank ", d.globalRank(r), " (shared memory): ", mm));
  }
  return round;
}

void lineRelease(comm::Communicator& c, uint64_t round) {
  ShmDomain& d = *c.shm();
  d.ctl(d.rank()).lineDone.v.store(round, std::memory_order_release);
  d.notify();
}

}  // namespace rr::collectives::shm
