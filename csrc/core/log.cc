#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace rr::log {
namespace {
std::atomic<int> gLevel{kWarn};
std::mutex gMu;
std::string gPrefix;  // guarded by gMu
const char* name(int l) {
  switch (l) {
    case kWarn: return "WARN";
    case kInfo: return "INFO";
    case kDebug: return "DEBUG";
    case kTrace: return "TRACE";
    default: return "LOG";
  }
}
}  // namespace

void setLevel(int l) { gLevel.store(l, std::memory_order_relaxed); }
int level() { return gLevel.load(std::memory_order_relaxed); }
void setPrefix(const std::string& p) {
  std::lock_guard<std::mutex> g(gMu);
  gPrefix = p;
}

void write(int l, const std::string& msg) {
  std::lock_guard<std::mutex> g(gMu);
  std::fprintf(stderr, "[ringreduce %s%s%s] %s\n", name(l), gPrefix.empty() ? "" : " ",
               gPrefix.c_str(), msg.c_str());
  std::fflush(stderr);
}

}  // namespace rr::log
