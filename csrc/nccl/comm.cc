#include "nccl/comm.h"

#include <chrono>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "core/log.h"
#include "cuda/runtime.h"

namespace rr::nccl {
namespace {

// Makes the communicator's device current for the calling thread and restores the old one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : prev_(cuda::currentDevice()) {
    if (prev_ != device) cuda::setDevice(device);
  }
  ~DeviceGuard() {
    if (prev_ >= 0) {
      try {
        if (cuda::currentDevice() != prev_) cuda::setDevice(prev_);
      } catch (...) {  // a destructor must not throw; the next CUDA call reports problems
      }
    }
  }

 private:
  int prev_;
};

// Spin briefly, then sleep with a growing back-off (the test boxes have 2 cores).
class Backoff {
 public:
  void pause() {
    if (++n_ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleepUs_));
    if (sleepUs_ < 2000) sleepUs_ *= 2;
  }

 private:
  int n_ = 0;
  int sleepUs_ = 50;
};

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(10);

}  // namespace

abi::DataType toNccl(DataType t) {
  switch (t) {
    case DataType::kFloat32: return abi::kFloat32;
    case DataType::kFloat64: return abi::kFloat64;
    case DataType::kFloat16: return abi::kFloat16;
    case DataType::kBFloat16: return abi::kBfloat16;
    case DataType::kInt8: return abi::kInt8;
    case DataType::kUInt8: return abi::kUint8;
    case DataType::kInt32: return abi::kInt32;
    case DataType::kInt64: return abi::kInt64;
    case DataType::kUInt32: return abi::kUint32;
    case DataType::kUInt64: return abi::kUint64;
    case DataType::kBool:
    case DataType::kInt16:
    case DataType::kUInt16:
      RR_THROW(InvalidArgument, "NCCL has no ", toString(t), " reductions in ringreduce yet; "
               "pass backend=\"staged\" for ", toString(t), " CUDA tensors");
  }
  RR_THROW(InvalidArgument, "NCCL: unknown dtype code ", static_cast<int>(t));
}

abi::RedOp toNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return abi::kSum;
    case ReduceOp::kAvg: return abi::kAvg;
    case ReduceOp::kProd: return abi::kProd;
    case ReduceOp::kMin: return abi::kMin;
    case ReduceOp::kMax: return abi::kMax;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      RR_THROW(InvalidArgument, "NCCL has no bitwise reductions (op=", toString(op),
               "); pass backend=\"staged\"");
  }
  RR_THROW(InvalidArgument, "NCCL: unknown reduce op code ", static_cast<int>(op));
}

