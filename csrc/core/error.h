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

// A deadline passed. The message names what was awaited and from whom.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A peer died, closed its connection, sent an abort or violated the protocol.
class PeerError : public Error {
 public:
  PeerError(int peer, const std::string& what) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Ranks issued different collectives (kind, count, dtype, op or root differ).
class MismatchError : public Error {
 public:
  using Error::Error;
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
