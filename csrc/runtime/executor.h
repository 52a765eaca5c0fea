// Executor: runs one communicator's collectives strictly in submission order on a worker
// thread, so async calls from Python never reorder and never need the GIL.
//
// A synchronous call made while nothing is queued runs on the caller's thread instead (the
// caller holds no GIL then): it saves two thread hand-offs, which is most of the latency of
// a small all-reduce. Ordering is preserved because the queue is empty and `execMu_` is held.
// Likewise a thread waiting for a queued Work that is next in line and not yet started runs
// it itself (Executor must be owned by a shared_ptr: Works hold it weakly for that).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "runtime/work.h"

namespace rr::runtime {

using Task = std::function<void(comm::Communicator&)>;

class Executor : public std::enable_shared_from_this<Executor> {
 public:
  explicit Executor(std::unique_ptr<comm::Communicator> comm);
  ~Executor();

  // Queue a collective; the Work completes when it has run (or failed).
  // `site`: where in the user's program it was issued (comm/site.h id, 0 = unknown).
  std::shared_ptr<Work> submit(Task fn, std::string what, uint32_t site = 0);
  // Run a collective now on this thread if nothing is queued, else queue it and wait.
  void runSync(Task fn, std::string what, uint32_t site = 0);
  // Run queued Work `w` now on this thread if it is next in line and the worker is idle
  // (else false: it runs, or ran, on the worker). Called from Work::wait.
  bool runIfNext(Work* w);

  // comm().incoming(peer) if nothing is queued or running (else false: what runs may be
  // reading that very message). Any thread; never blocks on a collective.
  bool incomingIdle(int peer);
  // comm().probePeers() if nothing is queued or running (what runs checks liveness itself).
  void probeIdle(const std::vector<int>& waitedFor = {}, bool anyOf = false);
  // fn(comm()) between collectives: waits for one that runs now (its deadline bounds that).
  // For readers of state only the running collective changes (the connection table).
  template <class F>
  auto between(F&& fn) {
    std::lock_guard<std::mutex> ex(execMu_);
    return fn(*comm_);
  }
  // fn(comm()) if no collective runs now, else `busy`: for readers that must not wait.
  template <class F, class T>
  T tryBetween(F&& fn, T busy) {
    std::unique_lock<std::mutex> ex(execMu_, std::try_to_lock);
    return ex.owns_lock() ? fn(*comm_) : busy;
  }

  // Fail the running collective and everything queued, promptly, and tell the peers --
  // also when nothing runs (the worker sends the abort then: before, an idle rank's abort()
  // reached no peer, which waited for it until RINGREDUCE_TIMEOUT). Thread-safe.
  void abort();
  // This process lost world rank `who.rank` on another channel of this one's group: fail
  // what runs here naming it, and tell the peer also when nothing runs (see
  // Communicator::failFromElsewhere). Thread-safe.
  void failFrom(const std::string& reason, transport::Culprit who);
  // A point-to-point channel's executor joins its group's family (Options::p2pFamily):
  // when one of them loses its peer (dead, frozen), the others fail naming that rank.
  static void joinFamily(const std::shared_ptr<Executor>& e);
  // Families and channels in them, process-wide (tests: destroyed channels leave).
  static std::pair<size_t, size_t> familyCounts();
  // abort() if anything is running (on the worker or inline on a caller's thread), wait for
  // it to end, join the worker and say goodbye to the peers. Idempotent; any thread.
  void shutdown();

  comm::Communicator& comm() { return *comm_; }
  // This process is a fork() of the one that made the executor (a DataLoader worker): its
  // thread, connections and segments are the parent's. Calls are refused; the owner must
  // leak it (its destructor would say goodbye for the parent and wait on the parent's thread).
  bool forked() const;

 private:
  // shutdown(): drop this channel from its family, and the family once it is empty.
  void leaveFamily();
  void loop();
  // Run `fn` on the calling thread; `g` holds mu_ on entry (released here, once execMu_
  // is held). Used by runSync and runIfNext. Returns the collective's failure or null.
  std::exception_ptr runInline(std::unique_lock<std::mutex>& g, Task& fn, uint32_t site);
  std::exception_ptr run(Task& fn);  // the collective's failure, with context, or null

  std::unique_ptr<comm::Communicator> comm_;
  std::mutex mu_;               // guards queue_, stop_, busy_
  std::condition_variable cv_;
  std::deque<std::pair<Task, std::shared_ptr<Work>>> queue_;
  bool stop_ = false;
  bool busy_ = false;           // worker is executing a task
  bool announce_ = false;       // abort() was called: the worker tells the peers
  // runSync calls executing on their caller's thread: raised under mu_ (so shutdown() sees
  // every call that got past its stop_ check), lowered without it (off the hot path's lock).
  std::atomic<int> inline_{0};
  std::mutex execMu_;           // held while any collective executes (worker or inline)
  std::thread worker_;
  unsigned forkGen_;  // the process's fork generation when this was made
};

}  // namespace rr::runtime
