// Building blocks of the shared-memory collectives (internal to collectives/).
#pragma once

#include <cstddef>

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
// This rank has finished reading peers' lines of `round`: they may reuse them.
void lineRelease(comm::Communicator& c, uint64_t round);

// Wait until pred() holds, checking deadline/peer liveness; `lagging()` names the local
// rank being waited for in errors (-1: unknown).
template <typename Pred, typename Lag>
void waitFor(comm::Communicator& c, Pred pred, Lag lagging) {
  ShmDomain& d = *c.shm();
  d.waitUntil(
      pred,
      [&] {
        int l = lagging();
        c.checkAlive(l < 0 ? -1 : d.globalRank(l));
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
