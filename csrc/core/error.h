// Exception hierarchy and value-printing checks. Library code never exits or
// aborts: it throws one of these, and the bindings map each to a Python class.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rr {

// Base of everything the library throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Caller passed something unusable (dtype, size, rank, ...); nothing was sent.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A deadline passed. The message names what was awaited and from whom. `waitingFor`: the
// rank this one was blocked on; `stuck`: where the wait chain (read from heartbeats) ends --
// a rank not in this collective or waiting for no rank -- here or on the rank whose abort
// relayed the timeout (`via`, else -1); -1 when unknown. Communicator ranks in the core;
// the executor makes them world ranks, as PeerError's.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what, int waitingFor = -1, int stuck = -1,
                        int via = -1)
      : Error(what), waitingFor_(waitingFor), stuck_(stuck), via_(via) {}
  int waitingFor() const { return waitingFor_; }
  int stuck() const { return stuck_; }
  int via() const { return via_; }

 private:
  int waitingFor_;
  int stuck_;
  int via_;
};

// Why a peer is considered failed: typed, so callers never search the message for it.
enum class PeerCause {
  kClosed,     // its connection closed or reset: the process exited or crashed
  kNetwork,    // a socket error other than a close
  kSilent,     // no heartbeat within the timeout: frozen, overloaded or partitioned
  kLeft,       // it said goodbye (destroy() or normal exit) while data was still expected
  kAborted,    // it failed and told us why (abort frame)
  kProtocol,   // it sent something that is not our protocol
  kCorrupt,    // a payload failed its checksum
  kHandshake,  // connecting or authenticating to it failed (the last: bindings/errors.cc)
};
const char* toString(PeerCause c);
// Dead, frozen or cut off: the peer will say no goodbye (it did not leave or give up).
inline bool isGone(PeerCause c) {
  return c == PeerCause::kClosed || c == PeerCause::kSilent || c == PeerCause::kNetwork;
}

// A peer died, closed its connection, sent an abort or violated the protocol. `via`: the
// rank that told this one (its abort frame named `peer`, which it lost), or -1 (seen here).
// `outside`: `peer` is a world rank outside the communicator (one a point-to-point
// channel's or group's peer lost elsewhere in the job, named by its abort or goodbye).
class PeerError : public Error {
 public:
  PeerError(int peer, PeerCause cause, const std::string& what, int via = -1,
            bool outside = false)
      : Error(what), peer_(peer), cause_(cause), via_(via), outside_(outside) {}
  int peer() const { return peer_; }
  PeerCause cause() const { return cause_; }
  int via() const { return via_; }
  bool outside() const { return outside_; }

 private:
  int peer_;
  PeerCause cause_;
  int via_;
  bool outside_;
};

// Ranks issued different collectives (kind, count, dtype, op or root differ). `via`: the
// rank whose abort frame said so (it found the mismatch), or -1 (found here); `peer`: the
// rank whose call differs from this rank's (found here), or -1.
class MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& what, int via = -1, int peer = -1)
      : Error(what), via_(via), peer_(peer) {}
  int via() const { return via_; }
  int peer() const { return peer_; }

 private:
  int via_;
  int peer_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace rr

#define RR_THROW(ExcType, ...) throw ExcType(::rr::detail::concat(__VA_ARGS__))

#define RR_CHECK(cond, ...)                                                          \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      throw ::rr::Error(::rr::detail::concat("check failed: " #cond ": ", __VA_ARGS__, \
                                             " (", __FILE__, ":", __LINE__, ")"));   \
    }                                                                                \
  } while (0)

#define RR_CHECK_OP_(a, b, op, ...)                                                   \
  do {                                                                                \
    const auto& rr_a_ = (a);                                                          \
    const auto& rr_b_ = (b);                                                          \
    if (!(rr_a_ op rr_b_)) {                                                          \
      throw ::rr::Error(::rr::detail::concat(__VA_ARGS__, ": expected " #a " " #op " " #b \
                                             " but ", rr_a_, " vs ", rr_b_, " (",      \
                                             __FILE__, ":", __LINE__, ")"));          \
    }                                                                                 \
  } while (0)

#define RR_CHECK_EQ(a, b, ...) RR_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define RR_CHECK_LE(a, b, ...) RR_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define RR_CHECK_LT(a, b, ...) RR_CHECK_OP_(a, b, <, __VA_ARGS__)
