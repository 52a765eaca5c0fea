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

class Work {
 public:
  explicit Work(std::string what, uint32_t site = 0) : what_(std::move(what)), site_(site) {}

  void complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> g(mu_);
      exc_ = e;
      done_ = true;
    }
    cv_.notify_all();
  }
  bool isCompleted() {
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
  bool wait(double timeoutSec) {
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
    std::lock_guard<std::mutex> g(mu_);
    return exc_;
  }
  const std::string& what() const { return what_; }
  uint32_t site() const { return site_; }  // comm/site.h id of the issuing Python line

 private:
  std::string what_;
  uint32_t site_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr exc_;
  std::function<bool(Work*)> claim_;
};

}  // namespace rr::runtime
