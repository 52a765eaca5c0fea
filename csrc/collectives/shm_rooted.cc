// Shared-memory gather and scatter (all ranks on one host). Small (a block, for scatter
// all blocks, fit in a line): one line round carries them, as the small broadcast does.
// Otherwise blocks travel through the chunk slots in cache-sized pieces, several in flight, copied once into the slots and
// once out. Global chunk numbers: block p occupies [base + p*G, base + (p+1)*G).
//
// Gather: each rank p publishes its block's chunks in its own slots (pub); the root copies
// them out rank by rank, in chunk order, and counts them in its fin (a publisher reuses a
// slot once the root's fin passed the chunk it held).
//
// Scatter: where the kernel lets ranks read each other (cma.h, RINGREDUCE_CMA), rank p reads
// block p straight from the root's buffer (one copy, in parallel), then a line round keeps
// that buffer alive until all have. Otherwise the root publishes block p's chunks in its
// slots for p = 0, 1, ...; rank p copies its own chunks out. Every rank first moves its fin
// to the start of its block (it never reads the chunks before) and to the end after it, so
// the root's "every fin passed this slot's previous chunk" waits only on the rank that
// reads it. The root copies its own block while the others read theirs (before, at the start,
// it held them back by that copy: 2 ranks, 64 MiB, 12.4 ms where 6-7 suffice).
#include <algorithm>
#include <cstring>

#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/shm_common.h"
#include "core/chunking.h"

namespace rr::collectives::shm {

using transport::shm::Control;
using transport::shm::reached;

namespace {

// The root's own block of `in`, into its `out`.
void keepRootBlock(const char* in, char* out, size_t bytes, int me) {
  const char* mine = in + static_cast<size_t>(me) * bytes;
  if (mine != out) std::memmove(out, mine, bytes);
}

// Keep every counter of every rank in step at the end, whatever its role was.
void finish(comm::Communicator& c, ShmDomain& d, uint32_t chunks, size_t bytes) {
  const uint32_t end = d.chunkBase() + chunks;
  Control& mine = d.ctl(d.rank());
  mine.pub.v.store(end, std::memory_order_release);
  mine.red.v.store(end, std::memory_order_release);
  mine.fin.v.store(end, std::memory_order_release);
  d.notify();
  c.addBytesDone(bytes);
  d.advanceChunks(chunks);
}

}  // namespace

void gather(comm::Communicator& c, const transport::FrameHeader& h, const char* in, char* out,
            size_t bytes, int root) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  if (shmOneRound(c, bytes)) {  // every block rides in its rank's line: one round
    const uint64_t rd = lineRound(c, h, me == root ? nullptr : in, me == root ? 0 : bytes);
    if (me == root)
      for (int p = 0; p < n; ++p)
        if (p != root) std::memcpy(out + static_cast<size_t>(p) * bytes, d.linePayload(p, rd), bytes);
    lineRelease(c, rd);
    c.addBytesDone(bytes);
    return;
  }
  ensureSlots(c, h);
  lineRelease(c, lineRound(c, h, nullptr, 0));
  const size_t cb = d.config().copyBytes;
  const uint32_t G = static_cast<uint32_t>(chunking::numSegments(bytes, cb));
  const uint32_t base = d.chunkBase(), K = static_cast<uint32_t>(d.config().slots);
  Control& mine = d.ctl(me);
  for (uint32_t k = 0; k < G; ++k) {
    const size_t off = k * cb, len = std::min(cb, bytes - off);
    if (me != root) {
      const uint32_t g = base + static_cast<uint32_t>(me) * G + k;
      std::atomic<uint32_t>& rf = d.ctl(root).fin.v;
      waitFor(c, [&] { return reached(rf.load(std::memory_order_acquire), g - K + 1); },
              [&] { return root; });
      std::memcpy(d.slot(me, g), in + off, len);
      mine.pub.v.store(g + 1, std::memory_order_release);
      d.notify();
    }
  }
  if (me == root) {
    for (int p = 0; p < n; ++p) {
      for (uint32_t k = 0; k < G; ++k) {
        const uint32_t g = base + static_cast<uint32_t>(p) * G + k;
        if (p != root) {
          const size_t off = k * cb, len = std::min(cb, bytes - off);
          std::atomic<uint32_t>& pp = d.ctl(p).pub.v;
          waitFor(c, [&] { return reached(pp.load(std::memory_order_acquire), g + 1); },
                  [&] { return p; });
          std::memcpy(out + static_cast<size_t>(p) * bytes + off, d.slot(p, g), len);
        }
        mine.fin.v.store(g + 1, std::memory_order_release);
        d.notify();
      }
    }
  } else {
    // The root reads our last chunks after we return: keep them until its fin passed.
    const uint32_t last = base + static_cast<uint32_t>(me + 1) * G;
    std::atomic<uint32_t>& rf = d.ctl(root).fin.v;
    waitFor(c, [&] { return reached(rf.load(std::memory_order_acquire), last); },
            [&] { return root; });
  }
  finish(c, d, G * static_cast<uint32_t>(n), bytes);
}

