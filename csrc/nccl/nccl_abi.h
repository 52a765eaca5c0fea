// The slice of NCCL's C ABI that ringreduce uses, declared here so that building needs no
// nccl.h: NCCL is dlopen'ed at run time (loader.h). Values are NCCL's (nccl.h, 2.10+), which
// NCCL keeps stable across releases.
#pragma once

#include <cstddef>

namespace rr::nccl::abi {

using Result = int;  // ncclResult_t
constexpr Result kSuccess = 0;
constexpr Result kUnhandledCudaError = 1;
constexpr Result kSystemError = 2;
constexpr Result kInternalError = 3;
constexpr Result kInvalidArgument = 4;
constexpr Result kInvalidUsage = 5;
constexpr Result kRemoteError = 6;
constexpr Result kInProgress = 7;

using DataType = int;  // ncclDataType_t
constexpr DataType kInt8 = 0, kUint8 = 1, kInt32 = 2, kUint32 = 3, kInt64 = 4, kUint64 = 5,
                   kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBfloat16 = 9;

using RedOp = int;  // ncclRedOp_t
constexpr RedOp kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4;

constexpr size_t kUniqueIdBytes = 128;
struct UniqueId {
  char internal[kUniqueIdBytes];
};

struct CommOpaque;
using Comm = CommOpaque*;  // ncclComm_t
using Stream = void*;      // cudaStream_t

// ncclConfig_t as of NCCL 2.14, the first release with it. NCCL reads `size` and `version`
// and fills every later field with its default, so this prefix stays valid for newer NCCLs.
struct Config214 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
};
constexpr unsigned int kApiMagic = 0xcafebeef;
constexpr int kConfigUndefInt = -2147483647 - 1;  // NCCL_CONFIG_UNDEF_INT (INT_MIN)
constexpr unsigned int kVersion214 = 21400;      // NCCL_VERSION(2, 14, 0)

// Function types (nccl.h prototypes).
using GetVersionFn = Result (*)(int*);
using GetUniqueIdFn = Result (*)(UniqueId*);
using CommInitRankFn = Result (*)(Comm*, int, UniqueId, int);
using CommInitRankConfigFn = Result (*)(Comm*, int, UniqueId, int, Config214*);
using AllReduceFn = Result (*)(const void*, void*, size_t, DataType, RedOp, Comm, Stream);
using BroadcastFn = Result (*)(const void*, void*, size_t, DataType, int, Comm, Stream);
using AllGatherFn = Result (*)(const void*, void*, size_t, DataType, Comm, Stream);
using ReduceScatterFn = Result (*)(const void*, void*, size_t, DataType, RedOp, Comm, Stream);
using CommGetAsyncErrorFn = Result (*)(Comm, Result*);
using CommAbortFn = Result (*)(Comm);
using CommDestroyFn = Result (*)(Comm);
using CommFinalizeFn = Result (*)(Comm);
using GetErrorStringFn = const char* (*)(Result);
using GetLastErrorFn = const char* (*)(Comm);
using GroupFn = Result (*)();

}  // namespace rr::nccl::abi
