#include "core/types.h"

#include "core/error.h"

namespace rr {

size_t elementSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kBool: return 1;
    case DataType::kInt16: return 2;
    case DataType::kUInt16: return 2;
    case DataType::kUInt32: return 4;
    case DataType::kUInt64: return 8;
  }
  throw InvalidArgument("unknown dtype code " + std::to_string(static_cast<int>(t)));
}

const char* toString(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kBool: return "bool";
    case DataType::kInt16: return "int16";
    case DataType::kUInt16: return "uint16";
    case DataType::kUInt32: return "uint32";
    case DataType::kUInt64: return "uint64";
  }
  return "unknown-dtype";
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "unknown-op";
}

void checkReduction(DataType t, ReduceOp op) {
  if (static_cast<int>(t) >= kNumDataTypes)
    RR_THROW(InvalidArgument, "unknown dtype code ", static_cast<int>(t));
  if (static_cast<int>(op) >= kNumReduceOps)
    RR_THROW(InvalidArgument, "unknown reduce op code ", static_cast<int>(op));
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (bitwise && isFloating(t))
    RR_THROW(InvalidArgument, "op=", toString(op), " is bitwise: it needs an integer or bool "
             "dtype, got ", toString(t), " (reinterpret the bits with .view(int) first)");
  // avg of integers is exact (collectives/int_avg.h); of bool it means nothing.
  if (op == ReduceOp::kAvg && t == DataType::kBool)
    RR_THROW(InvalidArgument, "op=avg of bool is not defined; use op=sum (or) or op=min (and), "
             "or convert to a numeric dtype first");
}

const char* toString(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "allreduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAllGather: return "allgather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kReduce: return "reduce";
    case CollectiveKind::kGather: return "gather";
    case CollectiveKind::kScatter: return "scatter";
    case CollectiveKind::kAllToAll: return "all_to_all";
    case CollectiveKind::kAbort: return "abort";
    case CollectiveKind::kGoodbye: return "goodbye";
  }
  return "unknown-collective";
}

const char* kindName(CollectiveKind k, bool p2p, int root, int self) {
  if (!p2p || k != CollectiveKind::kBroadcast) return toString(k);
  return root < 0 ? "message" : root == self ? "send" : "recv";
}

const char* toString(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kShm: return "shm";
    case Algorithm::kHier: return "hier";
  }
  return "unknown-algo";
}

const char* toString(PeerCause c) {
  switch (c) {
    case PeerCause::kClosed: return "closed";
    case PeerCause::kNetwork: return "network";
    case PeerCause::kSilent: return "silent";
    case PeerCause::kLeft: return "left";
    case PeerCause::kAborted: return "aborted";
    case PeerCause::kProtocol: return "protocol";
    case PeerCause::kCorrupt: return "corrupt";
    case PeerCause::kHandshake: return "handshake";
  }
  return "unknown";
}

}  // namespace rr
