#include "collectives/shm_common.h"

#include <errno.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "transport/shm/cma.h"

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

// This rank's line of `round`: descriptor h and the payload; then peers may read it.
void writeLine(ShmDomain& d, const transport::FrameHeader& h, const void* payload,
               size_t bytes, uint64_t round) {
  d.linePrevRound(round) = round;
  transport::shm::LineHeader& L = d.line(d.rank(), round);
  describe(h, &L);
  if (bytes) std::memcpy(d.linePayload(d.rank(), round), payload, bytes);
  L.round.store(round, std::memory_order_release);
  d.notify();
}

// Wait for local rank r's line of `round`, then check it describes the same collective.
void awaitLine(comm::Communicator& c, const transport::FrameHeader& h, int r, uint64_t round) {
  ShmDomain& d = *c.shm();
  transport::shm::LineHeader& P = d.line(r, round);
  waitFor(c, [&] { return P.round.load(std::memory_order_acquire) == round; }, [&] { return r; });
  std::string mm = transport::describeMismatch(described(P, h), h, c.options().p2pChannel,
                                               c.label(d.globalRank(r)), c.label(c.rank()),
                                               c.options().rankLabels);
  if (!mm.empty())
    throw MismatchError(detail::concat("rank ", c.label(d.globalRank(r)), " (shared memory): ", mm),
                        -1, d.globalRank(r));
}

}  // namespace

std::string ranksWithout(comm::Communicator& c, const transport::FrameHeader& h, bool ok) {
  ShmDomain& d = *c.shm();
  const uint8_t mine = ok ? 1 : 0;
  const uint64_t rd = lineRound(c, h, &mine, 1);
  std::string out;
  for (int r = 0; r < d.world(); ++r)
    if (*reinterpret_cast<const uint8_t*>(d.linePayload(r, rd)) != 1)
      out += (out.empty() ? "" : ", ") + std::to_string(c.label(d.globalRank(r)));
  lineRelease(c, rd);
  return out;
}

void ensureSlots(comm::Communicator& c, const transport::FrameHeader& h) {
  ShmDomain& d = *c.shm();
  if (!d.slotsPending()) return;
  const std::string short_ = ranksWithout(c, h, d.allocOwnSlots());
  d.finishSlots(short_.empty());
  if (!short_.empty())
    RR_THROW(Error, "cannot allocate ", d.firstSlotBytes() >> 10, " KiB of shared memory per "
             "rank for the slots of ", c.options().groupName.empty() ? "this communicator"
             : c.options().groupName, " on rank(s) ", short_, ": /dev/shm is full or too small "
             "(free it, destroy groups no longer used, enlarge it (docker --shm-size), or set "
             "RINGREDUCE_TRANSPORT=tcp)");
}

uint64_t lineRound(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
                   size_t bytes) {
  ShmDomain& d = *c.shm();
  const int n = d.world(), me = d.rank();
  const uint64_t round = d.nextRound();
  // Our line of `round` was last used in round - 2: may it be rewritten, i.e. has every
  // peer finished reading it (lineDone >= round - 2)? In a collective always yes, without
  // looking: a peer that reached this round completed round - 1, for which it read *our*
  // line of round - 1, which we wrote only after lineRelease(round - 2) (every lineRound is
  // released before the next one; a collective that throws in between poisons the
  // communicator). So neither this check nor a wake-up at lineRelease is needed -- each was
  // a cross-core cache miss (and a fence) per round. RR_SHM_CHECK_LINES builds verify it.
  // On a point-to-point channel a sender may have run ahead (lineSend): there it waits.
  if (c.options().p2pChannel) lineWaitFree(c, round);
#ifdef RR_SHM_CHECK_LINES
  if (uint64_t prev = d.linePrevRound(round); prev != 0) {
    for (int r = 0; r < n; ++r)
      if (r != me && d.ctl(r).lineDone.v.load(std::memory_order_acquire) < prev)
        RR_THROW(Error, "shared-memory line reused before rank ", r, " released it");
  }
#endif
  writeLine(d, h, payload, bytes, round);
  for (int r = 0; r < n; ++r)
    if (r != me) awaitLine(c, h, r, round);
  // A peer that published its line and then gave up waiting for ours (its timeout) has
  // failed this communicator: this rank, finding every line there without waiting, must
  // fail too -- not return as if the collective had completed everywhere (gloo's late rank
  // raises). Only a peer that did not finish this round (lineDone): one that completed it
  // and then failed -- rr.abort() right after -- concerns the next call, not this one.
  // A clean cache line per peer (abortCode is written only on failure).
  for (int r = 0; r < n; ++r)
    if (r != me && d.abortOf(r, nullptr) &&
        d.ctl(r).lineDone.v.load(std::memory_order_acquire) < round)
      c.checkLocalAborts();
  return round;
}