std::string getUniqueId(const Library& lib) {
  abi::UniqueId id;
  std::memset(&id, 0, sizeof(id));
  lib.check(lib.getUniqueId(&id), "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

// ---- Pending / NcclWork ----------------------------------------------------------------

Pending::Pending(std::string w, uint64_t s, size_t b, void* ev, Deadline d)
    : what(std::move(w)), seq(s), bytes(b), event(ev), deadline(d) {}

Pending::~Pending() { cuda::eventDestroy(event); }  // CUDA defers it until the event fired

NcclWork::NcclWork(std::shared_ptr<NcclComm> comm, std::shared_ptr<Pending> p)
    : comm_(std::move(comm)), p_(std::move(p)) {}

bool NcclWork::isCompleted() {
  if (done_) return true;
  comm_->checkUsable();
  if (p_->event == nullptr || cuda::eventDone(p_->event)) done_ = true;
  return done_;
}

bool NcclWork::wait(double timeoutSec) {
  const Deadline user = timeoutSec < 0 ? Deadline::never() : Deadline::after(timeoutSec);
  Backoff b;
  for (;;) {
    if (isCompleted()) return true;
    comm_->poll(p_.get());  // aborts and throws once the collective's deadline passed
    if (user.expired()) return false;
    b.pause();
  }
}

void NcclWork::synchronizeStream(void* stream) {
  comm_->checkUsable();
  if (!done_ && p_->event != nullptr) cuda::streamWaitEvent(stream, p_->event);
}

// ---- NcclComm ---------------------------------------------------------------------------

NcclComm::NcclComm(const Library& lib, int rank, int world, int device, double timeoutSec)
    : lib_(lib), rank_(rank), world_(world), device_(device), timeoutSec_(timeoutSec) {}

std::shared_ptr<NcclComm> NcclComm::create(const Library& lib, const std::string& uniqueId,
                                           int rank, int world, int device,
                                           double timeoutSec) {
  if (uniqueId.size() != abi::kUniqueIdBytes) {
    RR_THROW(InvalidArgument, "NCCL unique id must be ", abi::kUniqueIdBytes, " bytes, got ",
             uniqueId.size());
  }
  if (world < 1 || rank < 0 || rank >= world) {
    RR_THROW(InvalidArgument, "NCCL: rank ", rank, " out of range for world size ", world);
  }
  if (!(timeoutSec > 0)) RR_THROW(InvalidArgument, "NCCL: timeout must be > 0 seconds");
  cuda::requireDevice(device);  // "no CUDA device ..." before NCCL is touched
  // NCCL binds the communicator to the current device; the caller's is restored after.
  DeviceGuard dg(device);
  std::shared_ptr<NcclComm> c(new NcclComm(lib, rank, world, device, timeoutSec));
  c->init(uniqueId);
  c->watchdog_ = std::thread([raw = c.get()] { raw->watchdog(); });
  return c;
}

void NcclComm::init(const std::string& uniqueId) {
  abi::UniqueId id;
  std::memcpy(id.internal, uniqueId.data(), abi::kUniqueIdBytes);
  const Deadline deadline = Deadline::after(timeoutSec_);
  if (lib_.hasConfigInit) {
    abi::Config214 cfg{sizeof(abi::Config214), abi::kApiMagic, abi::kVersion214,
                       0 /* non-blocking */,   abi::kConfigUndefInt, abi::kConfigUndefInt,
                       abi::kConfigUndefInt,   nullptr};
    const abi::Result r = lib_.commInitRankConfig(&comm_, world_, id, rank_, &cfg);
    if (r != abi::kSuccess && r != abi::kInProgress) {
      if (comm_) lib_.commAbort(comm_);
      comm_ = nullptr;
      lib_.check(r, "ncclCommInitRankConfig");
    }
    nonBlocking_ = true;
    try {
      waitReady("ncclCommInitRankConfig", deadline);
    } catch (const TimeoutError&) {
      lib_.commAbort(comm_);
      comm_ = nullptr;
      RR_THROW(TimeoutError, "NCCL init of rank ", rank_, " of ", world_, " on device ", device_,
               " did not complete within ", timeoutSec_, " s: some rank never joined (did every "
               "rank call init with the same unique id and world size?)");
    } catch (...) {
      if (comm_) lib_.commAbort(comm_);
      comm_ = nullptr;
      throw;
    }
  } else {
    RR_WARN("NCCL ", lib_.version, " has no non-blocking init (needs >= 2.14): "
            "ncclCommInitRank cannot be bounded by the timeout if a rank never joins");
    lib_.check(lib_.commInitRank(&comm_, world_, id, rank_), "ncclCommInitRank");
  }
  // The barrier all-reduces this word; its value is never read, so it is not initialised
  // (which would need a synchronisation with whatever the device is running).
  barrierWord_ = cuda::deviceMalloc(sizeof(int32_t));
}

NcclComm::~NcclComm() {
  try {
    destroy();
  } catch (const std::exception& e) {
    RR_WARN("NCCL communicator destroy failed: ", e.what());
  }
}

void NcclComm::waitReady(const char* what, Deadline deadline) {
  if (!nonBlocking_) return;
  Backoff b;
  for (;;) {
    abi::Result state = abi::kSuccess;
    const abi::Result r = lib_.commGetAsyncError(comm_, &state);
    lib_.check(r, "ncclCommGetAsyncError", comm_);
    if (state == abi::kSuccess) return;
    if (state != abi::kInProgress) lib_.check(state, what, comm_);
    if (deadline.expired()) {
      RR_THROW(TimeoutError, what, " still in progress after ", timeoutSec_, " s");
    }
    b.pause();
  }
}

bool NcclComm::failed() {
  std::lock_guard<std::mutex> g(mu_);
  return error_ != nullptr;
}

bool NcclComm::destroyed() {
  std::lock_guard<std::mutex> g(mu_);
  return destroyed_;
}

void NcclComm::checkUsable() {
  std::lock_guard<std::mutex> g(mu_);
  if (error_) std::rethrow_exception(error_);
  if (destroyed_) throw Error("NCCL communicator was destroyed; create a new one");
}

std::string NcclComm::where(const char* what, uint64_t seq, size_t bytes) const {
  return detail::concat("NCCL ", what, " #", seq, " (", bytes, " bytes) on rank ", rank_, " of ",
                        world_, ", device ", device_);
}

void NcclComm::fail(std::exception_ptr e, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (error_ || destroyed_) return;
    error_ = e;
  }
  RR_WARN("aborting NCCL communicator: ", why);
  std::lock_guard<std::mutex> call(callMu_);
  if (comm_) {
    lib_.commAbort(comm_);  // also ends the NCCL kernels a stream is stuck in
    comm_ = nullptr;
  }
  cv_.notify_all();
}

void NcclComm::abort(const std::string& why) {
  fail(std::make_exception_ptr(Error("NCCL communicator aborted: " + why)), why);
}

void NcclComm::poll(const Pending* p) {
  checkUsable();
  abi::Result state = abi::kSuccess;
  {
    std::lock_guard<std::mutex> call(callMu_);
    if (comm_) lib_.commGetAsyncError(comm_, &state);
  }
  if (state != abi::kSuccess && state != abi::kInProgress) {
    const std::string msg = (p ? where(p->what.c_str(), p->seq, p->bytes) : "NCCL") +
                            " failed: " + lib_.describe(state) +
                            "; the communicator was aborted, re-initialise it";
    fail(std::make_exception_ptr(NcclError(state, msg)), msg);
  } else if (p && p->deadline.expired()) {
    const std::string msg = where(p->what.c_str(), p->seq, p->bytes) +
                            " did not complete within " + std::to_string(timeoutSec_) +
                            " s: a peer is dead or stuck, or ranks issued different "
                            "collectives; the communicator was aborted, re-initialise it";
    fail(std::make_exception_ptr(TimeoutError(msg)), msg);
  }
  checkUsable();
}

void NcclComm::watchdog() {
  try {
    cuda::setDevice(device_);
  } catch (...) {
  }
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (pending_.empty() || error_) {
      cv_.wait(lk, [&] { return stop_ || (!pending_.empty() && !error_); });
      continue;
    }
    std::vector<std::shared_ptr<Pending>> snap = pending_;
    lk.unlock();
    std::shared_ptr<Pending> oldestUnfinished;
    std::vector<const Pending*> finished;
    try {
      for (const auto& p : snap) {
        if (cuda::eventDone(p->event)) finished.push_back(p.get());
        else if (!oldestUnfinished) oldestUnfinished = p;
      }
      poll(oldestUnfinished.get());  // async error, or the oldest's deadline
    } catch (const Error&) {
      // poll() stored the failure and aborted; an eventDone() CudaError is stored here.
      if (!failed()) fail(std::current_exception(), "CUDA error while polling NCCL work");
    }
    lk.lock();
    for (const Pending* f : finished) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->get() == f) {
          pending_.erase(it);
          break;
        }
      }
    }
    cv_.wait_for(lk, kWatchdogPeriod, [&] { return stop_; });
  }
}

