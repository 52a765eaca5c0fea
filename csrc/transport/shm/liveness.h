// Liveness of local peers without sockets. A communicator whose ranks all share one host
// (a group: ringreduce.groups) needs no TCP connection -- shared memory carries its data --
// so what a connection told a waiting rank comes through the segments and the kernel:
//   - a peer that failed writes its abort code and reason into its control block
//     (ShmDomain::publishAbort) where the TCP path sends an abort frame;
//   - a peer that leaves on purpose (destroy) sets its "left" word, the TCP goodbye;
//   - a peer that dies is seen through a pidfd (Linux >= 5.3), readable once the process
//     has exited, where the TCP path sees EOF.
// A pidfd is opened only for a peer whose pid and start time (both published in its
// control block) match /proc/<pid>/stat here, so a peer in another PID namespace is never
// confused with an unrelated process of ours; such a peer (or a kernel without pidfd) is
// watched by heartbeats only. Pidfds are shared by every communicator of the process (one
// per peer process, reference counted): a new group on the same ranks opens none.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace rr::transport::shm {

class ShmDomain;

// This process's start time in clock ticks since boot (/proc/self/stat field 22).
uint64_t processStartTime();

class PeerProcesses {
 public:
  // Open (or share) a pidfd for every local peer of `d` (after attach) that checks out.
  explicit PeerProcesses(ShmDomain& d);
  ~PeerProcesses();
  PeerProcesses(const PeerProcesses&) = delete;
  PeerProcesses& operator=(const PeerProcesses&) = delete;
  // The local rank of a peer whose process has exited (one `skip` says no to), or -1. Never
  // blocks.
  int exited(bool (*skip)(const void*, int) = nullptr, const void* ctx = nullptr);
  // Stop watching local rank `r` (it left on purpose before its process ended), so that
  // exited() reports the others.
  void forget(int r);
  // Local peers watched through a pidfd (the others: heartbeats only).
  int watched() const { return static_cast<int>(pfds_.size()); }

 private:
  std::vector<std::pair<pid_t, uint64_t>> keys_;  // per local rank; pid 0: not watched
  std::vector<pollfd> pfds_;  // the watched peers' shared pidfds
  std::vector<int> rankOf_;   // local rank of each pfds_ entry
};

}  // namespace rr::transport::shm