void scatter(comm::Communicator& c, const transport::FrameHeader& h, const char* in, char* out,
             size_t bytes, int root) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  const size_t all = static_cast<size_t>(n) * bytes;
  if (shmOneRound(c, all)) {  // every block rides in the root's line: one round
    const uint64_t rd = lineRound(c, h, me == root ? in : nullptr, me == root ? all : 0);
    if (me != root) std::memcpy(out, d.linePayload(root, rd) + static_cast<size_t>(me) * bytes, bytes);
    else keepRootBlock(in, out, bytes, me);
    lineRelease(c, rd);
    c.addBytesDone(bytes);
    return;
  }
  // The root's line says whether the others may read their blocks straight from `in`
  // (cma.h; the root can read every peer, and permissions are symmetric), and where it is.
  uint64_t meta[2] = {me == root && shmOffersInPlace(c) ? 1u : 0u,
                      reinterpret_cast<uint64_t>(in)};
  const uint64_t rd = lineRound(c, h, meta, me == root ? sizeof meta : 0);
  if (me != root) std::memcpy(meta, d.linePayload(root, rd), sizeof meta);
  lineRelease(c, rd);
  if (meta[0]) {  // one copy per block, all at once; the root waits until all are read
    if (me != root) cmaRead(c, root, meta[1] + static_cast<uint64_t>(me) * bytes, out, bytes, "scatter");
    else keepRootBlock(in, out, bytes, me);  // while they read (first, it delayed them by it)
    lineRelease(c, lineRound(c, h, nullptr, 0));
    if (me == root) c.addBytesDone(bytes);
    return;
  }
  ensureSlots(c, h);
  const size_t cb = d.config().copyBytes;
  const uint32_t G = static_cast<uint32_t>(chunking::numSegments(bytes, cb));
  const uint32_t base = d.chunkBase(), K = static_cast<uint32_t>(d.config().slots);
  Control& mine = d.ctl(me);
  if (me == root) {
    int lag = -1;
    for (int p = 0; p < n; ++p) {
      for (uint32_t k = 0; k < G; ++k) {
        const uint32_t g = base + static_cast<uint32_t>(p) * G + k;
        if (p != root) {
          const size_t off = k * cb, len = std::min(cb, bytes - off);
          waitFor(c, [&] { return allReached(d, [](Control& x) -> auto& { return x.fin.v; },
                                             g - K + 1, &lag); },
                  [&] { return lag; });
          std::memcpy(d.slot(me, g), in + static_cast<size_t>(p) * bytes + off, len);
        }
        mine.pub.v.store(g + 1, std::memory_order_release);
        d.notify();
      }
    }
    keepRootBlock(in, out, bytes, me);  // while the peers copy out their last chunks
    // Peers still read our last chunks: wait until every fin passed them.
    const uint32_t end = base + G * static_cast<uint32_t>(n);
    waitFor(c, [&] { return allReached(d, [](Control& x) -> auto& { return x.fin.v; }, end,
                                       &lag); },
            [&] { return lag; });
  } else {
    const uint32_t first = base + static_cast<uint32_t>(me) * G;
    mine.fin.v.store(first, std::memory_order_release);
    d.notify();
    std::atomic<uint32_t>& rp = d.ctl(root).pub.v;
    for (uint32_t k = 0; k < G; ++k) {
      const uint32_t g = first + k;
      const size_t off = k * cb, len = std::min(cb, bytes - off);
      waitFor(c, [&] { return reached(rp.load(std::memory_order_acquire), g + 1); },
              [&] { return root; });
      std::memcpy(out + off, d.slot(root, g), len);
      mine.fin.v.store(g + 1, std::memory_order_release);
      d.notify();
    }
  }
  finish(c, d, G * static_cast<uint32_t>(n), bytes);
}

}  // namespace rr::collectives::shm
