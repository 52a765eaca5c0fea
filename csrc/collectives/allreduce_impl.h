// Shared arguments of the two all-reduce algorithms (internal to collectives/).
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/segments.h"
#include "comm/communicator.h"
#include "reduce/reduce.h"

namespace rr::collectives {

struct AllreduceArgs {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  char* dst = nullptr;  // user buffer (in/out)
  // A coalesced call's buffers, in place (dst null): read only by the shared-memory large
  // path; every other path gets one flat buffer (allreduceCoalesced).
  const Segments* segs = nullptr;
  char* acc = nullptr;  // accumulator: == dst unless dtype is 16-bit (then float32 scratch)
  size_t accElem = 0;
  reduce::ReduceFn reduceFn = nullptr;  // of accumulateType(dtype)
  // 16-bit partial sums on the wire (RINGREDUCE_HALF_WIRE=16; ring and tree only): acc ==
  // dst holds 16-bit values (accElem 2); every hop widens, reduces in float32 and rounds.
  bool halfWire = false;
  // float16 avg whose partial sums are rounded to float16 on the way (half_avg.h): the ring
  // and the tree scale each partial sum of m values by 2^-ceil(log2 m) as they reduce.
  bool halfAvgHops = false;
  // > 0: the values reduced arrive scaled by 2^-inputScaleExp (the hierarchical plan's
  // cross-host ring: its hosts' local sums); the finished float32 sums are scaled back
  // before finalize.
  int inputScaleExp = 0;
  // > 0: shared memory scales its float32 sum by 2^-sumScaleExp before rounding it to 16
  // bits (the hierarchical plan's local level; its op is then sum).
  int sumScaleExp = 0;
  // >= 0: a reduce to this rank (shared memory only): every rank does its share of the
  // work, but only the root's buffer receives the result; the others' stay as they were.
  int root = -1;
  // True when acc must be post-processed into dst (avg division or rounding to 16 bits).
  bool needsFinalize() const { return op == ReduceOp::kAvg || acc != dst || halfWire; }
};

// Whether 16-bit floats of this all-reduce / reduce-scatter travel as 16 bits over TCP.
inline bool halfOnWire(const comm::Communicator& c, DataType t) {
  return isHalf(t) && c.options().halfWireBits == 16;
}

// members: ring over these global ranks only (hierarchical all-reduce), else all ranks.
// avg always divides by the communicator's world size.
void allreduceRing(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
                   const std::vector<int>* members = nullptr);
void allreduceHier(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
                   const std::vector<int>& slicePeers);
void allreduceTree(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a);
// reduce.cc's shared-memory path (every rank on one host): the shared-memory all-reduce
// with AllreduceArgs::root set -- only root's buf changes. allreduce.cc.
void reduceShm(comm::Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op,
               int root);

}  // namespace rr::collectives
