// Element types, reduction ops and collective kinds shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rr {

// The rank messages show for rank r of a communicator: labels[r] (a group's world ranks),
// or r itself (the world; an index outside the list).
inline int rankLabel(const std::vector<int>& labels, int r) {
  return r >= 0 && static_cast<size_t>(r) < labels.size() ? labels[static_cast<size_t>(r)] : r;
}
// rankLabel's inverse over a communicator of `size` ranks: the rank labelled `label`, or -1.
inline int rankOf(const std::vector<int>& labels, int size, int label) {
  for (int r = 0; r < size; ++r)
    if (rankLabel(labels, r) == label) return r;
  return -1;
}

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,  // one byte, 0 or 1 (numpy and torch): sum/max = or, prod/min = and
  kInt16 = 9,
  kUInt16 = 10,
  kUInt32 = 11,
  kUInt64 = 12,
};
constexpr int kNumDataTypes = 13;

// kBand/kBor/kBxor: bitwise, integer and bool types only. kAvg: not bool; on integers exact,
// rounded toward zero (collectives/int_avg.h).
enum class ReduceOp : uint8_t {
  kSum = 0, kAvg = 1, kProd = 2, kMin = 3, kMax = 4, kBand = 5, kBor = 6, kBxor = 7,
};
constexpr int kNumReduceOps = 8;

// Every frame on the wire names the collective it belongs to, so two ranks that
// issued different collectives detect it instead of exchanging garbage.
enum class CollectiveKind : uint8_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kAllGather = 4,
  kReduceScatter = 5,
  kReduce = 6,
  kGather = 7,
  kScatter = 8,
  kAllToAll = 9,
  kAbort = 100,    // payload: a short UTF-8 reason; the peer is failing
  kGoodbye = 101,  // the peer called destroy(): an EOF after this is not a crash
};

// kShm: the shared-memory algorithms, used by "auto" when every rank is on one host.
// kHier: shared memory inside each host + TCP ring between hosts (allreduce_hier.cc).
enum class Algorithm : uint8_t { kAuto = 0, kRing = 1, kTree = 2, kShm = 3, kHier = 4 };

size_t elementSize(DataType t);
const char* toString(DataType t);
const char* toString(ReduceOp op);
const char* toString(CollectiveKind k);
// A collective's name in messages. A point-to-point channel's transfers run as 2-rank
// broadcasts inside: there they are "send" (root == self) or "recv", "message" when the root
// is unknown (root < 0).
const char* kindName(CollectiveKind k, bool p2p, int root, int self);
const char* toString(Algorithm a);

// True for float16/bfloat16: these are reduced in float32 and rounded once.
inline bool isHalf(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }
inline bool isFloating(DataType t) {
  return isHalf(t) || t == DataType::kFloat32 || t == DataType::kFloat64;
}

// Throws InvalidArgument, saying what to do, when `op` cannot reduce `t` (bitwise ops on
// floats; avg on integers or bool, whose sum would wrap or saturate before the division).
void checkReduction(DataType t, ReduceOp op);

// The type partial results travel in during a reduction: float32 for 16-bit floats.
inline DataType accumulateType(DataType t) { return isHalf(t) ? DataType::kFloat32 : t; }

}  // namespace rr
