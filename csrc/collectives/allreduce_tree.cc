// Tree all-reduce for small messages: recursive doubling, O(log n) latency.
//
// With p = the largest power of two <= n, ranks r >= p first fold their data into rank
// r - p and receive the finished result back at the end:
//
//   n = 6, p = 4:   4 -> 0, 5 -> 1          (fold)
//                   0 <-> 1, 2 <-> 3        (distance 1)
//                   0 <-> 2, 1 <-> 3        (distance 2)
//                   0 -> 4, 1 -> 5          (unfold)
//
// For n = 2 this is a single exchange. Partners combine as (lower rank's data) OP (higher
// rank's data), so both compute identical bits even for min/max of +0/-0 or NaN payloads.
//
// 16-bit floats: with a 16-bit wire (the default) every message carries 16-bit values.
// Partners widen both sides, combine in float32 and round to 16 bits -- identical bits on
// both -- except in the last distance round, whose float32 result is finalized (avg, one
// rounding) directly; the unfold then sends the finished 16-bit result. That is
// ceil(log2 n) roundings per element. RINGREDUCE_HALF_WIRE=32 sends the float32
// accumulator instead and rounds once, for twice the bytes.
//
// float16 avg on that wire: a partial sum of m ranks' values travels scaled by
// 2^-ceil(log2 m) (half_avg.h), scaled in float32 (exact) as partners combine. After the
// rounds of distance < d a rank's partial holds its block of d ranks below p and those of
// them that folded a rank >= p in: m = d + that overlap. Two partners' m are d + o_lo and
// d + o_hi with o_lo >= o_hi (the folding ranks are a prefix), so their scaled values,
// each <= 65504, add to at most 65504 * (2^e_lo + 2^e_hi) / 2^e_out <= 65504: no rounded
// partial can overflow, at any n.
#include <algorithm>
#include <cstring>
#include <utility>

#include "collectives/allreduce_impl.h"
#include "collectives/half_avg.h"
#include "core/chunking.h"

namespace rr::collectives {

void allreduceTree(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a) {
  const int n = c.world(), r = c.rank();
  const int p = chunking::floorPow2(n);
  const size_t bytes = a.count * a.accElem;  // every message: the whole buffer
  const size_t wideOff = (bytes + 63) / 64 * 64;
  char* cur = a.acc;
  char* other = c.scratch().get(comm::ScratchArena::kRecv,
                                wideOff + (a.halfWire ? 2 * a.count * sizeof(float) : 0));
  float* wide = a.halfWire ? reinterpret_cast<float*>(other + wideOff) : nullptr;
  // float16 avg: the scaling exponent of `rank`'s partial after the rounds of distance < d
  // (d = 1: after the fold), 0 when nothing is scaled.
  const bool scaled = a.halfAvgHops;
  auto expAfter = [&](int rank, int d) {
    if (!scaled) return 0;
    const int b = rank & ~(d - 1);
    return chunking::ceilLog2(d + std::clamp(n - p - b, 0, d));
  };
  // lo = lo OP hi, lo's partial scaled by 2^-eLo and hi's by 2^-eHi, the result by 2^-eOut.
  // On a 16-bit wire in float32, rounded back into lo -- but the last round's result stays
  // in `wide` (float32, unscaled) for the one final rounding.
  auto combine = [&](char* lo, const char* hi, bool last, int eLo, int eHi, int eOut) {
    if (!a.halfWire) {
      a.reduceFn(lo, hi, a.count);
      return;
    }
    reduce::widen(a.dtype, lo, wide, a.count);
    reduce::widen(a.dtype, hi, wide + a.count, a.count);
    if (eLo != eOut) halfavg::scaleFloat(wide, a.count, eLo - eOut);
    if (eHi != eOut) halfavg::scaleFloat(wide + a.count, a.count, eHi - eOut);
    a.reduceFn(wide, wide + a.count, a.count);
    if (!last) reduce::finalize(a.dtype, ReduceOp::kSum, 1, wide, lo, a.count);
  };
  transport::SendOp s;
  transport::RecvOp rv;
  transport::FrameHeader fh = h;
  uint32_t step = 0;

  if (r >= p) {  // fold into r - p, then wait for the result
    fh.step = step;
    s.reset(fh, cur, bytes);
    c.sendRecv(r - p, &s, -1, nullptr);
    fh.step = 1000;
    rv.reset(fh, cur, bytes);
    c.sendRecv(-1, nullptr, r - p, &rv);
    // A 16-bit wire delivers the finished result; float32 partials still need finishing.
    if (!a.halfWire && a.needsFinalize()) reduce::finalize(a.dtype, a.op, n, a.acc, a.dst, a.count);
    return;
  }
  if (r + p < n) {
    fh.step = step;
    rv.reset(fh, other, bytes);
    c.sendRecv(-1, nullptr, r + p, &rv);
    combine(cur, other, false, 0, 0, expAfter(r, 1));  // lower (us) OP higher
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = r ^ mask;
    const bool last = mask * 2 >= p;
    const int lo = std::min(r, partner), hi = std::max(r, partner);
    const int eLo = expAfter(lo, mask), eHi = expAfter(hi, mask);
    const int eOut = last ? 0 : expAfter(r, mask * 2);
    fh.step = ++step;
    s.reset(fh, cur, bytes);
    rv.reset(fh, other, bytes);
    c.sendRecv(partner, &s, partner, &rv);
    if (r < partner) {
      combine(cur, other, last, eLo, eHi, eOut);
    } else {
      combine(other, cur, last, eLo, eHi, eOut);  // other = partner's (lower) OP ours
      std::swap(cur, other);
    }
  }
  if (a.halfWire) {
    reduce::finalize(a.dtype, a.op, n, wide, a.dst, a.count);
  }
  if (r + p < n) {  // unfold: the finished 16-bit result, or the float32 accumulator
    fh.step = 1000;
    s.reset(fh, a.halfWire ? a.dst : cur, bytes);
    c.sendRecv(r + p, &s, -1, nullptr);
  }
  if (a.halfWire) return;
  if (cur != a.acc) std::memcpy(a.acc, cur, bytes);
  if (a.needsFinalize()) reduce::finalize(a.dtype, a.op, n, a.acc, a.dst, a.count);
}

}  // namespace rr::collectives
