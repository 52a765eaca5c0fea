// Reduce to a root, binomial tree over ranks renumbered from the root (v = rank - root).
// In round k (mask = 2^k) a rank whose bit k is set sends its partial to v - mask and is
// done; the others add in the partial of v + mask. Each rank sends its data once (the
// minimum), the root receives ceil(log2 n) partials. For n = 8:
//
//        v0 <---------- v4 <---- v6 <- v7
//         |<-- v2 <- v3  |<- v5
//         |<- v1
//
// Partials travel in the accumulate type (float32 for float16/bfloat16: the root rounds
// once); internal nodes accumulate in scratch, so only the root's buffer changes. With
// every rank on one host the shared-memory all-reduce's schedule runs instead (every rank
// reduces its slice, only the root collects them; shm_allreduce.cc): several times faster
// than TCP there.
#include <cstring>
#include <vector>

#include "collectives/allreduce_impl.h"
#include "collectives/collectives.h"
#include "collectives/int_avg.h"
#include "collectives/planner.h"
#include "core/chunking.h"
#include "reduce/reduce.h"

namespace rr::collectives {

void reduce(Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op, int root) {
  checkReduction(dtype, op);
  const int n = c.world(), me = c.rank();
  const size_t bytes = count * elementSize(dtype);
  c.checkUsable();
  if (count == 0 || n == 1) {
    c.skip();
    return;
  }
  if (intavg::applies(dtype, op)) {
    std::vector<int64_t> wide = intavg::widen(dtype, buf, count);
    const Communicator::DescribedAs as(c, dtype, op, count);
    reduce(c, wide.data(), wide.size(), DataType::kInt64, ReduceOp::kSum, root);
    if (me == root) intavg::narrow(dtype, wide.data(), buf, count, n);
    return;
  }
  auto& scratch = c.scratch();
  if (planReduce(c, bytes) == Algorithm::kShm) {
    reduceShm(c, buf, count, dtype, op, root);
    return;
  }
  const DataType at = accumulateType(dtype);
  const size_t accBytes = count * elementSize(at);
  transport::FrameHeader h = c.begin(CollectiveKind::kReduce, dtype, op, root, Algorithm::kTree,
                                     count, bytes);
  const int v = chunking::mod(me - root, n);
  auto real = [&](int vr) { return chunking::mod(vr + root, n); };
  const int low = v == 0 ? n : (v & -v);  // children are v + mask for mask < low
  const bool children = v + 1 < n && low > 1;
  const bool half = isHalf(dtype);
  char* acc = static_cast<char*>(buf);
  if (half) {
    acc = scratch.get(comm::ScratchArena::kAcc, accBytes);
    reduce::widen(dtype, buf, reinterpret_cast<float*>(acc), count);
  } else if (v != 0 && children) {
    acc = scratch.get(comm::ScratchArena::kAcc, accBytes);
    std::memcpy(acc, buf, bytes);
  }
  char* tmp = children ? scratch.get(comm::ScratchArena::kRecv, accBytes) : nullptr;
  const reduce::ReduceFn f = reduce::getReduceFn(at, op);
  h.payloadBytes = accBytes;
  for (int mask = 1; mask < n; mask <<= 1) {
    h.step = static_cast<uint32_t>(mask);
    if (v & mask) {
      transport::SendOp s;
      s.reset(h, acc, accBytes);
      c.sendRecv(real(v - mask), &s, -1, nullptr);
      return;
    }
    if (v + mask < n) {
      transport::RecvOp r;
      r.reset(h, tmp, accBytes);
      c.sendRecv(-1, nullptr, real(v + mask), &r);
      f(acc, tmp, count);
    }
  }
  reduce::finalize(dtype, op, n, acc, buf, count);  // root: avg's division, 16-bit rounding
}

}  // namespace rr::collectives
