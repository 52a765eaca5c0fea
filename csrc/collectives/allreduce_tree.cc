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
#include <cstring>
#include <utility>

#include "collectives/allreduce_impl.h"
#include "core/chunking.h"

namespace rr::collectives {

void allreduceTree(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a) {
  const int n = c.world(), r = c.rank();
  const int p = chunking::floorPow2(n);
  const size_t bytes = a.count * a.accElem;
  char* cur = a.acc;
  char* other = c.scratch().get(comm::ScratchArena::kRecv, bytes);
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
  } else {
    if (r + p < n) {
      fh.step = step;
      rv.reset(fh, other, bytes);
      c.sendRecv(-1, nullptr, r + p, &rv);
      a.reduceFn(cur, other, a.count);  // lower (us) OP higher
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      int partner = r ^ mask;
      fh.step = ++step;
      s.reset(fh, cur, bytes);
      rv.reset(fh, other, bytes);
      c.sendRecv(partner, &s, partner, &rv);
      if (r < partner) {
        a.reduceFn(cur, other, a.count);
      } else {
        a.reduceFn(other, cur, a.count);  // other = partner's (lower) OP ours
        std::swap(cur, other);
      }
    }
    if (r + p < n) {
      fh.step = 1000;
      s.reset(fh, cur, bytes);
      c.sendRecv(r + p, &s, -1, nullptr);
    }
  }
  if (cur != a.acc) std::memcpy(a.acc, cur, bytes);
  if (a.needsFinalize()) reduce::finalize(a.dtype, a.op, n, a.acc, a.dst, a.count);
}

}  // namespace rr::collectives