uint64_t lineSend(comm::Communicator& c, const transport::FrameHeader& h, const void* payload,
                  size_t bytes) {
  ShmDomain& d = *c.shm();
  const uint64_t round = d.nextRound();
  lineWaitFree(c, round);
  // The receiver may have failed this channel (a size mismatch on a message this rank sent
  // before): say so now, not never -- the line may be free without waiting (found by a
  // helper: a third send "succeeded" after the receiver had failed on the second).
  c.checkLocalAborts();
  writeLine(d, h, payload, bytes, round);
  lineRelease(c, round);
  return round;
}

uint64_t lineReceive(comm::Communicator& c, const transport::FrameHeader& h, int from) {
  ShmDomain& d = *c.shm();
  const uint64_t round = d.nextRound();
  d.linePrevRound(round) = round;
  awaitLine(c, h, from, round);
  return round;
}

void cmaRead(comm::Communicator& c, int from, uint64_t addr, char* dst, size_t len,
             const char* what) {
  constexpr size_t kPiece = 64 << 20;  // one call per 64 MiB: ~6 ms here; smaller pieces
                                       // pin pages in more calls and read slower
  ShmDomain& d = *c.shm();
  const int peer = d.globalRank(from);
  const auto pid = static_cast<pid_t>(d.ctl(from).pid.v.load(std::memory_order_relaxed));
  for (size_t o = 0; o < len; o += kPiece) {
    const int err = transport::shm::readFrom(pid, addr + o, dst + o, std::min(kPiece, len - o));
    if (err) {
      c.checkAlive(peer);  // a dead peer is named as such
      if (err == ESRCH)  // gone before its pidfd said so: no setting would have helped
        throw PeerError(peer, PeerCause::kClosed, detail::concat(
            "rank ", c.label(peer), " (pid ", pid, ") exited (its process is gone: crashed "
            "or killed) while this rank read its buffer in ", c.describeCurrent()));
      RR_THROW(Error, what, ": reading rank ", c.label(peer), "'s buffer (process_vm_readv, pid ",
               pid, ") failed: ", std::strerror(err), "; RINGREDUCE_CMA=0 avoids it");
    }
    // Progress for stall reports and heartbeats, piece by piece (a 2 GiB read into
    // untouched memory takes seconds). Between pieces: after the last one the read is done
    // (a peer's failure after it is the next wait's or call's, as in waitFor).
    c.addBytesDone(std::min(kPiece, len - o));
    if (o + kPiece < len) c.checkAlive(peer);
  }
  d.addCmaBytes(len);
}

void lineWaitFree(comm::Communicator& c, uint64_t round) {
  const uint64_t prev = c.shm()->linePrevRound(round);
  if (prev != 0) lineWaitRead(c, prev);
}

void lineWaitRead(comm::Communicator& c, uint64_t round) {
  ShmDomain& d = *c.shm();
  for (int r = 0; r < d.world(); ++r) {
    if (r == d.rank()) continue;
    std::atomic<uint64_t>& done = d.ctl(r).lineDone.v;
    waitFor(c, [&] { return done.load(std::memory_order_acquire) >= round; }, [&] { return r; });
  }
}

void lineRelease(comm::Communicator& c, uint64_t round) {
  // Nobody waits for lineDone (see lineRound): recorded for diagnostics and checked builds,
  // no wake-up.
  ShmDomain& d = *c.shm();
  d.ctl(d.rank()).lineDone.v.store(round, std::memory_order_release);
}

}  // namespace rr::collectives::shm
