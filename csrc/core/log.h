// Minimal levelled logging to stderr. The level is set once from Python (which reads
// RINGREDUCE_DEBUG); C++ never reads the environment itself.
#pragma once

#include <atomic>
#include <string>

#include "core/error.h"

namespace rr::log {

enum Level : int { kOff = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };
// RINGREDUCE_DEBUG's values, by Level (exported as _C.LOG_LEVELS; tunables.def lists them).
inline constexpr const char* kLevelNames[] = {"OFF", "WARN", "INFO", "DEBUG", "TRACE"};

void setLevel(int level);
int level();
void setPrefix(const std::string& prefix);  // e.g. "rank 3"
void write(int level, const std::string& msg);

}  // namespace rr::log

#define RR_LOG(lvl, ...)                                                       \
  do {                                                                         \
    if (::rr::log::level() >= (lvl)) {                                         \
      ::rr::log::write((lvl), ::rr::detail::concat(__VA_ARGS__));              \
    }                                                                          \
  } while (0)
#define RR_WARN(...) RR_LOG(::rr::log::kWarn, __VA_ARGS__)
#define RR_INFO(...) RR_LOG(::rr::log::kInfo, __VA_ARGS__)
#define RR_DEBUG(...) RR_LOG(::rr::log::kDebug, __VA_ARGS__)
