// Connections accepted on a listener but not authenticated yet (handshake.h), served all at
// once: each gets this rank's hello at accept and has kAnswerSec to answer; answers are read
// as they arrive. So a connection that says nothing (a port scanner, a stuck or hostile
// process) holds only its own slot. Before, the accept loops gave each connection up to 5 s
// in turn, and N silent ones kept the real peers out for N x 5 s (found by a helper: a job
// then failed with a false "rank 1 stopped responding").
//
// Not thread-safe: one thread (the set-up's, or the communicator's executor) drives it.
#pragma once

#include <poll.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace rr::transport::tcp {

class AcceptQueue {
 public:
  static constexpr double kAnswerSec = 5.0;  // a real peer answers in microseconds
  // Beyond kMaxPending: the oldest that has sent nothing for kYoungMs since its hello is
  // dropped; if every one is younger, the new connection is closed before its hello (a
  // real peer's dial tries again: mesh.cc). A burst of strangers accepted after a peer's
  // connection dropped that peer before it could answer (found by a helper's flood).
  static constexpr size_t kMaxPending = 64;
  static constexpr int kYoungMs = 200;

  // `what`: how this rank is named in warnings ("rank 3").
  AcceptQueue(Identity me, std::string what) : me_(std::move(me)), what_(std::move(what)) {}

  struct Accepted {
    int rank;
    std::string from;
    Fd fd;
  };

  // Accept every connection waiting on `listenFd` (never blocks) and send each the hello;
  // returns how many. Out of descriptors (EMFILE): the oldest pending one is dropped instead
  // of failing the caller.
  size_t acceptWaiting(int listenFd);
  // Wait (at most until `d`) until an answer is readable on a pending connection.
  void awaitAnswer(Deadline d) const;
  // Read the answers that arrived (never blocks); refuse bad ones and drop those out of
  // time (logged). Returns the authenticated connections. `wanted(ctx, rank)`: may that
  // rank connect now (not connected yet, expected).
  std::vector<Accepted> progress(bool (*wanted)(void*, int), void* ctx);
  // No connection is waiting to authenticate.
  bool empty() const;
  // Descriptors whose answers are awaited (poll them for POLLIN).
  std::vector<int> fds() const;
  // Milliseconds until the first answer is due (-1: none pending).
  int nextDueMs() const;

 private:
  struct Pending {
    Fd fd;
    std::string from;
    AcceptState st;
    uint8_t auth[kAuthBytes] = {};
    size_t got = 0;
    Deadline due;
    int64_t helloMs = 0;  // steadyMs() when its hello went out
  };
  // Read what `p` sent; true when its answer is complete. false + *why when it failed.
  static bool readAnswer(Pending& p, std::string* why);

  // Refusals are warned about at most once per kWarnEveryMs (with how many were not):
  // a port scanner made thousands of lines (found by a helper).
  static constexpr int64_t kWarnEveryMs = 10000;
  void warnRefused(const std::string& from, const std::string& why);
  int64_t lastWarnMs_ = -kWarnEveryMs;
  size_t unwarned_ = 0;

  Identity me_;
  std::string what_;
  std::vector<Pending> pending_;
};

}  // namespace rr::transport::tcp
