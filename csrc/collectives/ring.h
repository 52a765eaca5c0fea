// The pipelined ring engine shared by ring all-reduce, all-gather and reduce-scatter.
//
// The buffer is split into `world` chunks (chunking::chunkOffset), each chunk into segments
// of segElems elements. At step T every rank sends chunk (rank - T - shift) to its right
// neighbour and receives chunk (rank - T - shift - 1) from its left one:
//
//   rank:      0        1        2
//   step 0:  c0 -->   c1 -->   c2 -->  (each receives its left neighbour's chunk)
//   step 1:  c2 -->   c0 -->   c1 -->  (forwarding what it just received)
//
// Steps [0, rsSteps) reduce the incoming segment into `acc` (reduce-scatter); later steps
// copy it into `dst` (all-gather). Sends and receives run concurrently on one thread and
// are pipelined per segment: segment s of step T is sent as soon as segment s of step T-1
// has arrived (and been reduced), so data keeps flowing while earlier segments are reduced.
// After the last reduce step the rank owns the fully reduced chunk (rank - rsSteps - shift
// + 1 ... see allreduce_ring.cc); `onFinal` is called on each of its segments.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "reduce/reduce.h"

namespace rr::collectives {

struct RingPlan {
  size_t count = 0;   // elements in the whole buffer (all chunks)
  int steps = 0;      // total ring steps
  int rsSteps = 0;    // the first rsSteps steps reduce, the rest copy
  int shift = 0;      // chunk index offset (reduce-scatter uses 1 so rank r ends with chunk r)
  char* acc = nullptr;     // reduce-phase buffer (accumulate type)
  size_t accElem = 0;
  char* dst = nullptr;     // copy-phase buffer (user type)
  size_t dstElem = 0;
  char* recvScratch = nullptr;  // >= segElems * accElem bytes
  size_t segElems = 1;
  reduce::ReduceFn reduceFn = nullptr;
  std::function<void(size_t off, size_t len)> onFinal;  // optional
  // Ring over a subset of ranks (global ranks, this rank among them), or all when null.
  const std::vector<int>* members = nullptr;
};

void runRing(comm::Communicator& c, const transport::FrameHeader& tmpl, const RingPlan& p);

}  // namespace rr::collectives
