// A point in time after which a wait gives up. Every blocking call takes one.
#pragma once

#include <chrono>
#include <climits>
#include <cstdint>

namespace rr {

// The longest wait anything may ask for: one year (366 days). Every wait has a deadline, and
// steady_clock's int64 nanoseconds overflow past ~292 years from its epoch, so longer
// requests are refused where they enter (Python's ringreduce._env.MAX_WAIT_S, exported from
// this, and optionsFromDict) and clamped here as the last line of defence.
constexpr double kMaxWaitSeconds = 366.0 * 24 * 3600;

// `seconds` clamped to [0, kMaxWaitSeconds]; NaN becomes 0 (an already expired deadline
// fails loudly at once instead of never).
inline double clampSeconds(double seconds) {
  if (!(seconds > 0)) return 0.0;
  return seconds < kMaxWaitSeconds ? seconds : kMaxWaitSeconds;
}

// Milliseconds on the steady clock (intervals only: heartbeat ages, stall times).
inline int64_t steadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // `seconds` is clamped (clampSeconds): no value can overflow the clock arithmetic.
  static Deadline after(double seconds) { return after(Clock::now(), seconds); }
  // `seconds` after `now` (a clock reading the caller already has).
  static Deadline after(Clock::time_point now, double seconds) {
    Deadline d;
    d.at_ = now + std::chrono::duration_cast<Clock::duration>(
                      std::chrono::duration<double>(clampSeconds(seconds)));
    return d;
  }
  static Deadline never() {
    Deadline d;
    d.at_ = Clock::time_point::max();
    return d;
  }

  bool expired() const { return Clock::now() >= at_; }

  // Milliseconds left, rounded up, clamped to [0, INT_MAX]: ready for poll(2).
  int pollMs() const {
    if (at_ == Clock::time_point::max()) return INT_MAX;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    long long ms = (left + 999) / 1000;
    return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
  }

  // The earlier of this and `seconds` from now.
  Deadline capped(double seconds) const {
    Deadline d = after(seconds);
    return d.at_ < at_ ? d : *this;
  }

 private:
  Clock::time_point at_{};
};

}  // namespace rr
