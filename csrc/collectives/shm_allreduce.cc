// Shared-memory all-reduce for ranks on one host.
//
// Small (payload <= smallMax): one flag round. Every rank writes its input into its line
// (lineRound), then reduces all n lines itself in rank order -- identical bits everywhere.
//
// Large: the buffer is cut into chunks of chunkBytes; chunk k is split into n slices and
// rank r owns slice r. Per chunk, with K chunks in flight:
//
//   publish:  copy my input's slices p != r into my slot        -> pub = g + 1
//   reduce:   slice r = in_0 OP in_1 OP ... OP in_{n-1}, reading my own input directly
//             and peers' slices from their slots while hot      -> red = g + 1
//             (result written to my slot's slice r and my output; rank 0, and every
//             rank of two, accumulate in their output, which holds their input already:
//             one pass over the slice fewer -- 100 MB at 2 ranks 86 -> 47 ms here)
//   collect:  copy each peer p's reduced slice p into my output -> fin = g + 1
//
// A slot is rewritten only after every peer's fin passed the chunk it held. Each rank
// touches its data about twice (copy in, copy out) plus the reduction of its own slice.
// The caller's buffer may come in pieces (a coalesced call): read and written in place.
// A reduce (AllreduceArgs::root) runs the same schedule, but only the root copies results
// out (its own slice into its buffer, collect); the others leave their buffers untouched.
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/allreduce_impl.h"
#include "collectives/half_avg.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/segments.h"
#include "collectives/shm_common.h"
#include "core/chunking.h"
#include "core/log.h"

namespace rr::collectives::shm {
namespace {

using transport::shm::Control;

void small(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
           size_t bytes) {
  ShmDomain& d = *c.shm();
  const int n = d.world(), me = d.rank();
  const uint64_t rd = lineRound(c, h, a.dst, bytes);
  if (a.root >= 0 && a.root != me) {  // a reduce: the root alone reads the lines
    lineRelease(c, rd);
    return;
  }
  // acc = in_0 OP in_1 ... in rank order (own input read from our line, as peers see it).
  char* acc = a.acc;
  if (isHalf(a.dtype)) {
    float* f = reinterpret_cast<float*>(acc);
    reduce::widen(a.dtype, d.linePayload(0, rd), f, a.count);
    float* tmp = reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kRecv, a.count * 4));
    for (int r = 1; r < n; ++r) {
      reduce::widen(a.dtype, d.linePayload(r, rd), tmp, a.count);
      a.reduceFn(f, tmp, a.count);
    }
  } else {
    std::memcpy(acc, d.linePayload(0, rd), bytes);
    for (int r = 1; r < n; ++r) a.reduceFn(acc, d.linePayload(r, rd), a.count);
  }
  lineRelease(c, rd);
  (void)me;
  if (a.sumScaleExp) halfavg::scaleFloat(reinterpret_cast<float*>(a.acc), a.count, -a.sumScaleExp);
  if (a.needsFinalize()) reduce::finalize(a.dtype, a.op, n, a.acc, a.dst, a.count);
}

// The first large all-reduce's line round: every rank allocates the rest of its slots and
// says whether that worked; all grow, or (no room in /dev/shm on some rank) none does and
// the chunks stay at copyBytes -- slower above one chunk, but nothing fails.
void growSlots(comm::Communicator& c, const transport::FrameHeader& h) {
  ShmDomain& d = *c.shm();
  const std::string short_ = ranksWithout(c, h, d.growOwn());
  d.finishGrow(short_.empty());
  if (!short_.empty())
    RR_WARN("shared memory: /dev/shm had no room for ", d.config().chunkBytes >> 10,
            " KiB slots on rank(s) ", short_, "; large all-reduces keep ", d.chunkBytesNow() >> 10,
            " KiB chunks (slower above 1 MiB: enlarge /dev/shm, e.g. docker --shm-size)");
}

