// Thin RAII helpers over BSD sockets: listen on one address, connect with a deadline,
// and blocking-with-deadline reads/writes for the handshake. Data transfer in collectives
// uses TcpConnection's non-blocking progress instead.
#pragma once

#include <errno.h>
#include <poll.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/deadline.h"
#include "core/error.h"

namespace rr::transport::tcp {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct Endpoint {
  std::string host;
  int port = 0;
  std::string str() const;
};
// Parse "host:port" or "[v6]:port"; throws InvalidArgument.
Endpoint parseEndpoint(const std::string& s);

// Resolve host:port (socktype SOCK_STREAM or SOCK_DGRAM; passive: for bind) into sockaddr
// bytes, in getaddrinfo's order. A numeric address (IPv4, IPv6) is parsed without any lookup;
// a name is looked up on a helper thread, and the caller stops waiting at the deadline
// (getaddrinfo itself has no timeout, and a dead DNS server can block it for minutes).
// Throws InvalidArgument (cannot resolve) or TimeoutError (no answer before the deadline).
std::vector<std::vector<uint8_t>> resolve(const std::string& host, int port, int socktype,
                                          bool passive, Deadline deadline);
// How long resolve() may take where the caller has no deadline of its own (a listener's or
// heartbeat socket's own address; ringreduce.init passes numeric addresses, so this only
// bounds C++ callers that pass names).
constexpr double kResolveTimeoutSec = 30.0;
// Tests only: make every name lookup (not numeric parsing) sleep `seconds` first.
void setResolveDelayForTesting(double seconds);

// Bind and listen on host (an address, not "0.0.0.0", unless the caller insists) with an
// ephemeral port when port == 0. Returns the listening fd; *boundPort gets the port.
Fd listenOn(const std::string& host, int port, int* boundPort);

// How connectTo treats failed attempts.
enum class Retry {
  kUntilDeadline,  // refused or unreachable: try again until the deadline
  kOnce,           // one attempt per address (the peer is known to listen already)
  kUnlessRefused,  // as kUntilDeadline, but a refusal from every address throws Refused:
                   // the peer listened before it published its address, so it is gone;
                   // no route to any address throws Error at once (a configuration)
};

// What connectTo throws in Retry::kUnlessRefused when every address refused.
class Refused : public Error {
 public:
  using Error::Error;
};

// Called between attempts while a connection's set-up waits for a peer (connectTo's
// retries, mesh.h's accepts): throws to stop the wait (a group's set-up: a member the
// world's communicator knows is gone).
using StillWanted = std::function<void()>;

// What a StillWanted check throws to stop a set-up because another rank failed: the
// connections made so far are told so (abort frames naming `culprit`: a rank of this
// communicator, or of the world when `outside`; -1: none), then whoever made the check
// rethrows `original`, its own error (the bindings': Python's, unchanged).
class StoppedFor : public Error {
 public:
  StoppedFor(const std::string& why, int culprit, bool outside, std::exception_ptr original)
      : Error(why), culprit_(culprit), outside_(outside), original_(std::move(original)) {}
  int culprit() const { return culprit_; }
  bool outside() const { return outside_; }
  [[noreturn]] void rethrowOriginal() const { std::rethrow_exception(original_); }

 private:
  int culprit_;
  bool outside_;
  std::exception_ptr original_;
};

// Connect to ep. The returned socket is non-blocking with TCP_NODELAY. Throws TimeoutError
// naming ep and the last error at the deadline. `check`, if set, runs before each retry.
Fd connectTo(const Endpoint& ep, Deadline deadline, const std::string& what,
             Retry retry = Retry::kUntilDeadline, const StillWanted& check = {});

// Accept one connection (listener is non-blocking); returns invalid Fd at the deadline.
// connectTo and acceptOne run Python's signal handlers while they wait (core/interrupt.h:
// Interrupted when one raised), as readFull does when `interruptible`.
Fd acceptOne(int listenFd, Deadline deadline, std::string* peerAddr);

// poll() `n` descriptors until one is ready or `deadline` passes, running Python's signal
// handlers every 100 ms (core/interrupt.h). Returns poll()'s result.
int pollInterruptible(pollfd* p, size_t n, Deadline deadline);

void setNonBlocking(int fd);
// Close a connected socket without a reset: FIN after anything queued (an abort frame, a
// link's last sub-frames), then drain a bounded amount of what the peer already sent --
// closing with unread data sends a RST, which can discard what the peer has not read yet.
// With waitMs > 0, also what it sends until it shuts its side (at most that long): a peer
// still reading our last bytes may answer them (a link's credits) before it reads our FIN.
void closeAfterDrain(Fd& fd, int waitMs = 0);
void setNoDelay(int fd);
// What TCP says of the data a connected socket sent that its peer has not acknowledged.
struct SendBacklog {
  uint32_t queuedBytes = 0;   // sent or to be sent, not acknowledged (SIOCOUTQ)
  uint32_t sinceAckMs = 0;    // since the last acknowledgement arrived
  uint32_t retransmits = 0;   // timeouts since the last acknowledgement of new data
};
// False when `fd` is not a TCP socket (a stream on a shared link: an eventfd).
bool sendBacklog(int fd, SendBacklog* out);

// Read/write exactly n bytes on a non-blocking socket, polling until the deadline.
// Return false on timeout or EOF/error (errMsg says which). `interruptible`: see above (not
// on failure paths, which must not throw).
bool readFull(int fd, void* buf, size_t n, Deadline d, std::string* errMsg,
              bool interruptible = false);
bool writeFull(int fd, const void* buf, size_t n, Deadline d, std::string* errMsg);
// The loop of writeFull (and of pipe.h's readFull / writeFull): `step(done)` moves some of
// bytes [done, n) without blocking, as send/recv do (the count, 0 at the end of a read, -1
// and errno); `await(d)` polls until the descriptor is ready (false once `d` passed).
// Returns false on the end of a read (`reading`), an error or the deadline (*errMsg says
// which).
template <typename Step, typename Await>
bool moveFull(size_t n, Deadline d, std::string* errMsg, bool reading, Step step, Await await) {
  errMsg->clear();
  for (size_t done = 0; done < n;) {
    const ssize_t r = step(done);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0 && reading) {
      *errMsg = "connection closed by peer";
      return false;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      *errMsg = std::strerror(errno);
      return false;
    }
    if (!await(d)) {
      *errMsg = "timed out";
      return false;
    }
  }
  return true;
}
// Read what has arrived, without waiting, into buf[*got, n); true once all n bytes are in.
// false with *errMsg empty: the rest has not arrived yet (call again; *got keeps the
// progress); false with *errMsg set: EOF or an error. readFull is this plus a poll.
bool readSome(int fd, void* buf, size_t n, size_t* got, std::string* errMsg);

}  // namespace rr::transport::tcp
