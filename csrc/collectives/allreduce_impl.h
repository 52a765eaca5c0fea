// Shared arguments of the two all-reduce algorithms (internal to collectives/).
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "reduce/reduce.h"

namespace rr::collectives {

struct AllreduceArgs {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  char* dst = nullptr;  // user buffer (in/out)
  char* acc = nullptr;  // accumulator: == dst unless dtype is 16-bit (then float32 scratch)
  size_t accElem = 0;
  reduce::ReduceFn reduceFn = nullptr;
  // True when acc must be post-processed into dst (avg division or rounding to 16 bits).
  bool needsFinalize() const { return op == ReduceOp::kAvg || acc != dst; }
};

// members: ring over these global ranks only (hierarchical all-reduce), else all ranks.
// avg always divides by the communicator's world size.
void allreduceRing(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
                   const std::vector<int>* members = nullptr);
void allreduceHier(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a,
                   const std::vector<int>& slicePeers);
void allreduceTree(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a);

}  // namespace rr::collectives
