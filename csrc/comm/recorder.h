// Recorder: what this rank's collectives did and when. Always on and cheap (a few stores
// per collective): the last kFlight records form the flight recorder, dumped as JSON when
// the communicator fails; with tracing on, every record is kept (bounded) for a Chrome
// trace (RINGREDUCE_TRACE). Executor thread only, except snapshot() after the fact.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/types.h"

namespace rr::comm {

struct Record {
  uint64_t seq = 0;
  uint8_t kind = 0, dtype = 0, op = 0, algo = 0;
  int32_t root = 0;
  uint64_t count = 0, bytes = 0;
  uint32_t site = 0;  // comm/site.h id of the Python line that issued it
  int64_t startUs = 0, endUs = 0;  // wall clock (epoch) microseconds; endUs 0 = unfinished
  bool ok = true;
};

class Recorder {
 public:
  static constexpr size_t kFlight = 64;
  static constexpr size_t kMaxTrace = 1 << 20;

  // Wall-clock microseconds of a steady_clock reading: one clock read per record end
  // instead of two clocks per call (the offset is taken once per process; NTP slewing
  // over a job's life moves it by far less than a collective lasts).
  static int64_t wallUs(std::chrono::steady_clock::time_point t) {
    using std::chrono::microseconds;
    static const int64_t offset =
        std::chrono::duration_cast<microseconds>(
            std::chrono::system_clock::now().time_since_epoch()).count() -
        std::chrono::duration_cast<microseconds>(
            std::chrono::steady_clock::now().time_since_epoch()).count();
    return offset + std::chrono::duration_cast<microseconds>(t.time_since_epoch()).count();
  }
  static int64_t nowUs() { return wallUs(std::chrono::steady_clock::now()); }
  void setTracing(bool on) { tracing_ = on; }
  void start(const Record& r, std::chrono::steady_clock::time_point now) {
    cur_ = r;
    cur_.startUs = wallUs(now);
    cur_.endUs = 0;
    open_ = true;
  }
  void end(bool ok) {
    if (!open_) return;
    open_ = false;
    cur_.endUs = nowUs();
    cur_.ok = ok;
    ring_[n_ % kFlight] = cur_;
    ++n_;
    if (tracing_) {
      std::lock_guard<std::mutex> g(traceMu_);
      if (trace_.size() < kMaxTrace) trace_.push_back(cur_);
    }
  }
  // Last records, oldest first (including the unfinished one, if any).
  std::vector<Record> flight() const {
    std::vector<Record> out;
    size_t k = n_ < kFlight ? n_ : kFlight;
    for (size_t i = n_ - k; i < n_; ++i) out.push_back(ring_[i % kFlight]);
    if (open_) out.push_back(cur_);
    return out;
  }
  // A copy: Python reads it (trace_events) while the executor thread may still append --
  // a group destroyed with work queued (ThreadSanitizer found the reallocation under it).
  std::vector<Record> trace() const {
    std::lock_guard<std::mutex> g(traceMu_);
    return trace_;
  }

 private:
  Record ring_[kFlight];
  size_t n_ = 0;
  Record cur_;
  bool open_ = false;
  mutable std::mutex traceMu_;  // guards trace_ (appended by the executor, read by Python)
  bool tracing_ = false;
  std::vector<Record> trace_;
};

// JSON text of records (an array of objects), for flight-recorder dumps.
std::string recordsToJson(const std::vector<Record>& rs);
// `s` as the body of a JSON string: `"`, backslash and every control character (< 0x20, and
// DEL) escaped, invalid UTF-8 bytes replaced by U+FFFD, so the file is always valid JSON
// and json.loads gives back the original text.
std::string jsonEscape(const std::string& s);

}  // namespace rr::comm
