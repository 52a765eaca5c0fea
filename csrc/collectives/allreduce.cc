// All-reduce entry: picks the algorithm (cost_model.cc), sets up how 16-bit floats are
// accumulated, and hands off to the ring or the tree. Both leave the finished result in the
// caller's buffer. 16-bit floats always add in float32; over TCP their partial sums travel
// as 16 bits, rounded once per hop (RINGREDUCE_HALF_WIRE=16, the default), or as float32 in
// a widened accumulator, rounded once at the end (=32). Shared memory rounds once.
#include <cstring>

#include "collectives/allreduce_impl.h"
#include "collectives/collectives.h"
#include "collectives/shm_algos.h"
#include "core/error.h"
#include "core/log.h"

namespace rr::collectives {

void allreduce(Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op,
               Algorithm algo) {
  checkReduction(dtype, op);  // before anything moves, also for one rank or no elements
  const size_t bytes = count * elementSize(dtype);
  if (count == 0 || c.world() == 1) {
    c.skip();
    return;
  }
  // Shared memory serves "auto" when every rank is on this host; an explicit ring/tree
  // request runs the TCP algorithm (useful for comparisons).
  Algorithm a = algo;
  if (a == Algorithm::kAuto) {
    a = c.shmAll() ? Algorithm::kShm : chooseAllreduce(c.options(), c.world(), bytes);
    if (a == Algorithm::kRing && c.shm()) a = Algorithm::kHier;
  }
  if (a == Algorithm::kShm && !c.shmAll())
    RR_THROW(InvalidArgument, "algo=shm needs every rank on one host with shared memory enabled");
  if (a == Algorithm::kHier && (!c.shm() || c.shmAll()))
    RR_THROW(InvalidArgument, "algo=hier needs several hosts with the same number (>= 2) of ranks");
  RR_LOG(log::kDebug, "allreduce #", c.seq() + 1, ": ", bytes, " bytes ", toString(dtype), " ",
         toString(op), " -> ", toString(a), algo == Algorithm::kAuto ? " (auto)" : "");
  transport::FrameHeader h = c.begin(CollectiveKind::kAllReduce, dtype, op, 0, a, count, bytes);
  AllreduceArgs args;
  args.dtype = dtype;
  args.op = op;
  args.count = count;
  args.dst = static_cast<char*>(buf);
  args.acc = args.dst;
  args.accElem = elementSize(accumulateType(dtype));
  args.reduceFn = reduce::getReduceFn(accumulateType(dtype), op);
  const bool shmLarge =
      (a == Algorithm::kShm || a == Algorithm::kHier) && bytes > c.shm()->config().smallMax;
  if ((a == Algorithm::kRing || a == Algorithm::kTree) && halfOnWire(c, dtype)) {
    args.halfWire = true;  // acc stays the user's buffer: 16-bit partials on the wire
    args.accElem = elementSize(dtype);
  } else if (isHalf(dtype) && !shmLarge) {
    // Partial results travel and accumulate in float32; rounded once at the end.
    float* acc = reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kAcc, count * 4));
    if (a != Algorithm::kShm && a != Algorithm::kHier) reduce::widen(dtype, buf, acc, count);
    args.acc = reinterpret_cast<char*>(acc);
  }
  if (a == Algorithm::kShm)
    shm::allreduce(c, h, args);
  else if (a == Algorithm::kHier)
    allreduceHier(c, h, args, c.slicePeers());
  else if (a == Algorithm::kRing)
    allreduceRing(c, h, args);
  else
    allreduceTree(c, h, args);
}

}  // namespace rr::collectives
