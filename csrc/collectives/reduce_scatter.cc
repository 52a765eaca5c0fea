// Ring reduce-scatter: the reduce half of the ring (ring.h) with shift 1, so that after n-1
// steps rank r holds the complete reduction of block r. The caller's input is not modified:
// the ring reads it in place and keeps its partial sums in two block-sized slots (RingPlan's
// own; a copy of the whole input before: n blocks of scratch). 16-bit floats travel as 16
// bits (each hop adds in float32 and rounds once, see ring.h) unless RINGREDUCE_HALF_WIRE=32,
// which widens the accumulator to float32 and rounds once at the end.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/allreduce_impl.h"
#include "collectives/collectives.h"
#include "collectives/half_avg.h"
#include "collectives/int_avg.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "collectives/ring.h"

namespace rr::collectives {

void reduceScatter(Communicator& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op) {
  checkReduction(dtype, op);  // before anything moves, also for one rank or no elements
  const int n = c.world();
  const size_t es = elementSize(dtype);
  const DataType at = accumulateType(dtype);
  const bool halfWire = halfOnWire(c, dtype);
  const size_t ae = halfWire ? es : elementSize(at);  // acc and wire element
  const size_t total = count * static_cast<size_t>(n);
  if (count == 0 || n == 1) {
    c.checkUsable();  // before writing `out`: a failed call leaves it as it was
    if (count > 0 && in != out) std::memmove(out, in, count * es);  // one contribution
    c.skip();
    return;
  }
  if (intavg::applies(dtype, op)) {  // block r of the wide input is block r of `in`, widened
    std::vector<int64_t> wide = intavg::widen(dtype, in, total);
    std::vector<int64_t> mine(count * intavg::words(dtype));
    const Communicator::DescribedAs as(c, dtype, op, count);
    reduceScatter(c, wide.data(), mine.data(), mine.size(), DataType::kInt64, ReduceOp::kSum);
    intavg::narrow(dtype, mine.data(), out, count, n);
    return;
  }
  const Algorithm a = planGatherAll(c, CollectiveKind::kReduceScatter, total * es, total * es);
  transport::FrameHeader h =
      c.begin(CollectiveKind::kReduceScatter, dtype, op, 0, a, count, total * es);
  if (a == Algorithm::kShm) {
    shm::reduceScatter(c, h, static_cast<const char*>(in), static_cast<char*>(out), count, dtype,
                       op);
    return;
  }
  RingPlan p;
  p.count = total;
  p.steps = n - 1;
  p.rsSteps = n - 1;
  p.shift = 1;
  if (ae == es) {  // the input's own type travels: it is read in place, chunk slots hold sums
    p.own = static_cast<const char*>(in);
    p.slots = std::min(2, n - 1);
    p.slotElems = count;
    p.acc = c.scratch().get(comm::ScratchArena::kAcc, static_cast<size_t>(p.slots) * count * ae);
  } else {  // float32 partials of a 16-bit type (RINGREDUCE_HALF_WIRE=32): a widened copy
    p.acc = c.scratch().get(comm::ScratchArena::kAcc, total * ae);
    reduce::widen(dtype, in, reinterpret_cast<float*>(p.acc), total);
  }
  p.accElem = ae;
  p.segElems = std::max<size_t>(1, c.options().segmentBytes / ae);
  const size_t recvBytes = (p.segElems * ae + 63) / 64 * 64;
  char* scratch = c.scratch().get(comm::ScratchArena::kRecv,
                                  recvBytes + (halfWire ? 2 * p.segElems * sizeof(float) : 0));
  p.recvScratch = scratch;
  p.reduceFn = reduce::getReduceFn(at, op);
  p.halfWire = halfWire;
  p.half = dtype;
  if (halfWire) p.wide = reinterpret_cast<float*>(scratch + recvBytes);
  // float16 avg with 16-bit partials: sums travel scaled (half_avg.h, ring.h).
  p.scaleHops = halfWire && halfavg::applies(dtype, op, n);
  char* o = static_cast<char*>(out);
  const size_t base = static_cast<size_t>(c.rank()) * count;
  p.onFinal = [&](char* vals, size_t off, size_t len) {
    reduce::finalize(dtype, op, n, vals, o + (off - base) * es, len);
  };
  runRing(c, h, p);
}

}  // namespace rr::collectives
