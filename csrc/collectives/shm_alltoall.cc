// Shared-memory all-to-all (all ranks on one host): a pairwise exchange through the chunk
// slots. First one line round in which every rank publishes its send sizes (n x 8 bytes),
// so every rank knows every block's size and checks what it will receive; when every
// rank's blocks fit in its line after the sizes, they ride along and that round is the
// whole collective. Otherwise round i
// (1 <= i < n): rank r streams its block for (r + i) % n through its own slots while it
// copies the block of (r - i) % n out of that rank's slots, chunk by chunk:
//
//   publish chunk k once its slot is free (its chunk k-K read: by (r+i) within the round,
//            by everyone for a round's first K chunks): copy it in, pub = k+1
//   consume chunk k once (r-i)'s pub passed it: copy it out, fin = k+1
//   -- whichever is possible, so up to K chunks are in flight each way
//
// A round spans the largest block of that round in chunks (identical on every rank), so
// the global chunk numbers stay in step. Each chunk is copied once in and once out.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/shm_common.h"
#include "core/chunking.h"
#include "core/error.h"
#include "transport/shm/cma.h"

namespace rr::collectives::shm {

using transport::shm::Control;
using transport::shm::reached;

namespace {

// 1 when peers may read this rank's blocks in place with process_vm_readv (cma.h): the
// planner offers it (shmOffersInPlace), and nothing this rank writes -- `out`, its own
// block -- overlaps what it sends.
uint64_t cmaLendable(comm::Communicator& c, const char* in, const size_t* sendBytes,
                     const size_t* sendOffs, const char* out, const size_t* recvBytes,
                     const size_t* recvOffs, const OwnBlock& own) {
  if (!shmOffersInPlace(c)) return 0;
  const int n = c.shm()->world();
  auto span = [n](const char* base, const size_t* len, const size_t* off, const char* extra,
                  size_t extraLen) {
    const char *lo = extraLen ? extra : nullptr, *hi = extraLen ? extra + extraLen : nullptr;
    for (int p = 0; p < n; ++p) {
      if (!len[p]) continue;
      const char *a = base + off[p], *b = a + len[p];
      if (!lo || a < lo) lo = a;
      if (!hi || b > hi) hi = b;
    }
    return std::make_pair(lo, hi);
  };
  const auto s = span(in, sendBytes, sendOffs, own.src, own.bytes);
  const auto r = span(out, recvBytes, recvOffs, own.dst, own.bytes);
  if (s.first && r.first && r.first < s.second && s.first < r.second) return 0;
  return 1;
}

}  // namespace

void alltoall(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
              const size_t* sendBytes, const size_t* sendOffs, char* out,
              const size_t* recvBytes, const size_t* recvOffs, const OwnBlock& own) {
  ShmDomain& d = *c.shm();
  // This rank's block to itself: copied a chunk at a time while the exchange would
  // otherwise wait for a peer, the rest at the end (memcpy: the caller checked that the
  // two ranges do not overlap).
  size_t ownDone = 0;
  auto copyOwn = [&](size_t most) {
    const size_t len = std::min(most, own.bytes - ownDone);
    if (len) std::memcpy(own.dst + ownDone, own.src + ownDone, len);
    ownDone += len;
    return len > 0;
  };
  const int me = d.rank(), n = d.world();
  const size_t sizes = static_cast<size_t>(n) * sizeof(uint64_t), small = d.config().smallMax;
  size_t sendTotal = 0;
  for (int p = 0; p < n; ++p) sendTotal += sendBytes[p];
  // The line carries the sizes; where they fit, the send offsets and a CMA word (cma.h:
  // this rank's `in` may be read in place) and `in`'s address; then -- when they fit --
  // the blocks packed in rank order.
  const bool cmaLayout = 2 * sizes + 16 <= small;
  const size_t head = sizes + (cmaLayout ? sizes + 16 : 0);
  const size_t lineLen = head + (head + sendTotal <= small ? sendTotal : 0);
  char* line = c.scratch().get(comm::ScratchArena::kExtra, lineLen);
  for (size_t p = 0, at = 0; p < static_cast<size_t>(n); at += sendBytes[p], ++p) {
    const uint64_t b = sendBytes[p], o = sendOffs[p];
    std::memcpy(line + p * sizeof(uint64_t), &b, sizeof b);
    if (cmaLayout) std::memcpy(line + sizes + p * sizeof(uint64_t), &o, sizeof o);
    if (lineLen > head && b) std::memcpy(line + head + at, in + sendOffs[p], b);
  }
  if (cmaLayout) {
    const uint64_t meta[2] = {cmaLendable(c, in, sendBytes, sendOffs, out, recvBytes, recvOffs, own),
                              reinterpret_cast<uint64_t>(in)};
    std::memcpy(line + 2 * sizes, meta, sizeof meta);
  }
  const uint64_t rd = lineRound(c, h, line, lineLen);
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<uint64_t> all(cmaLayout ? 2 * nn + 2 * static_cast<size_t>(n) : nn);
  for (int r = 0; r < n; ++r) {
    const char* l = r == me ? line : d.linePayload(r, rd);
    std::memcpy(&all[static_cast<size_t>(r) * n], l, sizes);
    if (cmaLayout) {
      std::memcpy(&all[nn + static_cast<size_t>(r) * n], l + sizes, sizes);
      std::memcpy(&all[2 * nn + 2 * static_cast<size_t>(r)], l + 2 * sizes, 16);
    }
  }
  auto bytes = [&](int from, int to) { return all[static_cast<size_t>(from) * n + to]; };
  // bytes(me, me) is 0: this rank's own block is `own`.
  for (int p = 0; p < n; ++p)
    if (bytes(p, me) != recvBytes[p])
      throw MismatchError(detail::concat("rank ", c.label(d.globalRank(p)),
                                         " (shared memory): all_to_all count mismatch: it sends ",
                                         bytes(p, me), " bytes to this rank, which expects ",
                                         recvBytes[p], " (send and receive counts must agree)"),
                          -1, d.globalRank(p));
  bool inLines = true;  // every rank's blocks fit its line: this round moved everything
  for (int r = 0; r < n && inLines; ++r) {
    size_t t = 0;
    for (int p = 0; p < n; ++p) t += bytes(r, p);
    inLines = head + t <= small;
  }
  if (inLines) {
    size_t moved = 0;
    for (int p = 0; p < n; ++p) {
      if (p == me || !recvBytes[p]) continue;
      size_t at = 0;
      for (int q = 0; q < me; ++q) at += bytes(p, q);
      std::memcpy(out + recvOffs[p], d.linePayload(p, rd) + head + at, recvBytes[p]);
      moved += recvBytes[p];
    }
    lineRelease(c, rd);
    copyOwn(own.bytes);
    c.addBytesDone(moved);
    return;
  }
  lineRelease(c, rd);
  bool cma = cmaLayout;
  for (int r = 0; r < n && cma; ++r) cma = all[2 * nn + 2 * static_cast<size_t>(r)] == 1;
  if (cma) {
    // Every rank may read every other's `in` where it lies: read our blocks straight into
    // `out` (one copy), then a line round, so no rank returns -- and reuses `in` -- while
    // a peer still reads it.
    for (int i = 1; i < n; ++i) {
      const int from = (me - i + n) % n;
      const uint64_t at = all[2 * nn + 2 * static_cast<size_t>(from) + 1] +
                          all[nn + static_cast<size_t>(from) * n + static_cast<size_t>(me)];
      cmaRead(c, from, at, out + recvOffs[from], recvBytes[from], "all_to_all");
    }
    copyOwn(own.bytes);
    lineRelease(c, lineRound(c, h, nullptr, 0));
    return;
  }
  ensureSlots(c, h);
  const size_t cb = d.config().copyBytes;
  const uint32_t base = d.chunkBase(), K = static_cast<uint32_t>(d.config().slots);
  Control& ctl = d.ctl(me);
  uint32_t off = 0;
  size_t moved = 0;
  for (int i = 1; i < n; ++i) {
    uint32_t G = 0;
    for (int r = 0; r < n; ++r)
      G = std::max(G, static_cast<uint32_t>(chunking::numSegments(bytes(r, (r + i) % n), cb)));
    const int to = (me + i) % n, from = (me - i + n) % n;
    const size_t sb = bytes(me, to), rb = bytes(from, me);
    std::atomic<uint32_t>& tf = d.ctl(to).fin.v;
    std::atomic<uint32_t>& fp = d.ctl(from).pub.v;
    // Publish up to K chunks ahead of what `to` has read, and copy out whatever `from`
    // has published, in whichever order they become possible.
    const uint32_t first = base + off;
    uint32_t P = 0, F = 0;
    int lag = to;
    auto canPublish = [&] {
      if (P >= G) return false;
      const uint32_t g = first + P;
      // The slot's previous chunk (g - K) was read by `to` when it is in this round, else
      // by an earlier round's reader: then every rank must have passed it.
      if (P >= K) {
        lag = to;
        return reached(tf.load(std::memory_order_acquire), g - K + 1);
      }
      return allReached(d, [](Control& x) -> auto& { return x.fin.v; }, g - K + 1, &lag);
    };
    auto canConsume = [&] {
      if (F >= G) return false;
      lag = from;
      return reached(fp.load(std::memory_order_acquire), first + F + 1);
    };
    while (P < G || F < G) {
      bool progressed = false;
      if (canPublish()) {
        const uint32_t g = first + P;
        const size_t o = P * cb;
        if (o < sb) std::memcpy(d.slot(me, g), in + sendOffs[to] + o, std::min(cb, sb - o));
        ctl.pub.v.store(g + 1, std::memory_order_release);
        d.notify();
        ++P;
        progressed = true;
      }
      if (canConsume()) {
        const uint32_t g = first + F;
        const size_t o = F * cb;
        if (o < rb) std::memcpy(out + recvOffs[from] + o, d.slot(from, g), std::min(cb, rb - o));
        ctl.fin.v.store(g + 1, std::memory_order_release);
        d.notify();
        ++F;
        progressed = true;
      }
      if (!progressed && !copyOwn(cb))
        waitFor(c, [&] { return canPublish() || canConsume(); }, [&] { return lag; });
    }
    off += G;
    moved += rb;
  }
  copyOwn(own.bytes);
  // Consumers still read our last chunks: wait until every fin passed them.
  int lag = -1;
  const uint32_t end = base + off;
  waitFor(c, [&] { return allReached(d, [](Control& x) -> auto& { return x.fin.v; }, end, &lag); },
          [&] { return lag; });
  ctl.red.v.store(end, std::memory_order_release);
  c.addBytesDone(moved);
  d.advanceChunks(off);
}

}  // namespace rr::collectives::shm
