// Building blocks of the shared-memory collectives (internal to collectives/).
#pragma once

#include <cstddef>
#include <string>

#include "comm/communicator.h"

namespace rr::collectives::shm {

using transport::shm::ShmDomain;

// The one-flag round every shared-memory collective starts with: this rank writes its line
// for the next round (descriptor h + `bytes` of payload, which may be 0), then waits for
// every local peer's line of the same round and checks their descriptors against h
// (MismatchError naming the field otherwise). When it returns, every local rank has entered
// this step, and peers' payloads can be read with linePayload(peer, round) until
// lineRelease(). Returns the round.
uint64_t lineRound(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
                   size_t bytes);
// A line round in which every local rank says whether a step of its own worked (`ok`):
// the labels of the ranks where it did not, ", "-separated ("" when it worked everywhere).
std::string ranksWithout(comm::Communicator& c, const transport::FrameHeader& h, bool ok);
// Before a collective's first use of the slots on a group that allocates them late
// (ShmConfig::slotsLater): every local rank allocates its own, a line round tells the
// others whether that worked, and all map them -- or, when some rank had no room in
// /dev/shm, every rank throws rr::Error naming those ranks and what to do. A no-op after
// the first time and on other communicators.
void ensureSlots(comm::Communicator& c, const transport::FrameHeader& h);
// This rank has finished reading peers' lines of `round`: they may reuse them.
void lineRelease(comm::Communicator& c, uint64_t round);
// Point-to-point channels only (Options::p2pChannel), where a sender runs ahead of its
// receiver: wait until every peer released this rank's line of the round before `round`
// that used the same line, so it may be rewritten. (In a collective that always holds.)
void lineWaitFree(comm::Communicator& c, uint64_t round);
// Wait until every peer released its reading of this rank's line of `round` (lineDone).
void lineWaitRead(comm::Communicator& c, uint64_t round);
// Point-to-point channels: the two halves of a line round, for a small message sent
// eagerly (returning before the receiver reads it, as MPI's and TCP's sends do).
// lineSend writes this rank's line (waiting only while the receiver has not read that
// line's previous use, two messages ago) and releases it. lineReceive waits for `from`'s
// line and checks its descriptor against h (MismatchError: the receiver fails; the sender
// learns it from its abort); read the payload, then lineRelease and notify() -- the
// sender may be waiting for that line.
// Returns the round.
uint64_t lineSend(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
                  size_t bytes);
uint64_t lineReceive(comm::Communicator& c, const transport::FrameHeader& h, int from);
// Read `len` bytes at `addr` in local rank `from`'s process into dst with process_vm_readv
// (transport/shm/cma.h), in pieces between which the deadline and the peers' liveness are
// checked and which count as this collective's progress (addBytesDone); a failed read names
// the peer and `what`.
void cmaRead(comm::Communicator& c, int from, uint64_t addr, char* dst, size_t len,
               const char* what);

// Wait until pred() holds, checking deadline/peer liveness; `lagging()` names the local
// rank being waited for in errors (-1: unknown).
template <typename Pred, typename Lag>
void waitFor(comm::Communicator& c, Pred pred, Lag lagging) {
  ShmDomain& d = *c.shm();
  d.waitUntil(
      pred,
      [&] {
        int l = lagging();
        try {
          c.checkAlive(l < 0 ? -1 : d.globalRank(l));
        } catch (...) {
          // A peer published what this rank waits for, finished, then left or failed
          // between pred() and the check (this rank descheduled there): its data came
          // first (its failure or goodbye is stored after it, with release), so it is here.
          // This wait is over; the failure is the next call's (found under a loaded
          // parallel test run: a barrier failed with "rank 3 left the job" after every
          // rank had published its line; and by the CI, with a relayed abort).
          if (!pred() || !c.deferPeerFailure(std::current_exception())) throw;
        }
      },
      c.spinAllowed());
}

// True when every rank's counter (selected by `field`) has reached `target`.
template <typename Field>
bool allReached(ShmDomain& d, Field field, uint32_t target, int* lag) {
  for (int r = 0; r < d.world(); ++r) {
    if (r == d.rank()) continue;
    if (!transport::shm::reached(field(d.ctl(r)).load(std::memory_order_acquire), target)) {
      *lag = r;
      return false;
    }
  }
  return true;
}

}  // namespace rr::collectives::shm
