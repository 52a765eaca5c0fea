#include "collectives/ring.h"

#include <algorithm>
#include <cstring>

#include "collectives/half_avg.h"
#include "core/chunking.h"

namespace rr::collectives {
namespace {

// Fold the segment in p.recvScratch into `a` (its place in acc: a = a OP incoming) and
// return the reduced values in the accumulate type. With a 16-bit wire they are computed in
// p.wide and rounded back into acc -- unless this is the last reduce step and onFinal will
// round them (one rounding per hop, none twice). Reduce step `step` receives a partial sum
// of step + 1 ranks' values (step 0: the left neighbour's own) and forwards one of step + 2.
char* reduceSegment(const RingPlan& p, char* a, size_t len, int step, bool last) {
  if (!p.halfWire) {
    p.reduceFn(a, p.recvScratch, len);
    return a;
  }
  // float16 avg (p.scaleHops): a partial sum of m values travels scaled by 2^-ceil(log2 m)
  // (ring.h); scaled in float32, exactly. The last step's sum is not scaled.
  const int in = p.scaleHops ? chunking::ceilLog2(step + 1) : 0;
  const int out = p.scaleHops && !last ? chunking::ceilLog2(step + 2) : 0;
  // In blocks small enough that widening, reducing and rounding one block stay in L1 (a
  // whole segment's float32 values fill L2), into the same places of p.wide.
  constexpr size_t kBlock = 2048;
  const bool round = !last || !p.onFinal;
  for (size_t b = 0; b < len; b += kBlock) {
    const size_t m = std::min(kBlock, len - b);
    float* mine = p.wide + b;
    float* inc = p.wide + p.segElems + b;
    reduce::widen(p.half, a + b * p.accElem, mine, m);
    reduce::widen(p.half, p.recvScratch + b * p.accElem, inc, m);
    if (in != out) halfavg::scaleFloat(inc, m, in - out);
    if (out) halfavg::scaleFloat(mine, m, -out);
    p.reduceFn(mine, inc, m);
    if (round) reduce::finalize(p.half, ReduceOp::kSum, 1, mine, a + b * p.accElem, m);
  }
  return reinterpret_cast<char*>(p.wide);
}

}  // namespace

void runRing(comm::Communicator& c, const transport::FrameHeader& tmpl, const RingPlan& p) {
  using chunking::chunkLen;
  using chunking::chunkOffset;
  using chunking::mod;
  const int n = p.members ? static_cast<int>(p.members->size()) : c.world();
  int r = c.rank();
  if (p.members)
    r = static_cast<int>(std::find(p.members->begin(), p.members->end(), c.rank()) - p.members->begin());
  auto global = [&](int i) { return p.members ? (*p.members)[static_cast<size_t>(i)] : i; };
  const int right = global(mod(r + 1, n)), left = global(mod(r - 1, n));
  const size_t S = std::max<size_t>(1, chunking::numSegments(chunkLen(p.count, n, 0), p.segElems));
  const size_t total = static_cast<size_t>(p.steps) * S;

  // Element range of segment s of chunk `chunk` (len 0 when the chunk is shorter).
  auto segment = [&](int chunk, size_t s, size_t* off, size_t* len) {
    size_t cl = chunkLen(p.count, n, chunk), begin = s * p.segElems;
    *off = chunkOffset(p.count, n, chunk) + begin;
    *len = begin >= cl ? 0 : std::min(p.segElems, cl - begin);
  };
  // Where the reduce steps keep element `off` of chunk `chunk`, reduced at step T.
  auto accAt = [&](int T, int chunk, size_t off) {
    if (!p.own) return p.acc + off * p.accElem;
    return p.acc + (static_cast<size_t>(T % p.slots) * p.slotElems + off -
                    chunkOffset(p.count, n, chunk)) * p.accElem;
  };

  transport::SendOp sop;
  transport::RecvOp rop;
  size_t su = 0, ru = 0;  // next send / receive unit (unit = step * S + segment)
  bool sActive = false, rActive = false;
  size_t rOff = 0, rLen = 0;
  int rStep = 0, rChunk = 0;
  while (su < total || ru < total) {
    bool progressed = false;
    if (!sActive && su < total) {
      int T = static_cast<int>(su / S);
      size_t s = su % S;
      // Unit su forwards what unit su - S brought in; it must have arrived.
      if (T == 0 || ru > su - S) {
        size_t off, len;
        const int chunk = mod(r - T - p.shift, n);
        segment(chunk, s, &off, &len);
        if (len == 0) {
          ++su;
          continue;
        }
        transport::FrameHeader h = tmpl;
        h.step = static_cast<uint32_t>(T);
        if (T < p.rsSteps)  // what step T - 1 reduced (step 0: this rank's own values)
          sop.reset(h, p.own && T == 0 ? p.own + off * p.accElem : accAt(T - 1, chunk, off),
                    len * p.accElem);
        else
          sop.reset(h, p.dst + off * p.dstElem, len * p.dstElem);
        sActive = true;
      }
    }
    // With slots, step T's segment s goes where step T - slots put its own, which step
    // T - slots + 1 sends on: not before that send is done (unit ru - (slots - 1) * S).
    const int nextStep = static_cast<int>(ru / S);  // the step of the next receive
    const bool slotBusy = p.own && nextStep >= p.slots && nextStep < p.rsSteps &&
                          su + static_cast<size_t>(p.slots - 1) * S <= ru;
    if (!rActive && ru < total && !slotBusy) {
      rStep = nextStep;
      rChunk = mod(r - rStep - p.shift - 1, n);
      segment(rChunk, ru % S, &rOff, &rLen);
      if (rLen == 0) {
        ++ru;
        continue;
      }
      transport::FrameHeader h = tmpl;
      h.step = static_cast<uint32_t>(rStep);
      if (rStep < p.rsSteps)
        rop.reset(h, p.recvScratch, rLen * p.accElem);
      else
        rop.reset(h, p.dst + rOff * p.dstElem, rLen * p.dstElem);
      rActive = true;
    }
    if (sActive && c.progressSend(right, sop)) {
      sActive = false;
      ++su;
      progressed = true;
    }
    if (rActive && c.progressRecv(left, rop)) {
      rActive = false;
      if (rStep < p.rsSteps) {
        const bool last = rStep == p.rsSteps - 1;
        char* a = accAt(rStep, rChunk, rOff);
        if (p.own) std::memcpy(a, p.own + rOff * p.accElem, rLen * p.accElem);
        char* vals = reduceSegment(p, a, rLen, rStep, last);
        if (last && p.onFinal) p.onFinal(vals, rOff, rLen);
      }
      ++ru;
      progressed = true;
    }
    if (!progressed && (sActive || rActive)) c.waitIo(sActive ? right : -1, rActive ? left : -1);
  }
}

}  // namespace rr::collectives
