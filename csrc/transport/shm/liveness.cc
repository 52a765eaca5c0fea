#include "transport/shm/liveness.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/log.h"
#include "transport/shm/domain.h"

namespace rr::transport::shm {
namespace {

// Field 22 (starttime) of /proc/<pid>/stat; 0 if unreadable. The command name (field 2)
// may hold spaces and parentheses: fields are counted after its last ')'.
uint64_t startTimeOf(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  int field = 2;
  for (++p; *p && field < 22; ++p)
    if (*p == ' ' && p[1] != ' ') ++field;
  return field == 22 ? std::strtoull(p, nullptr, 10) : 0;
}

// (pid, start time) -> (pidfd, users): one pidfd per peer process, whatever number of
// communicators watch it (the start time keeps a reused pid apart from its dead owner).
using Key = std::pair<pid_t, uint64_t>;
struct Registry {
  std::mutex mu;
  std::map<Key, std::pair<int, int>> fds;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: communicators may outlive statics
  return *r;
}

int acquire(Key k) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.fds.find(k);
  if (it != r.fds.end()) {
    ++it->second.second;
    return it->second.first;
  }
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, k.first, 0));
#else
  const int fd = -1;
#endif
  if (fd < 0) return -1;
  r.fds[k] = {fd, 1};
  return fd;
}

void release(Key k) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.fds.find(k);
  if (it == r.fds.end() || --it->second.second > 0) return;
  ::close(it->second.first);
  r.fds.erase(it);
}

}  // namespace

uint64_t processStartTime() {
  static const uint64_t t = startTimeOf("/proc/self/stat");
  return t;
}

PeerProcesses::PeerProcesses(ShmDomain& d) : keys_(static_cast<size_t>(d.world()), {0, 0}) {
  int unverified = 0;
  for (int r = 0; r < d.world(); ++r) {
    if (r == d.rank()) continue;
    Control& c = d.ctl(r);
    const auto pid = static_cast<pid_t>(c.pid.v.load(std::memory_order_acquire));
    const uint64_t start = c.startTime.v.load(std::memory_order_relaxed);
    // The same pid and start time here as the peer saw for itself: our PID namespace.
    if (pid <= 0 || start == 0 ||
        startTimeOf("/proc/" + std::to_string(pid) + "/stat") != start) {
      ++unverified;
      continue;
    }
    const int fd = acquire({pid, start});
    if (fd < 0) {
      ++unverified;
      continue;
    }
    // Opened after the check: if the pid was reused in between, the process it names now
    // started later -- check again through the pidfd's own process.
    if (startTimeOf("/proc/" + std::to_string(pid) + "/stat") != start) {
      release({pid, start});
      ++unverified;
      continue;
    }
    keys_[static_cast<size_t>(r)] = {pid, start};
    pfds_.push_back({fd, POLLIN, 0});
    rankOf_.push_back(r);
  }
  // Once per process, as the README says (every group and channel repeated it: a helper).
  static std::atomic<bool> warned{false};
  if (unverified && !warned.exchange(true))
    RR_WARN(unverified, " local peer process(es) cannot be watched through a pidfd (another PID "
            "namespace, /proc not readable, or a kernel without pidfd_open): a death among "
            "them is noticed by heartbeats only (RINGREDUCE_HEARTBEAT_TIMEOUT), not at once; "
            "not repeated for later groups");
}

PeerProcesses::~PeerProcesses() {
  for (const auto& k : keys_)
    if (k.first) release(k);
}

void PeerProcesses::forget(int r) {
  for (size_t i = 0; i < rankOf_.size(); ++i) {
    if (rankOf_[i] != r) continue;
    pfds_.erase(pfds_.begin() + static_cast<std::ptrdiff_t>(i));
    rankOf_.erase(rankOf_.begin() + static_cast<std::ptrdiff_t>(i));
    return;  // keys_ keeps the pidfd's reference: the destructor releases it
  }
}

int PeerProcesses::exited(bool (*skip)(const void*, int), const void* ctx) {
  if (pfds_.empty() || ::poll(pfds_.data(), pfds_.size(), 0) <= 0) return -1;
  for (size_t i = 0; i < pfds_.size(); ++i)
    if (pfds_[i].revents && !(skip && skip(ctx, rankOf_[i]))) return rankOf_[i];
  return -1;
}

}  // namespace rr::transport::shm
