// NCCL loaded at run time with dlopen, so ringreduce builds without NCCL and a CPU machine
// never needs it. Python (ringreduce/gpu/device.py) decides where to look -- RINGREDUCE_NCCL_PATH,
// the nvidia-nccl-cu12/-cu13 wheels, then the system's libnccl.so.2 -- and passes the
// candidates here; this file only tries them in order.
//
// The first successful load is kept for the life of the process (NCCL starts threads, so it
// is never dlclose'd); later calls return it whatever candidates they pass. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "nccl/nccl_abi.h"

namespace rr::nccl {

// NCCL could not be loaded or is too old; the message lists what was tried and what to do.
class NcclUnavailable : public Error {
 public:
  using Error::Error;
};

// An NCCL call failed; the message has NCCL's error name and its last error text.
class NcclError : public Error {
 public:
  NcclError(abi::Result code, const std::string& what) : Error(what), code_(code) {}
  abi::Result code() const { return code_; }

 private:
  abi::Result code_;
};

constexpr int kMinVersionCode = 21000;  // 2.10.0: bfloat16 and ncclAvg

struct Library {
  std::string path;      // the candidate that loaded (as given, or the file in a directory)
  int versionCode = 0;   // ncclGetVersion(): 22303 for 2.23.3
  std::string version;   // "2.23.3"
  bool hasConfigInit = false;  // ncclCommInitRankConfig (2.14+): non-blocking init
  // Required entry points.
  abi::GetVersionFn getVersion = nullptr;
  abi::GetUniqueIdFn getUniqueId = nullptr;
  abi::CommInitRankFn commInitRank = nullptr;
  abi::AllReduceFn allReduce = nullptr;
  abi::BroadcastFn broadcast = nullptr;
  abi::AllGatherFn allGather = nullptr;
  abi::ReduceScatterFn reduceScatter = nullptr;
  abi::CommGetAsyncErrorFn commGetAsyncError = nullptr;
  abi::CommAbortFn commAbort = nullptr;
  abi::CommDestroyFn commDestroy = nullptr;
  abi::GetErrorStringFn getErrorString = nullptr;
  abi::GroupFn groupStart = nullptr;
  abi::GroupFn groupEnd = nullptr;
  // Optional entry points (null when this NCCL lacks them).
  abi::CommInitRankConfigFn commInitRankConfig = nullptr;
  abi::CommFinalizeFn commFinalize = nullptr;
  abi::GetLastErrorFn getLastError = nullptr;

  // "ncclInvalidUsage (invalid usage): <last error>" for messages.
  std::string describe(abi::Result r, abi::Comm comm = nullptr) const;
  // Throws NcclError naming `what` unless r is success.
  void check(abi::Result r, const char* what, abi::Comm comm = nullptr) const;
};

// Each candidate is a file path, a directory holding libnccl.so.2, or a bare soname that
// dlopen resolves through LD_LIBRARY_PATH and the ldconfig cache. Throws NcclUnavailable.
const Library& load(const std::vector<std::string>& candidates);
// The loaded library, or nullptr when load() has not succeeded yet.
const Library* loaded();

// "2.23.3" from 22303 (and "2.8.4" from the pre-2.9 encoding 2804).
std::string versionString(int code);
// NCCL's enumerator name for a result code ("ncclRemoteError").
const char* resultName(abi::Result r);

}  // namespace rr::nccl
