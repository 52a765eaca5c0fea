// All-reduce entry: runs the planner's algorithm (planner.cc), sets up how 16-bit floats are
// accumulated, and hands off to the ring or the tree. Both leave the finished result in the
// caller's buffer. 16-bit floats always add in float32; over TCP their partial sums travel
// as 16 bits, rounded once per hop (RINGREDUCE_HALF_WIRE=16, the default), or as float32 in
// a widened accumulator, rounded once at the end (=32). Shared memory rounds once.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/allreduce_impl.h"
#include "collectives/collectives.h"
#include "collectives/half_avg.h"
#include "collectives/int_avg.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "core/error.h"
#include "core/log.h"

namespace rr::collectives {

namespace {

// buf (or, on the shared-memory large path only, segs) holds the input and the result.
// root >= 0: a reduce to that rank over shared memory (a == kShm; frames say kReduce).
void run(Communicator& c, void* buf, const Segments* segs, size_t count, DataType dtype,
         ReduceOp op, Algorithm algo, Algorithm a, int root = -1) {
  const size_t bytes = count * elementSize(dtype);
  RR_LOG(log::kDebug, root >= 0 ? "reduce #" : "allreduce #", c.seq() + 1, " on ", c.name(), ": ",
         bytes, " bytes ", toString(dtype), " ", toString(op), " -> ", toString(a),
         algo == Algorithm::kAuto ? " (auto)" : "", segs ? " (coalesced, in place)" : "");
  transport::FrameHeader h =
      c.begin(root >= 0 ? CollectiveKind::kReduce : CollectiveKind::kAllReduce, dtype, op,
              root >= 0 ? root : 0, a, count, bytes);
  AllreduceArgs args;
  args.root = root;
  args.dtype = dtype;
  args.op = op;
  args.count = count;
  args.dst = static_cast<char*>(buf);
  args.segs = segs;
  args.acc = args.dst;
  args.accElem = elementSize(accumulateType(dtype));
  args.reduceFn = reduce::getReduceFn(accumulateType(dtype), op);
  const bool shmLarge =
      (a == Algorithm::kShm || a == Algorithm::kHier) && !shmOneRound(c, bytes);
  if ((a == Algorithm::kRing || a == Algorithm::kTree) && halfOnWire(c, dtype)) {
    args.halfWire = true;  // acc stays the user's buffer: 16-bit partials on the wire
    args.accElem = elementSize(dtype);
  } else if (isHalf(dtype) && !shmLarge) {
    // Partial results travel and accumulate in float32; rounded once at the end.
    float* acc = reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kAcc, count * 4));
    if (a != Algorithm::kShm && a != Algorithm::kHier) reduce::widen(dtype, buf, acc, count);
    args.acc = reinterpret_cast<char*>(acc);
  }
  // float16 avg whose partial sums are rounded to float16 on the way (not for 2 ranks: ring
  // and tree round only the final sum): scaled so that none can overflow (half_avg.h), by
  // the ring and the tree as they go (the hierarchical plan: allreduce_hier.cc).
  args.halfAvgHops = args.halfWire && c.world() > 2 && halfavg::applies(dtype, op, c.world());
  if (a == Algorithm::kShm)
    shm::allreduce(c, h, args);
  else if (a == Algorithm::kHier)
    allreduceHier(c, h, args, c.slicePeers());
  else if (a == Algorithm::kRing)
    allreduceRing(c, h, args);
  else
    allreduceTree(c, h, args);
}

// Whether two pieces share memory (the same tensor passed twice): those need the flat copy,
// which reads every input before writing any result.
bool overlap(const std::vector<Piece>& pieces, size_t es) {
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  for (const Piece& p : pieces)
    if (p.count) r.emplace_back(reinterpret_cast<uintptr_t>(p.ptr), p.count * es);
  std::sort(r.begin(), r.end());
  for (size_t i = 1; i < r.size(); ++i)
    if (r[i - 1].first + r[i - 1].second > r[i].first) return true;
  return false;
}

}  // namespace

void allreduce(Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op,
               Algorithm algo) {
  checkReduction(dtype, op);  // before anything moves, also for one rank or no elements
  if (count == 0 || c.world() == 1) {
    c.skip();
    return;
  }
  if (intavg::applies(dtype, op)) {
    std::vector<int64_t> wide = intavg::widen(dtype, buf, count);
    const Communicator::DescribedAs as(c, dtype, op, count);
    allreduce(c, wide.data(), wide.size(), DataType::kInt64, ReduceOp::kSum, algo);
    intavg::narrow(dtype, wide.data(), buf, count, c.world());
    return;
  }
  run(c, buf, nullptr, count, dtype, op, algo, planAllreduce(c, algo, count * elementSize(dtype)));
}

void reduceShm(Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op,
               int root) {
  run(c, buf, nullptr, count, dtype, op, Algorithm::kShm, Algorithm::kShm, root);
}

void allreduceCoalesced(Communicator& c, const std::vector<Piece>& pieces, DataType dtype,
                        ReduceOp op, Algorithm algo) {
  checkReduction(dtype, op);
  const size_t es = elementSize(dtype);
  Segments segs;
  size_t count = 0;
  for (const Piece& p : pieces) {
    segs.add(static_cast<char*>(p.ptr), p.count * es);
    count += p.count;
  }
  if (count == 0 || c.world() == 1) {
    c.skip();
    return;
  }
  const size_t bytes = count * es;
  if (intavg::applies(dtype, op)) {  // through a flat copy, as below
    std::vector<char> flat(bytes);
    segs.gather(0, bytes, flat.data());
    allreduce(c, flat.data(), count, dtype, op, algo);
    segs.scatter(flat.data(), 0, bytes);
    return;
  }
  const Algorithm a = planAllreduce(c, algo, bytes);
  if (segs.pieces() == 1) {
    run(c, segs.contiguous(0, bytes), nullptr, count, dtype, op, algo, a);
  } else if (a == Algorithm::kShm && !shmOneRound(c, bytes) && !overlap(pieces, es)) {
    run(c, nullptr, &segs, count, dtype, op, algo, a);  // in place, no flat copy
  } else {
    // Every other path works on one buffer: through a flat copy (the same frames and
    // result as the caller's own flatten -> allreduce -> unflatten), kept between calls
    // (no page faults per call; no algorithm but reduce.cc's uses this scratch slot).
    char* flat = c.scratch().get(comm::ScratchArena::kExtra, bytes);
    segs.gather(0, bytes, flat);
    run(c, flat, nullptr, count, dtype, op, algo, a);
    segs.scatter(flat, 0, bytes);
  }
}

}  // namespace rr::collectives