void large(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a) {
  ShmDomain& d = *c.shm();
  const int n = d.world(), me = d.rank();
  // A reduce (a.root >= 0; with every rank on one host local rank == rank): only the root's
  // buffer receives results; the others reduce their slice into their slot only.
  const bool resultHere = a.root < 0 || a.root == me;
  const size_t es = elementSize(a.dtype);
  ensureSlots(c, h);
  if (d.growPending()) {
    growSlots(c, h);
  } else {
    lineRelease(c, lineRound(c, h, nullptr, 0));
  }
  const size_t ce = d.chunkBytesNow() / es;  // elements per chunk
  const size_t G = chunking::numSegments(a.count, ce);
  const uint32_t base = d.chunkBase(), K = static_cast<uint32_t>(d.config().slots);
  Control& mine = d.ctl(me);
  // The user's buffer: one piece, or a coalesced call's tensors (a.segs) read and written
  // in place -- the same bytes move either way.
  Segments single;
  const Segments* user = a.segs;
  if (user == nullptr) {
    single.add(a.dst, a.count * es);
    user = &single;
  }
  float* accF = isHalf(a.dtype)
                    ? reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kAcc, ce * 4))
                    : nullptr;
  float* tmpF = isHalf(a.dtype)
                    ? reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kRecv, ce * 4))
                    : nullptr;
  auto chunkLen = [&](size_t k) { return std::min(ce, a.count - k * ce); };
  auto slice = [&](size_t k, int p, size_t* off, size_t* len) {
    size_t cl = chunkLen(k);
    *off = chunking::chunkOffset(cl, n, p);  // within the chunk
    *len = chunking::chunkLen(cl, n, p);
  };
  size_t P = 0, R = 0, F = 0;
  int lag = -1;
  // Slot g % K is free once every peer consumed chunk g - K (wrap-around compare: true for
  // the first K chunks ever).
  auto canPublish = [&] {
    return P < G && P < R + K &&
           allReached(d, [](Control& x) -> auto& { return x.fin.v; },
                      base + static_cast<uint32_t>(P) - K + 1, &lag);
  };
  auto canReduce = [&] {
    return R < P && allReached(d, [](Control& x) -> auto& { return x.pub.v; },
                               base + static_cast<uint32_t>(R) + 1, &lag);
  };
  auto canCollect = [&] {
    return F < R && allReached(d, [](Control& x) -> auto& { return x.red.v; },
                               base + static_cast<uint32_t>(F) + 1, &lag);
  };
  while (F < G) {
    bool progressed = false;
    if (canPublish()) {
      uint32_t g = base + static_cast<uint32_t>(P);
      char* s = d.slot(me, g);
      const size_t in = P * ce * es;
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        size_t off, len;
        slice(P, p, &off, &len);
        user->gather(in + off * es, len * es, s + off * es);
      }
      mine.pub.v.store(g + 1, std::memory_order_release);
      d.notify();
      ++P;
      progressed = true;
    }
    if (canReduce()) {
      uint32_t g = base + static_cast<uint32_t>(R);
      size_t off, len;
      slice(R, me, &off, &len);
      char* mySlot = d.slot(me, g) + off * es;
      const size_t pos = (R * ce + off) * es;
      char* dstSlice = len > 0 ? user->contiguous(pos, len * es) : nullptr;
      const char* own = dstSlice;
      if (len > 0 && dstSlice == nullptr) {  // my slice spans two of the caller's pieces
        char* tmp = c.scratch().get(comm::ScratchArena::kExtra, len * es);
        user->gather(pos, len * es, tmp);
        own = tmp;
      }
      auto input = [&](int q) -> const char* {
        return q == me ? own : d.slot(q, g) + off * es;
      };
      auto copyOut = [&](const char* res) {  // my reduced slice into the caller's buffer
        if (!resultHere) return;
        if (dstSlice != nullptr)
          std::memcpy(dstSlice, res, len * es);
        else
          user->scatter(res, pos, len * es);
      };
      if (len > 0) {
        if (accF) {
          reduce::widen(a.dtype, input(0), accF, len);
          for (int q = 1; q < n; ++q) {
            reduce::widen(a.dtype, input(q), tmpF, len);
            a.reduceFn(accF, tmpF, len);
          }
          if (a.sumScaleExp) halfavg::scaleFloat(accF, len, -a.sumScaleExp);
          reduce::finalize(a.dtype, a.op, n, accF, mySlot, len);
          copyOut(mySlot);
        } else if (dstSlice != nullptr && resultHere && (me == 0 || n == 2)) {
          // Accumulate in the caller's buffer, which holds my input already: one pass
          // fewer. Rank order is kept (rank 0 first) or does not matter (two inputs: every
          // op is commutative; min/max propagate NaN either way).
          for (int q = 0; q < n; ++q)
            if (q != me) a.reduceFn(dstSlice, input(q), len);
          if (a.op == ReduceOp::kAvg) reduce::finalize(a.dtype, a.op, n, dstSlice, dstSlice, len);
          std::memcpy(mySlot, dstSlice, len * es);
        } else {
          std::memcpy(mySlot, input(0), len * es);
          for (int q = 1; q < n; ++q) a.reduceFn(mySlot, input(q), len);
          if (a.op == ReduceOp::kAvg) reduce::finalize(a.dtype, a.op, n, mySlot, mySlot, len);
          copyOut(mySlot);
        }
      }
      mine.red.v.store(g + 1, std::memory_order_release);
      d.notify();
      ++R;
      progressed = true;
    }
    if (canCollect()) {
      uint32_t g = base + static_cast<uint32_t>(F);
      for (int p = 0; p < n && resultHere; ++p) {
        if (p == me) continue;
        size_t off, len;
        slice(F, p, &off, &len);
        user->scatter(d.slot(p, g) + off * es, (F * ce + off) * es, len * es);
      }
      mine.fin.v.store(g + 1, std::memory_order_release);
      d.notify();
      ++F;
      progressed = true;
    }
    if (!progressed)
      waitFor(c, [&] { return canPublish() || canReduce() || canCollect(); }, [&] { return lag; });
  }
  c.addBytesDone(a.count * es);
  d.advanceChunks(static_cast<uint32_t>(G));
}

}  // namespace

void allreduce(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a) {
  const size_t bytes = a.count * elementSize(a.dtype);
  if (shmOneRound(c, bytes))
    small(c, h, a, bytes);
  else
    large(c, h, a);
}

}  // namespace rr::collectives::shm
