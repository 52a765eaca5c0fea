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
//
// 16-bit wire (halfWire, RINGREDUCE_HALF_WIRE=16): `acc` holds float16/bfloat16 values, so
// partial sums travel as 16 bits. Each incoming segment and this rank's own values are
// widened into `wide`, reduced in float32 and rounded back into `acc` once per hop; at the
// last reduce step the float32 values go to onFinal unrounded (it rounds them, once).
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
  char* acc = nullptr;     // reduce-phase buffer (accumulate type; 16-bit with halfWire)
  size_t accElem = 0;
  char* dst = nullptr;     // copy-phase buffer (user type)
  size_t dstElem = 0;
  char* recvScratch = nullptr;  // >= segElems * accElem bytes
  size_t segElems = 1;
  reduce::ReduceFn reduceFn = nullptr;  // of the accumulate type (float32 with halfWire)
  bool halfWire = false;
  DataType half = DataType::kFloat16;  // with halfWire: the 16-bit type in acc and on the wire
  float* wide = nullptr;               // with halfWire: >= 2 * segElems floats
  // halfWire only (float16 avg, collectives/half_avg.h): a 16-bit partial sum of m values
  // travels multiplied by 2^-ceil(log2 m), so that none overflows and none is scaled more
  // than its count needs (values stay near the inputs' magnitude, not 1/n of it: fewer
  // subnormals). A rank's first send is its own values, unscaled; each step scales in
  // float32 (exact) what it forwards, and the last one the incoming sum back: onFinal gets
  // unscaled values.
  bool scaleHops = false;
  // Optional: the finished values of elements [off, off + len) in the accumulate type
  // (float32 for 16-bit floats); `vals` (the accumulator or scratch) is valid during the call
  // only, and the callback may change it in place.
  std::function<void(char* vals, size_t off, size_t len)> onFinal;
  // Ring over a subset of ranks (global ranks, this rank among them), or all when null.
  const std::vector<int>* members = nullptr;
  // Reduce-scatter: this rank's input (accElem bytes per element), left as it is. `acc`
  // then holds `slots` chunk buffers of slotElems elements, not the whole buffer: reduce
  // step T folds its chunk into slot T % slots (this rank's values copied in, segment by
  // segment, as they are needed), and step T + 1 sends it on from there; a slot is reused
  // only once its segment has gone (before, acc was a copy of the whole input: n chunks).
  const char* own = nullptr;
  int slots = 0;
  size_t slotElems = 0;
};

void runRing(comm::Communicator& c, const transport::FrameHeader& tmpl, const RingPlan& p);

}  // namespace rr::collectives
