#include "collectives/shm_common.h"

#include <cstring>

#include "core/error.h"

namespace rr::collectives::shm {
namespace {

// A line carries the same collective descriptor as a TCP frame header; these two keep the
// field list in one place so mismatch checks see every field on both transports.
void describe(const transport::FrameHeader& h, transport::shm::LineHeader* L) {
  L->seq = h.seq;
  L->kind = h.kind;
  L->dtype = h.dtype;
  L->op = h.op;
  L->algo = h.algo;
  L->root = h.root;
  L->count = h.count;
}

transport::FrameHeader described(const transport::shm::LineHeader& L,
                                 const transport::FrameHeader& base) {
  transport::FrameHeader h = base;
  h.seq = L.seq;
  h.kind = L.kind;
  h.dtype = L.dtype;
  h.op = L.op;
  h.algo = L.algo;
  h.root = L.root;
  h.count = L.count;
  return h;
}

}  // namespace

uint64_t lineRound(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
                   size_t bytes) {
  ShmDomain& d = *c.shm();
  const int n = d.world(), me = d.rank();
  const uint64_t round = d.nextRound();
  // Our line of `round` was last used in round - 2: may it be rewritten, i.e. has every
  // peer finished reading it (lineDone >= round - 2)? Always yes, without looking: a peer
  // that reached this round completed round - 1, for which it read *our* line of round - 1,
  // which we wrote only after lineRelease(round - 2) (every lineRound is released before
  // the next one; a collective that throws in between poisons the communicator). So
  // neither this check nor a wake-up at lineRelease is needed -- each was a cross-core
  // cache miss (and a fence) per round. RR_SHM_CHECK_LINES builds verify it.
#ifdef RR_SHM_CHECK_LINES
  if (uint64_t prev = d.linePrevRound(round); prev != 0) {
    for (int r = 0; r < n; ++r)
      if (r != me && d.ctl(r).lineDone.v.load(std::memory_order_acquire) < prev)
        RR_THROW(Error, "shared-memory line reused before rank ", r, " released it");
  }
#endif
  d.linePrevRound(round) = round;
  transport::shm::LineHeader& L = d.line(me, round);
  describe(h, &L);
  if (bytes) std::memcpy(d.linePayload(me, round), payload, bytes);
  L.round.store(round, std::memory_order_release);
  d.notify();
  // Wait for every peer's line of this round, then check it describes the same collective.
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    transport::shm::LineHeader& P = d.line(r, round);
    waitFor(c, [&] { return P.round.load(std::memory_order_acquire) == round; }, [&] { return r; });
    std::string mm = transport::describeMismatch(described(P, h), h);
    if (!mm.empty())
      throw MismatchError(detail::concat("rank ", c.label(d.globalRank(r)), " (shared memory): ", mm));
  }
  return round;
}

void lineRelease(comm::Communicator& c, uint64_t round) {
  // Nobody waits for lineDone (see lineRound): recorded for diagnostics and checked builds,
  // no wake-up.
  ShmDomain& d = *c.shm();
  d.ctl(d.rank()).lineDone.v.store(round, std::memory_order_release);
}

}  // namespace rr::collectives::shm
