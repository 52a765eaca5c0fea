// Shared-memory all-gather and reduce-scatter (all ranks on one host).
//
// Small (the line holds it): one line round. All-gather: each rank's block rides in its line
// and every rank copies the others' out. Reduce-scatter: each rank's whole input (n blocks)
// rides in its line and rank r reduces block r of every line.
//
// Large: pipelined through the chunk slots, K chunks in flight, as the large all-reduce.
//   All-gather, chunk k of every block:
//     publish: copy chunk k of my block into my slot              -> pub = g + 1
//     consume: copy chunk k of every peer's block out of its slot -> fin = g + 1
//   Reduce-scatter, chunk k of every block (ce elements, (n-1) pieces per slot):
//     publish: copy chunk k of block p, for every p != me, into piece p of my slot
//     consume: chunk k of block me = in_0 OP ... OP in_{n-1} in rank order (my own input
//              read in place, peers' pieces from their slots), rounded once into `out`
// A slot is rewritten only after every peer's fin passed the chunk it held. Each byte is
// copied once by its owner and once by each reader: half of what a TCP ring moves through
// the kernel. 16-bit floats are reduced in float32 and rounded once.
#include <algorithm>
#include <cstring>

#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/shm_common.h"
#include "core/chunking.h"
#include "reduce/reduce.h"

namespace rr::collectives::shm {
namespace {

using transport::shm::Control;

void allgatherSmall(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
                    char* out, size_t bytes) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  const uint64_t rd = lineRound(c, h, in, bytes);
  for (int p = 0; p < n; ++p)
    if (p != me) std::memcpy(out + static_cast<size_t>(p) * bytes, d.linePayload(p, rd), bytes);
  lineRelease(c, rd);
}

// out (`count` elements) = in_0 OP in_1 ... in rank order, accumulated in a scratch of the
// accumulate type (16-bit floats in float32) and rounded once; input(q) is rank q's data.
template <typename Input>
void reduceInOrder(comm::Communicator& c, int n, Input input, char* out, size_t count,
                   DataType dtype, ReduceOp op) {
  const DataType at = accumulateType(dtype);
  const bool half = isHalf(dtype);
  char* acc = c.scratch().get(comm::ScratchArena::kAcc, count * elementSize(at));
  float* wide = half ? reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kRecv,
                                                                 count * sizeof(float)))
                     : nullptr;
  const reduce::ReduceFn f = reduce::getReduceFn(at, op);
  if (half)
    reduce::widen(dtype, input(0), reinterpret_cast<float*>(acc), count);
  else
    std::memcpy(acc, input(0), count * elementSize(dtype));
  for (int q = 1; q < n; ++q) {
    if (half) {
      reduce::widen(dtype, input(q), wide, count);
      f(acc, wide, count);
    } else {
      f(acc, input(q), count);
    }
  }
  reduce::finalize(dtype, op, n, acc, out, count);
}

void reduceScatterSmall(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
                        char* out, size_t count, DataType dtype, ReduceOp op) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  const size_t block = count * elementSize(dtype), mine = static_cast<size_t>(me) * block;
  const uint64_t rd = lineRound(c, h, in, block * static_cast<size_t>(n));
  reduceInOrder(c, n, [&](int q) { return q == me ? in + mine : d.linePayload(q, rd) + mine; },
                out, count, dtype, op);
  lineRelease(c, rd);
}

