#include "collectives/shm_common.h"

#include <cstring>

#include "core/error.h"

namespace rr::collectives::shm {

void lineRound(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
               size_t bytes) {
  ShmDomain& d = *c.shm();
  const int n = d.world(), me = d.rank();
  // Rewrite our line only when every peer finished reading its previous use.
  uint64_t prev = d.linePrevSeq(h.seq);
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
  d.linePrevSeq(h.seq) = h.seq;
  transport::shm::LineHeader& L = d.line(me, h.seq);
  L.kind = h.kind;
  L.dtype = h.dtype;
  L.op = h.op;
  L.algo = h.algo;
  L.root = h.root;
  L.count = h.count;
  if (bytes) std::memcpy(d.linePayload(me, h.seq), payload, bytes);
  L.seq.store(h.seq, std::memory_order_release);
  d.notify();
  // Wait for every peer's line of this seq, then check it describes the same collective.
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    transport::shm::LineHeader& P = d.line(r, h.seq);
    waitFor(c, [&] { return P.seq.load(std::memory_order_acquire) == h.seq; }, [&] { return r; });
    transport::FrameHeader got = h;
    got.kind = P.kind;
    got.dtype = P.dtype;
    got.op = P.op;
    got.algo = P.algo;
    got.root = P.root;
    got.count = P.count;
    std::string mm = transport::describeMismatch(got, h);
    if (!mm.empty()) throw MismatchError(detail::concat("rank ", r, " (shared memory): ", mm));
  }
}

void lineRelease(comm::Communicator& c, uint64_t seq) {
  ShmDomain& d = *c.shm();
  d.ctl(d.rank()).lineDone.v.store(seq, std::memory_order_release);
  d.notify();
}

}  // namespace rr::collectives::shm
