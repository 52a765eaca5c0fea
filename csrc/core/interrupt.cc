#include "core/interrupt.h"

#include <atomic>
#include <chrono>

namespace rr {

namespace {
std::atomic<InterruptCheck> gCheck{nullptr};
constexpr auto kEvery = std::chrono::milliseconds(100);
}  // namespace

void setInterruptCheck(InterruptCheck check) { gCheck.store(check); }

void checkInterrupt(bool now) {
  InterruptCheck check = gCheck.load(std::memory_order_relaxed);
  if (check == nullptr) return;
  thread_local std::chrono::steady_clock::time_point last{};
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - last < kEvery) return;
  last = t;
  std::string what;
  if (check(&what))
    RR_THROW(Interrupted, "interrupted: this rank's Python signal handler raised ", what,
             " (Ctrl-C, or a launcher stopping the job)");
}

}  // namespace rr
