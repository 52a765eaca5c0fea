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
// once); internal nodes accumulate in scratch, so only the root's buffer changes.
//
// Pipelined by segments (RINGREDUCE_SEGMENT_BYTES): the whole tree runs on segment 0, then
// on segment 1, ... A node forwards segment s as soon as its children's segment s is folded
// in, while the kernel's socket buffers already hold what the children sent of s + 1; the
// incoming segment lands in a cache-sized scratch. Unpipelined, 2 ranks took transfer +
// reduce (64 MiB float32: ~2x the time of a gather of the same size). No cycle can block:
// each node reads its children in a fixed order and writes only to its parent. With
// every rank on one host the shared-memory all-reduce's schedule runs instead (every rank
// reduces its slice, only the root collects them; shm_allreduce.cc): several times faster
// than TCP there.
#include <algorithm>
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
  const size_t elem = elementSize(dtype), accElem = elementSize(at);
  transport::FrameHeader h = c.begin(CollectiveKind::kReduce, dtype, op, root, Algorithm::kTree,
                                     count, bytes);
  const int v = chunking::mod(me - root, n);
  auto real = [&](int vr) { return chunking::mod(vr + root, n); };
  const int low = v == 0 ? n : (v & -v);  // children are v + mask for mask < low
  const bool children = v + 1 < n && low > 1;
  const bool half = isHalf(dtype);
  const size_t segElems = std::max<size_t>(1, c.options().segmentBytes / accElem);
  // A segment's partial: in the caller's buffer where it can be (root or leaf, full-width
  // types), else in scratch (16-bit types widen; internal nodes keep the caller's data).
  const bool inScratch = half || (v != 0 && children);
  char* accSeg = inScratch ? scratch.get(comm::ScratchArena::kAcc, segElems * accElem) : nullptr;
  char* tmp = children ? scratch.get(comm::ScratchArena::kRecv, segElems * accElem) : nullptr;
  const reduce::ReduceFn f = reduce::getReduceFn(at, op);
  char* const user = static_cast<char*>(buf);
  for (size_t off = 0; off < count; off += segElems) {
    const size_t len = std::min(segElems, count - off);
    char* acc = user + off * elem;
    if (half) {
      reduce::widen(dtype, acc, reinterpret_cast<float*>(accSeg), len);
      acc = accSeg;
    } else if (inScratch) {
      acc = static_cast<char*>(std::memcpy(accSeg, acc, len * accElem));
    }
    h.payloadBytes = len * accElem;
    bool sent = false;
    for (int mask = 1; mask < n && !sent; mask <<= 1) {
      h.step = static_cast<uint32_t>(mask);
      if (v & mask) {
        transport::SendOp s;
        s.reset(h, acc, len * accElem);
        c.sendRecv(real(v - mask), &s, -1, nullptr);
        sent = true;
      } else if (v + mask < n) {
        transport::RecvOp r;
        r.reset(h, tmp, len * accElem);
        c.sendRecv(-1, nullptr, real(v + mask), &r);
        f(acc, tmp, len);
      }
    }
    // Root: avg's division, 16-bit rounding.
    if (v == 0) reduce::finalize(dtype, op, n, acc, user + off * elem, len);
  }
}

}  // namespace rr::collectives
