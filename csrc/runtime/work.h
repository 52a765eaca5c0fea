// Work: the handle of one submitted collective. Completed exactly once by the executor,
// waited on by any thread; the collective's exception is kept and rethrown at wait().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

#include "core/deadline.h"
#include "core/interrupt.h"

namespace rr::runtime {

// Bumped in every forked child (executor.cc, pthread_atfork): a Work or executor made under
// another generation belongs to the parent, whose threads alone complete it.
unsigned forkGeneration();
// The error of a Work (`what`) waited for in a forked child before it completed.
[[noreturn]] void throwForkedWork(const std::string& what);

// The completion bell: rung by every Work's completion (and by Python for its own stand-ins),
// so one thread can wait for whichever of many Works completes first -- the Futures of
// collectives on different communicators complete in completion order, not issue order
// (ringreduce/_futures.py). completionBell() is the number of rings so far;
// awaitCompletionBell(seen, s) returns it once it differs from `seen`, or after s seconds.
void ringCompletionBell();
uint64_t completionBell();
uint64_t awaitCompletionBell(uint64_t seen, double timeoutSec);

class Work {
 public:
  explicit Work(std::string what, uint32_t site = 0)
      : what_(std::move(what)), site_(site), forkGen_(forkGeneration()) {}

  void complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      exc_ = e;
      done_ = true;
    }
    cv_.notify_all();
    ringCompletionBell();
  }
  bool isCompleted() {
    // In a forked child a Work the parent had not completed never will: completed (failed),
    // as wait() says at once -- a poller (a Future's completer) would wait for good.
    if (inForkedChild()) return true;
    std::lock_guard<std::mutex> g(mu_);
    return done_;
  }
  // Set once by the executor before the Work is queued: runs this Work on the waiting
  // thread if it is still the next one to run (see Executor::runIfNext).
  void setClaim(std::function<bool(Work*)> claim) { claim_ = std::move(claim); }

  // Wait up to timeoutSec (< 0: until done; the collective itself has a deadline).
  // Returns false if still running at the timeout; rethrows the collective's failure.
  // An unbounded wait on a Work the worker has not started yet runs it on this thread:
  // `async_op=True` followed at once by wait() (torch's dist.all_reduce does exactly that)
  // then costs what a synchronous call costs, not two thread hand-offs.
  // A Python signal handler that raises meanwhile stops the wait (Interrupted); the
  // collective goes on.
  // In a forked child (os.fork(), a DataLoader worker) a Work the parent had not completed
  // at the fork never completes: an error, not a wait without end.
  bool wait(double timeoutSec) {
    if (inForkedChild()) {
      if (!done_) throwForkedWork(what_);
      if (exc_) std::rethrow_exception(exc_);
      return true;
    }
    if (timeoutSec < 0 && claim_ && !isCompleted()) claim_(this);
    const auto end = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(clampSeconds(timeoutSec)));
    std::unique_lock<std::mutex> lk(mu_);
    while (!done_) {
      auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      if (timeoutSec >= 0 && end < until) until = end;
      cv_.wait_until(lk, until, [&] { return done_; });
      if (done_) break;
      if (timeoutSec >= 0 && std::chrono::steady_clock::now() >= end) return false;
      lk.unlock();
      try {
        checkInterrupt(true);  // every 100 ms of waiting
      } catch (const Interrupted& e) {
        throw Interrupted(std::string(e.what()) + " while waiting for " + what_ +
                          " (that collective goes on)");
      }
      lk.lock();
    }
    if (exc_) std::rethrow_exception(exc_);
    return true;
  }
  std::exception_ptr exception() {
    if (inForkedChild()) return exc_;
    std::lock_guard<std::mutex> g(mu_);
    return exc_;
  }
  const std::string& what() const { return what_; }
  uint32_t site() const { return site_; }  // comm/site.h id of the issuing Python line

 private:
  // A copy in a forked child: no thread of the child completes it, and mu_ may have been
  // held by a parent's thread at the fork, so it is read without the lock (the child's
  // threads are all its own: nothing writes it concurrently).
  bool inForkedChild() const { return forkGen_ != forkGeneration(); }

  std::string what_;
  uint32_t site_;
  unsigned forkGen_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr exc_;
  std::function<bool(Work*)> claim_;
};

}  // namespace rr::runtime