void NcclComm::launch(const char* what, const std::function<abi::Result()>& call) {
  std::exception_ptr err;
  std::string msg;
  {
    std::lock_guard<std::mutex> lk(callMu_);
    if (comm_ != nullptr) {  // null: the watchdog aborted meanwhile; checkUsable() says why
      const abi::Result r = call();
      if (r == abi::kInProgress) {
        try {
          waitReady(what, Deadline::after(timeoutSec_));
        } catch (const std::exception& e) {
          err = std::current_exception();
          msg = where(what, seq_, 0) + " failed to launch: " + e.what();
        }
      } else if (r != abi::kSuccess) {
        msg = where(what, seq_, 0) + " failed to launch: " + lib_.describe(r, comm_);
        err = std::make_exception_ptr(NcclError(r, msg));
      }
    }
  }
  if (err) fail(err, msg);  // takes callMu_ itself to abort
  checkUsable();
}

std::shared_ptr<NcclWork> NcclComm::track(const char* what, size_t bytes, void* stream) {
  void* ev = cuda::eventCreate();
  try {
    cuda::eventRecord(ev, stream);
  } catch (...) {
    cuda::eventDestroy(ev);
    throw;
  }
  auto p = std::make_shared<Pending>(what, seq_, bytes, ev, Deadline::after(timeoutSec_));
  {
    std::lock_guard<std::mutex> g(mu_);
    pending_.push_back(p);
  }
  cv_.notify_all();
  return std::make_shared<NcclWork>(shared_from_this(), std::move(p));
}

