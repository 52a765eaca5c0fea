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
  bool wait(double timeoutSec) {
    if (timeoutSec < 0 && claim_ && !isCompleted()) claim_(this);
    std::unique_lock<std::mutex> lk(mu_);
    if (timeoutSec < 0) {
      cv_.wait(lk, [&] { return done_; });
    } else if (!cv_.wait_for(lk, std::chrono::duration<double>(clampSeconds(timeoutSec)),
                             [&] { return done_; })) {
      return false;
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
