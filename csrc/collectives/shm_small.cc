// Shared-memory all-gather and reduce-scatter of small messages (all ranks on one host):
// one line round. All-gather: each rank's block rides in its line and every rank copies
// the others' out. Reduce-scatter: each rank's whole input (n blocks) rides in its line and
// rank r reduces block r of every line (16-bit floats in float32, rounded once). Larger
// messages take the TCP ring (planner.cc).
#include <cstring>

#include "collectives/shm_algos.h"
#include "collectives/shm_common.h"
#include "reduce/reduce.h"

namespace rr::collectives::shm {

void allgatherSmall(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
                    char* out, size_t bytes) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  const uint64_t rd = lineRound(c, h, in, bytes);
  for (int p = 0; p < n; ++p)
    if (p != me) std::memcpy(out + static_cast<size_t>(p) * bytes, d.linePayload(p, rd), bytes);
  lineRelease(c, rd);
  c.addBytesDone(bytes * static_cast<size_t>(n - 1));
}

void reduceScatterSmall(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
                        char* out, size_t count, DataType dtype, ReduceOp op) {
  ShmDomain& d = *c.shm();
  const int me = d.rank(), n = d.world();
  const size_t es = elementSize(dtype), block = count * es;
  const DataType at = accumulateType(dtype);
  const bool half = isHalf(dtype);
  const uint64_t rd = lineRound(c, h, in, block * static_cast<size_t>(n));
  char* acc = c.scratch().get(comm::ScratchArena::kAcc, count * elementSize(at));
  float* wide = half ? reinterpret_cast<float*>(c.scratch().get(comm::ScratchArena::kRecv,
                                                                 count * sizeof(float)))
                     : nullptr;
  const size_t mine = static_cast<size_t>(me) * block;
  if (half)
    reduce::widen(dtype, in + mine, reinterpret_cast<float*>(acc), count);
  else
    std::memcpy(acc, in + mine, block);
  const reduce::ReduceFn f = reduce::getReduceFn(at, op);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const char* theirs = d.linePayload(p, rd) + mine;
    if (half) {
      reduce::widen(dtype, theirs, wide, count);
      f(acc, wide, count);
    } else {
      f(acc, theirs, count);
    }
  }
  lineRelease(c, rd);
  reduce::finalize(dtype, op, n, acc, out, count);
  c.addBytesDone(block * static_cast<size_t>(n - 1));
}

}  // namespace rr::collectives::shm