// Every collective: checks, sequence number, device guard, the NCCL call, then an event.
#define RR_NCCL_COLLECTIVE(name, bytes, call)                                      \
  checkUsable();                                                                   \
  ++seq_;                                                                          \
  if ((bytes) == 0) {                                                              \
    auto p = std::make_shared<Pending>(name, seq_, 0, nullptr, Deadline::never()); \
    return std::make_shared<NcclWork>(shared_from_this(), std::move(p));           \
  }                                                                                \
  DeviceGuard dg(device_);                                                         \
  launch("nccl" name, [&] { return (call); });                                     \
  return track(name, (bytes), stream);

std::shared_ptr<NcclWork> NcclComm::allreduce(const void* send, void* recv, size_t count,
                                              DataType t, ReduceOp op, void* stream) {
  const abi::DataType nt = toNccl(t);
  const abi::RedOp no = toNccl(op);
  RR_NCCL_COLLECTIVE("AllReduce", count * elementSize(t),
                     lib_.allReduce(send, recv, count, nt, no, comm_, stream))
}

std::shared_ptr<NcclWork> NcclComm::broadcast(const void* send, void* recv, size_t count,
                                              DataType t, int root, void* stream) {
  const abi::DataType nt = toNccl(t);
  if (root < 0 || root >= world_) {
    RR_THROW(InvalidArgument, "NCCL broadcast: root ", root, " out of range for world size ",
             world_);
  }
  RR_NCCL_COLLECTIVE("Broadcast", count * elementSize(t),
                     lib_.broadcast(send, recv, count, nt, root, comm_, stream))
}

std::shared_ptr<NcclWork> NcclComm::allgather(const void* send, void* recv, size_t sendCount,
                                              DataType t, void* stream) {
  const abi::DataType nt = toNccl(t);
  RR_NCCL_COLLECTIVE("AllGather", sendCount * elementSize(t) * static_cast<size_t>(world_),
                     lib_.allGather(send, recv, sendCount, nt, comm_, stream))
}

std::shared_ptr<NcclWork> NcclComm::reduceScatter(const void* send, void* recv,
                                                  size_t recvCount, DataType t, ReduceOp op,
                                                  void* stream) {
  const abi::DataType nt = toNccl(t);
  const abi::RedOp no = toNccl(op);
  RR_NCCL_COLLECTIVE("ReduceScatter", recvCount * elementSize(t) * static_cast<size_t>(world_),
                     lib_.reduceScatter(send, recv, recvCount, nt, no, comm_, stream))
}

std::shared_ptr<NcclWork> NcclComm::barrier(void* stream) {
  RR_NCCL_COLLECTIVE("Barrier", sizeof(int32_t),
                     lib_.allReduce(barrierWord_, barrierWord_, 1, abi::kInt32, abi::kSum,
                                    comm_, stream))
}
#undef RR_NCCL_COLLECTIVE

void NcclComm::destroy() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (destroyed_) return;
    destroyed_ = true;
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard<std::mutex> call(callMu_);
  if (comm_ != nullptr) {
    bool clean = true;
    if (lib_.commFinalize != nullptr && nonBlocking_) {
      // Flush outstanding work, bounded: a dead peer turns this into an abort.
      try {
        const abi::Result r = lib_.commFinalize(comm_);
        if (r != abi::kSuccess && r != abi::kInProgress) lib_.check(r, "ncclCommFinalize", comm_);
        waitReady("ncclCommFinalize", Deadline::after(timeoutSec_));
      } catch (const std::exception& e) {
        RR_WARN("NCCL finalize failed (", e.what(), "); aborting the communicator");
        clean = false;
      }
    }
    if (clean) lib_.commDestroy(comm_);
    else lib_.commAbort(comm_);
    comm_ = nullptr;
  }
  if (barrierWord_) {
    cuda::deviceFree(barrierWord_);
    barrierWord_ = nullptr;
  }
  std::lock_guard<std::mutex> g(mu_);
  pending_.clear();
}

}  // namespace rr::nccl
