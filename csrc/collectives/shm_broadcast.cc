// Shared-memory broadcast and barrier.
//
// Broadcast, small: the root's payload rides in its line (one flag round). Large: the root
// copies chunk k into slot k % K and bumps pub; every other rank copies it out and bumps
// fin; the root reuses a slot once every fin passed the chunk it held. Each byte is copied
// once by the root and once by each receiver.
//
// On a point-to-point channel (Options::p2pChannel: two ranks, the root is the sender) both
// start eagerly (lineSend / lineReceive instead of the line round): a sender returns once
// its message is in its line or slots, before the receive is posted, as MPI's eager sends
// and TCP's do -- so two ranks may both send first. It waits only for line or slot reuse:
// up to two small messages, or slots x copyBytes (2 MiB) of large ones, ahead. A larger
// message, which would wait anyway, is read by the receiver straight from the sender's
// buffer with process_vm_readv where the kernel allows it (RINGREDUCE_CMA). A channel's
// slots exist only once its sender needs them (ShmConfig::lazySlots).
//
// Barrier: the line round itself -- a rank leaves it only after every rank wrote its line.
#include <algorithm>
#include <cstring>

#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/shm_common.h"
#include "core/chunking.h"

namespace rr::collectives::shm {

using transport::shm::Control;

void broadcast(comm::Communicator& c, const transport::FrameHeader& h, char* buf, size_t bytes,
               int root) {
  ShmDomain& d = *c.shm();
  const int me = d.rank();
  const bool oneRound = shmOneRound(c, bytes);
  if (oneRound && c.options().p2pChannel) {
    // A point-to-point message (the root is the sender): eager, see lineSend.
    if (me == root) {
      lineSend(c, h, buf, bytes);
    } else {
      const uint64_t rd = lineReceive(c, h, root);
      std::memcpy(buf, d.linePayload(root, rd), bytes);
      lineRelease(c, rd);
      d.notify();  // the sender may wait for this line (lineSend)
    }
    return;
  }
  if (oneRound) {
    const uint64_t rd = lineRound(c, h, me == root ? buf : nullptr, me == root ? bytes : 0);
    if (me != root) std::memcpy(buf, d.linePayload(root, rd), bytes);
    lineRelease(c, rd);
    return;
  }
  const size_t cb = d.config().copyBytes;
  const uint32_t K = static_cast<uint32_t>(d.config().slots);
  if (!c.options().p2pChannel) {
    ensureSlots(c, h);
    lineRelease(c, lineRound(c, h, nullptr, 0));
  } else if (me == root) {
    // More than the slots hold: the sender would wait for its receiver anyway, so let the
    // receiver read the message in place (one copy, cma.h) when the sender can read it
    // (probed; permissions are symmetric between two processes of one user). Otherwise
    // eager through the slots: a sender that finds them free returns without waiting.
    const uint64_t meta[2] = {bytes > K * cb && shmOffersInPlace(c) ? 1u : 0u,
                              reinterpret_cast<uint64_t>(buf)};
    if (!meta[0]) d.needSlots(me);  // allocated before the receiver may map them
    const uint64_t rd = lineSend(c, h, meta, sizeof meta);
    if (meta[0]) {  // done when the receiver released the line: it has read the buffer
      lineWaitRead(c, rd);
      c.addBytesDone(bytes);
      return;
    }
  } else {
    const uint64_t rd = lineReceive(c, h, root);
    uint64_t meta[2];
    std::memcpy(meta, d.linePayload(root, rd), sizeof meta);
    if (meta[0]) cmaRead(c, root, meta[1], buf, bytes, "recv");
    else d.needSlots(root);  // the sender allocated them before its line
    lineRelease(c, rd);
    d.notify();
    if (meta[0]) return;
  }
  const size_t G = chunking::numSegments(bytes, cb);
  const uint32_t base = d.chunkBase();
  Control& mine = d.ctl(me);
  int lag = -1;
  for (size_t k = 0; k < G; ++k) {
    const uint32_t g = base + static_cast<uint32_t>(k);
    const size_t len = std::min(cb, bytes - k * cb);
    if (me == root) {
      waitFor(c, [&] { return allReached(d, [](Control& x) -> auto& { return x.fin.v; }, g - K + 1, &lag); },
              [&] { return lag; });
      std::memcpy(d.slot(me, g), buf + k * cb, len);
      mine.pub.v.store(g + 1, std::memory_order_release);
    } else {
      std::atomic<uint32_t>& rp = d.ctl(root).pub.v;
      waitFor(c, [&] { return transport::shm::reached(rp.load(std::memory_order_acquire), g + 1); },
              [&] { return root; });
      std::memcpy(buf + k * cb, d.slot(root, g), len);
      mine.fin.v.store(g + 1, std::memory_order_release);
    }
    d.notify();
  }
  // Keep every counter of every rank in step, whatever its role was.
  const uint32_t end = base + static_cast<uint32_t>(G);
  mine.pub.v.store(end, std::memory_order_release);
  mine.red.v.store(end, std::memory_order_release);
  mine.fin.v.store(end, std::memory_order_release);
  d.notify();
  c.addBytesDone(bytes);
  d.advanceChunks(static_cast<uint32_t>(G));
}

void barrier(comm::Communicator& c, const transport::FrameHeader& h) {
  lineRelease(c, lineRound(c, h, nullptr, 0));
}

}  // namespace rr::collectives::shm