// The chunk pipeline both large paths share: publish(k, slot) fills my slot with chunk k,
// consume(k, g) reads chunk k (global index g) out of the peers' slots. Every counter of
// every rank ends at base + G, so collectives chain as after the all-reduce.
template <typename Publish, typename Consume>
void pipeline(comm::Communicator& c, const transport::FrameHeader& h, size_t G, Publish publish,
              Consume consume) {
  ShmDomain& d = *c.shm();
  const int me = d.rank();
  ensureSlots(c, h);
  lineRelease(c, lineRound(c, h, nullptr, 0));
  const uint32_t base = d.chunkBase(), K = static_cast<uint32_t>(d.config().slots);
  Control& mine = d.ctl(me);
  size_t P = 0, F = 0;
  int lag = -1;
  // Slot g % K is free once every peer consumed chunk g - K (true for the first K ever).
  auto canPublish = [&] {
    return P < G && allReached(d, [](Control& x) -> auto& { return x.fin.v; },
                               base + static_cast<uint32_t>(P) - K + 1, &lag);
  };
  auto canConsume = [&] {
    return F < P && allReached(d, [](Control& x) -> auto& { return x.pub.v; },
                               base + static_cast<uint32_t>(F) + 1, &lag);
  };
  while (F < G) {
    bool progressed = false;
    if (canPublish()) {
      const uint32_t g = base + static_cast<uint32_t>(P);
      publish(P, d.slot(me, g));
      mine.pub.v.store(g + 1, std::memory_order_release);
      d.notify();
      ++P;
      progressed = true;
    }
    if (canConsume()) {
      const uint32_t g = base + static_cast<uint32_t>(F);
      consume(F, g);
      mine.fin.v.store(g + 1, std::memory_order_release);
      d.notify();
      ++F;
      progressed = true;
    }
    if (!progressed) waitFor(c, [&] { return canPublish() || canConsume(); }, [&] { return lag; });
  }
  mine.red.v.store(base + static_cast<uint32_t>(G), std::memory_order_release);
  d.advanceChunks(static_cast<uint32_t>(G));
}

}  // namespace

void allgather(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
               char* out, size_t bytes) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  if (shmOneRound(c, bytes)) {
    allgatherSmall(c, h, in, out, bytes);
  } else {
    const size_t cb = d.config().copyBytes;
    auto len = [&](size_t k) { return std::min(cb, bytes - k * cb); };
    pipeline(
        c, h, chunking::numSegments(bytes, cb),
        [&](size_t k, char* slot) { std::memcpy(slot, in + k * cb, len(k)); },
        [&](size_t k, uint32_t g) {
          for (int p = 0; p < n; ++p)
            if (p != me)
              std::memcpy(out + static_cast<size_t>(p) * bytes + k * cb, d.slot(p, g), len(k));
        });
  }
  c.addBytesDone(bytes * static_cast<size_t>(n - 1));
}

void reduceScatter(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
                   char* out, size_t count, DataType dtype, ReduceOp op) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  const size_t es = elementSize(dtype), block = count * es;
  if (shmOneRound(c, block * static_cast<size_t>(n))) {
    reduceScatterSmall(c, h, in, out, count, dtype, op);
  } else {
    // (n - 1) pieces of ce elements per slot, each piece 64-byte aligned.
    const size_t pieceBytes =
        std::max<size_t>(64, d.config().copyBytes / static_cast<size_t>(n - 1) / 64 * 64);
    const size_t ce = std::max<size_t>(1, pieceBytes / es);
    auto len = [&](size_t k) { return std::min(ce, count - k * ce); };
    // Where publisher q puts the piece meant for rank p (p != q) in its slot.
    auto piece = [&](int q, int p) { return static_cast<size_t>(p < q ? p : p - 1) * ce * es; };
    pipeline(
        c, h, chunking::numSegments(count, ce),
        [&](size_t k, char* slot) {
          for (int p = 0; p < n; ++p)
            if (p != me)
              std::memcpy(slot + piece(me, p), in + static_cast<size_t>(p) * block + k * ce * es,
                          len(k) * es);
        },
        [&](size_t k, uint32_t g) {
          const char* own = in + static_cast<size_t>(me) * block + k * ce * es;
          reduceInOrder(c, n, [&](int q) { return q == me ? own : d.slot(q, g) + piece(q, me); },
                        out + k * ce * es, len(k), dtype, op);
        });
  }
  c.addBytesDone(block * static_cast<size_t>(n - 1));
}

}  // namespace rr::collectives::shm
