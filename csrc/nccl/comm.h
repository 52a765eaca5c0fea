// A thin NCCL communicator: collectives enqueued on the caller's CUDA stream, completion
// tracked with CUDA events, and every wait bounded by a deadline.
//
// Failure model (a dead peer must raise, never hang):
//  - init uses NCCL's non-blocking mode (ncclCommInitRankConfig, NCCL >= 2.14) and polls
//    ncclCommGetAsyncError until every rank joined or `timeoutSec` passed; on timeout the
//    half-built communicator is aborted and TimeoutError names the missing ranks' job.
//    (NCCL 2.10-2.13 only has blocking init: it cannot be bounded, and a warning says so.)
//  - each collective gets a deadline of `timeoutSec` from its launch. A watchdog thread
//    polls outstanding events and ncclCommGetAsyncError every few milliseconds; an async
//    error or a passed deadline calls ncclCommAbort (which also ends the NCCL kernels the
//    stream is stuck in) and stores the error, which every later call and wait() rethrows.
//    The communicator is then unusable until re-created.
//
// Threading: collectives, destroy() and the NcclWork methods may be called from any one
// user thread at a time (as torch issues collectives); the watchdog thread only polls and
// aborts. callMu_ serialises NCCL calls that use comm_ with abort/destroy, which free it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/deadline.h"
#include "core/types.h"
#include "nccl/loader.h"

namespace rr::nccl {

class NcclComm;

// One outstanding collective as the watchdog sees it (owns the CUDA event).
struct Pending {
  Pending(std::string what, uint64_t seq, size_t bytes, void* event, Deadline deadline);
  ~Pending();
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  std::string what;
  uint64_t seq;
  size_t bytes;
  void* event;  // recorded on the caller's stream right after the NCCL call
  Deadline deadline;
};

// The handle of one collective. Holds its communicator alive.
class NcclWork {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, std::shared_ptr<Pending> p);
  // True once the GPU finished the collective; rethrows the communicator's failure.
  bool isCompleted();
  // Block the host until done (timeoutSec < 0: until done or the collective's deadline).
  // Returns false if still running at timeoutSec; throws on failure or deadline.
  bool wait(double timeoutSec);
  // Make `stream` wait for the collective without blocking the host (torch's semantics).
  void synchronizeStream(void* stream);
  const std::string& what() const { return p_->what; }
  uint64_t seq() const { return p_->seq; }

 private:
  std::shared_ptr<NcclComm> comm_;
  std::shared_ptr<Pending> p_;
  bool done_ = false;
};

class NcclComm : public std::enable_shared_from_this<NcclComm> {
 public:
  // uniqueId: the 128 bytes rank 0 got from ncclGetUniqueId (shared through the store).
  // The calling thread's current device is left as it was. Throws CudaUnavailable (no
  // device), NcclError, or TimeoutError when not every rank joined within timeoutSec.
  // Collective deadlines run from launch (enqueue), as torch's NCCL watchdog measures them.
  static std::shared_ptr<NcclComm> create(const Library& lib, const std::string& uniqueId,
                                          int rank, int world, int device, double timeoutSec);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // In-place when send == recv. count is per rank for allgather (send) and reduce-scatter
  // (recv), as in NCCL. Zero counts launch nothing (every rank must pass the same count).
  std::shared_ptr<NcclWork> allreduce(const void* send, void* recv, size_t count, DataType t,
                                      ReduceOp op, void* stream);
  std::shared_ptr<NcclWork> broadcast(const void* send, void* recv, size_t count, DataType t,
                                      int root, void* stream);
  std::shared_ptr<NcclWork> allgather(const void* send, void* recv, size_t sendCount,
                                      DataType t, void* stream);
  std::shared_ptr<NcclWork> reduceScatter(const void* send, void* recv, size_t recvCount,
                                          DataType t, ReduceOp op, void* stream);
  // An all-reduce of one int32 in a device scratch word.
  std::shared_ptr<NcclWork> barrier(void* stream);

  // Abort now (any thread): pending work fails with `why`.
  void abort(const std::string& why);
  // Flush and free (bounded by the timeout; aborts instead if that passes). Idempotent.
  void destroy();

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  uint64_t seq() const { return seq_; }
  bool failed();
  bool destroyed();
  // Rethrows the stored failure, or throws if destroyed.
  void checkUsable();
  // Polls NCCL's async error and `p`'s deadline (aborting on either); rethrows failure.
  void poll(const Pending* p);

 private:
  NcclComm(const Library& lib, int rank, int world, int device, double timeoutSec);
  void init(const std::string& uniqueId);
  // Polls ncclCommGetAsyncError until it leaves ncclInProgress (non-blocking comms).
  void waitReady(const char* what, Deadline deadline);
  // Runs one NCCL enqueue call under callMu_ and waits out ncclInProgress; a failure
  // aborts the communicator and throws.
  void launch(const char* what, const std::function<abi::Result()>& call);
  std::shared_ptr<NcclWork> track(const char* what, size_t bytes, void* stream);
  void fail(std::exception_ptr e, const std::string& why);
  void watchdog();
  std::string where(const char* what, uint64_t seq, size_t bytes) const;

  const Library& lib_;
  const int rank_, world_, device_;
  const double timeoutSec_;
  abi::Comm comm_ = nullptr;
  bool nonBlocking_ = false;
  uint64_t seq_ = 0;
  void* barrierWord_ = nullptr;

  std::mutex callMu_;  // held around NCCL calls on comm_, abort and destroy
  std::mutex mu_;      // guards everything below
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Pending>> pending_;
  std::exception_ptr error_;
  bool destroyed_ = false;
  bool stop_ = false;
  std::thread watchdog_;
};

// NCCL's codes for our dtype/op (throws InvalidArgument for ones NCCL lacks).
abi::DataType toNccl(DataType t);
abi::RedOp toNccl(ReduceOp op);

// ncclGetUniqueId as 128 raw bytes (rank 0 calls this and shares them).
std::string getUniqueId(const Library& lib);

}  // namespace rr::nccl
