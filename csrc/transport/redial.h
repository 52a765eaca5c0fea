// When a dial is tried again: one rule for init's mesh (tcp/mesh.cc) and lazy connections
// (comm/lazy_connect.cc). A connection that the peer being dialled closed before its hello
// or reply (PeerCause::kClosed) is dialled again while time is left: a listener flooded with
// strangers' connections drops or refuses some of its own (tcp/accept_queue.h; a helper's
// flood failed 2 of 3 inits and 20 of 30 group set-ups); a peer that is gone refuses the next
// dial, and its caller names it unreachable. Anything else is not retried.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"

namespace rr::transport {

class Redial {
 public:
  // Whether `e`, raised dialling `peer`, earns another dial before `d`.
  bool again(const PeerError& e, int peer, const Deadline& d) {
    return e.cause() == PeerCause::kClosed && e.peer() == peer && !d.expired() &&
           attempt_++ < kAttempts;
  }
  // The pause before that dial: 5 ms, doubling to 200 ms.
  void pause() {
    std::this_thread::sleep_for(std::chrono::milliseconds(backoffMs_));
    backoffMs_ = std::min(backoffMs_ * 2, kMaxBackoffMs);
  }

 private:
  static constexpr int kAttempts = 1000;  // the deadline bounds them first, in practice
  static constexpr int kMaxBackoffMs = 200;
  int attempt_ = 1;
  int backoffMs_ = 5;
};

}  // namespace rr::transport
