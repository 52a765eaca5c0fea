#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <linux/sockios.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/interrupt.h"

namespace rr::transport::tcp {

// Connecting and accepting at init or group creation may wait for minutes
// (RINGREDUCE_CONNECT_TIMEOUT) on a peer that died or stopped, and Ctrl-C must still stop the
// rank: poll in slices of 100 ms, running Python's signal handlers between them.
int pollInterruptible(pollfd* p, size_t n, Deadline deadline) {
  while (true) {
    checkInterrupt();
    const int ms = deadline.pollMs();
    const int pr = ::poll(p, static_cast<nfds_t>(n), ms < 0 || ms > 100 ? 100 : ms);
    if (pr < 0 && errno == EINTR) {
      checkInterrupt(true);
      continue;
    }
    if (pr != 0 || deadline.expired()) return pr;
  }
}


namespace {
// The stream sockets (listeners and connections) open in this process. A forked child --
// a DataLoader worker -- must not keep them: while it held copies, a rank killed before its
// children exited sent no FIN, and its peers named it only when its heartbeats ran out, as
// frozen (`silent`, not `closed`; gloo waits for the child too). In the child each becomes
// a copy of /dev/null, so the number stays taken (the inherited objects' own close later
// cannot hit a descriptor the child opened since); the inode check skips a number that no
// longer holds the socket recorded. Sockets are made and closed under the registry's lock,
// which a fork takes first: no child gets one unrecorded. The child's handler frees memory
// and unlocks a mutex after fork, which glibc's fork makes safe.
struct ForkedSockets {
  std::mutex mu;
  std::unordered_map<int, ino_t> open;  // fd -> its socket's inode
};
ForkedSockets& sockets() {
  static ForkedSockets* s = [] {
    auto* p = new ForkedSockets;  // never destroyed: sockets may close after statics
    ::pthread_atfork([] { sockets().mu.lock(); }, [] { sockets().mu.unlock(); }, [] {
      ForkedSockets& f = sockets();
      const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      for (const auto& [fd, ino] : f.open) {
        struct stat st {};
        if (null >= 0 && ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == ino)
          ::dup3(null, fd, O_CLOEXEC);
      }
      if (null >= 0) ::close(null);
      f.open.clear();
      f.mu.unlock();
    });
    return p;
  }();
  return *s;
}

// A stream socket made by `make` (socket(), a non-blocking accept4()), recorded for forked
// children (see above); errno is make's when it failed.
template <typename Make>
Fd streamSocket(Make make) {
  std::lock_guard<std::mutex> lock(sockets().mu);
  const int fd = make();
  struct stat st {};
  if (fd >= 0) {
    const int err = errno;
    if (::fstat(fd, &st) == 0) sockets().open[fd] = st.st_ino;
    errno = err;
  }
  return Fd(fd);
}
}  // namespace

void Fd::reset() {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(sockets().mu);  // (close does not block: no SO_LINGER)
  sockets().open.erase(fd_);
  ::close(fd_);
  fd_ = -1;
}

std::string Endpoint::str() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Endpoint parseEndpoint(const std::string& s) {
  Endpoint ep;
  size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 >= s.size())
    RR_THROW(InvalidArgument, "bad peer address '", s, "': expected host:port");
  ep.host = s.substr(0, colon);
  if (ep.host.size() >= 2 && ep.host.front() == '[' && ep.host.back() == ']')
    ep.host = ep.host.substr(1, ep.host.size() - 2);
  try {
    ep.port = std::stoi(s.substr(colon + 1));
  } catch (const std::exception&) {
    RR_THROW(InvalidArgument, "bad port in peer address '", s, "'");
  }
  if (ep.port <= 0 || ep.port > 65535) RR_THROW(InvalidArgument, "port out of range in '", s, "'");
  return ep;
}

void closeAfterDrain(Fd& fd, int waitMs) {
  if (!fd.valid()) return;
  ::shutdown(fd.get(), SHUT_WR);
  char sink[16384];
  const Deadline d = Deadline::after(waitMs / 1000.0);
  for (int i = 0;; ++i) {
    const ssize_t r = ::recv(fd.get(), sink, sizeof(sink), MSG_DONTWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) break;  // FIN, reset
    if (waitMs <= 0 ? (r < 0 || i >= 63) : d.expired()) break;
    if (r > 0) continue;
    pollfd p{fd.get(), POLLIN, 0};
    (void)::poll(&p, 1, std::max(1, d.pollMs()));
  }
  fd.reset();
}

void setNonBlocking(int fd) {
  int fl = ::fcntl(fd, F_GETFL, 0);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    RR_THROW(Error, "fcntl(O_NONBLOCK) failed: ", std::strerror(errno));
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool sendBacklog(int fd, SendBacklog* out) {
  tcp_info ti{};
  socklen_t n = sizeof(ti);
  int queued = 0;
  if (fd < 0 || ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &n) != 0 ||
      ::ioctl(fd, SIOCOUTQ, &queued) != 0)
    return false;
  out->queuedBytes = static_cast<uint32_t>(std::max(queued, 0));
  out->sinceAckMs = ti.tcpi_last_ack_recv;
  out->retransmits = ti.tcpi_retransmits;
  return true;
}

// Fixed 4 MiB socket buffers (set before connect/listen so the window scale fits): a ring
// step's segments stay in flight while the receiver reduces, and small exchanges do not
// depend on where the kernel's buffer auto-tuning happens to be.
static void setBuffers(int fd) {
  int sz = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

namespace {

std::atomic<int64_t> gResolveDelayUs{0};

// One lookup on a helper thread. Shared with it: the caller may give up at its deadline and
// return while the thread is still inside getaddrinfo; whoever is last frees the state.
struct Lookup {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc = 0;
  std::vector<std::vector<uint8_t>> addrs;
};

std::vector<std::vector<uint8_t>> collect(addrinfo* head) {
  std::vector<std::vector<uint8_t>> out;
  for (addrinfo* ai = head; ai; ai = ai->ai_next) {
    auto* p = reinterpret_cast<const uint8_t*>(ai->ai_addr);
    out.emplace_back(p, p + ai->ai_addrlen);
  }
  return out;
}

}  // namespace

void setResolveDelayForTesting(double seconds) {
  gResolveDelayUs.store(static_cast<int64_t>(clampSeconds(seconds) * 1e6));
}

std::vector<std::vector<uint8_t>> resolve(const std::string& host, int port, int socktype,
                                          bool passive, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = (passive ? AI_PASSIVE : 0) | AI_NUMERICSERV;
  std::string ps = std::to_string(port);
  const char* h = host.empty() ? nullptr : host.c_str();
  // Numeric first: never blocks, never sends a query.
  addrinfo numeric = hints;
  numeric.ai_flags |= AI_NUMERICHOST;
  addrinfo* head = nullptr;
  int rc = ::getaddrinfo(h, ps.c_str(), &numeric, &head);
  if (rc == 0) {
    auto out = collect(head);
    ::freeaddrinfo(head);
    return out;
  }
  if (rc != EAI_NONAME || h == nullptr)
    RR_THROW(InvalidArgument, "cannot resolve '", host, "': ", ::gai_strerror(rc),
             " (check MASTER_ADDR / RINGREDUCE_SOCKET_IFNAME)");
  auto lk = std::make_shared<Lookup>();
  std::thread([lk, host, ps, hints] {
    int64_t delay = gResolveDelayUs.load();
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    addrinfo* res = nullptr;
    int r = ::getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
    std::vector<std::vector<uint8_t>> got;
    if (r == 0) {
      got = collect(res);
      ::freeaddrinfo(res);
    }
    std::lock_guard<std::mutex> g(lk->mu);
    lk->rc = r;
    lk->addrs = std::move(got);
    lk->done = true;
    lk->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> g(lk->mu);
  int ms = deadline.pollMs();
  if (!lk->cv.wait_for(g, std::chrono::milliseconds(ms), [&] { return lk->done; }))
    RR_THROW(TimeoutError, "resolving '", host, "' took longer than ", ms / 1000.0,
             " s (is the DNS server reachable? use a numeric address, or fix /etc/hosts or "
             "resolv.conf)");
  if (lk->rc != 0)
    RR_THROW(InvalidArgument, "cannot resolve '", host, "': ", ::gai_strerror(lk->rc),
             " (check MASTER_ADDR / RINGREDUCE_SOCKET_IFNAME)");
  return std::move(lk->addrs);
}

Fd listenOn(const std::string& host, int port, int* boundPort) {
  std::string lastErr = "no address";
  int lastErrno = 0;
  for (const auto& a : resolve(host, port, SOCK_STREAM, true, Deadline::after(kResolveTimeoutSec))) {
    const auto* sa = reinterpret_cast<const sockaddr*>(a.data());
    Fd fd = streamSocket([sa] { return ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0); });
    if (!fd.valid()) {
      lastErrno = errno;
      lastErr = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setBuffers(fd.get());
    if (::bind(fd.get(), sa, static_cast<socklen_t>(a.size())) != 0 ||
        ::listen(fd.get(), SOMAXCONN) != 0) {
      lastErr = std::strerror(errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &sl);
    *boundPort = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                          : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    setNonBlocking(fd.get());
    return fd;
  }
  if (lastErrno == EMFILE || lastErrno == ENFILE)  // (the port's hint misled: a helper)
    RR_THROW(Error, "cannot listen on ", host, ":", port, ": ", lastErr, " (this process has "
             "used up its open-file limit: raise `ulimit -n`, or close files, groups and "
             "channels it no longer needs)");
  RR_THROW(Error, "cannot listen on ", host, ":", port, ": ", lastErr,
           " (is the port in use, or the address not on this host? set RINGREDUCE_SOCKET_IFNAME)");
}

namespace {
bool isUnreachable(int err) { return err == ENETUNREACH || err == EHOSTUNREACH; }
// EHOSTUNREACH also comes from a neighbour's failed address resolution (ARP: the host or
// the link is down, or the address is no host's), which may be transient: retried this long
// (3 s failed init during a link outage of 8 s: a helper's network-fault hunt); ENETUNREACH
// (no route at all) is not.
constexpr auto kHostUnreachableGrace = std::chrono::seconds(15);
}  // namespace

Fd connectTo(const Endpoint& ep, Deadline deadline, const std::string& what, Retry retry,
             const StillWanted& check) {
  std::string lastErr = "timed out";
  int backoffMs = 5;
  const auto started = std::chrono::steady_clock::now();
  while (true) {
    bool refused = true;      // by every address this round
    bool unreachable = true;  // no route to any of them (ENETUNREACH / EHOSTUNREACH)
    bool noNetwork = true;    // ENETUNREACH from every one
    for (const auto& a : resolve(ep.host, ep.port, SOCK_STREAM, false, deadline)) {
      const auto* sa = reinterpret_cast<const sockaddr*>(a.data());
      Fd fd = streamSocket([sa] { return ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0); });
      if (!fd.valid()) {
        refused = unreachable = noNetwork = false;
        lastErr = std::strerror(errno);
        continue;
      }
      setNonBlocking(fd.get());
      setBuffers(fd.get());
      int rc = ::connect(fd.get(), sa, static_cast<socklen_t>(a.size()));
      if (rc != 0 && errno != EINPROGRESS) {
        refused = refused && errno == ECONNREFUSED;
        unreachable = unreachable && isUnreachable(errno);
        noNetwork = noNetwork && errno == ENETUNREACH;
        lastErr = std::strerror(errno);
        continue;
      }
      if (rc != 0) {
        pollfd p{fd.get(), POLLOUT, 0};
        int pr = pollInterruptible(&p, 1, deadline);
        if (pr <= 0) {
          refused = unreachable = noNetwork = false;
          lastErr = pr == 0 ? "connect timed out" : std::strerror(errno);
          continue;
        }
        int err = 0;
        socklen_t el = sizeof(err);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el);
        if (err != 0) {
          refused = refused && err == ECONNREFUSED;
          unreachable = unreachable && isUnreachable(err);
          noNetwork = noNetwork && err == ENETUNREACH;
          lastErr = std::strerror(err);
          continue;
        }
      }
      setNoDelay(fd.get());
      return fd;
    }
    if (retry == Retry::kOnce)
      RR_THROW(Error, what, ": could not connect to ", ep.str(), ": ", lastErr);
    if (retry == Retry::kUnlessRefused && refused)
      RR_THROW(Refused, what, ": could not connect to ", ep.str(), ": ", lastErr);
    // No route from here to the address the peer published: a configuration no retry
    // mends (NCCL fails at once too); before, the wait ran to RINGREDUCE_CONNECT_TIMEOUT.
    const auto tried = std::chrono::steady_clock::now() - started;
    if (retry == Retry::kUnlessRefused && unreachable &&
        (noNetwork || tried > kHostUnreachableGrace))
      RR_THROW(Error, what, ": could not connect to ", ep.str(), ": ", lastErr,
               noNetwork ? " (this host has no route to the address that rank published"
                         : detail::concat(
                               " for ", std::chrono::duration_cast<std::chrono::seconds>(
                                            tried).count(),
                               " s (no host answered at that address: its host or the link "
                               "to it is down, or the address that rank published is wrong"),
               ": a rank listens on RINGREDUCE_SOCKET_IFNAME's interface, else on the one that "
               "routes to its MASTER_ADDR; set RINGREDUCE_SOCKET_IFNAME to an interface the "
               "hosts share, on every rank)");
    if (deadline.expired())
      RR_THROW(TimeoutError, what, ": could not connect to ", ep.str(), ": ", lastErr,
               " (is the peer running and reachable from this interface?)");
    checkInterrupt(true);
    if (check) check();
    std::this_thread::sleep_for(std::chrono::milliseconds(backoffMs));
    backoffMs = backoffMs * 2 > 200 ? 200 : backoffMs * 2;
  }
}

Fd acceptOne(int listenFd, Deadline deadline, std::string* peerAddr) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    Fd got = streamSocket([&] {  // (the listener is non-blocking)
      return ::accept4(listenFd, reinterpret_cast<sockaddr*>(&ss), &sl,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    });
    if (got.valid()) {
      char buf[INET6_ADDRSTRLEN] = "?";
      if (ss.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
      else if (ss.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
      if (peerAddr) *peerAddr = buf;
      setNoDelay(got.get());
      return got;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      RR_THROW(Error, "accept failed: ", std::strerror(errno));
    pollfd p{listenFd, POLLIN, 0};
    int pr = pollInterruptible(&p, 1, deadline);
    if (pr == 0 && deadline.expired()) return Fd();
  }
}

bool readSome(int fd, void* buf, size_t n, size_t* got, std::string* errMsg) {
  char* p = static_cast<char*>(buf);
  while (*got < n) {
    ssize_t r = ::recv(fd, p + *got, n - *got, MSG_DONTWAIT);
    if (r > 0) {
      *got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      *errMsg = "connection closed by peer";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) *errMsg = std::strerror(errno);
    return false;
  }
  return true;
}

bool readFull(int fd, void* buf, size_t n, Deadline d, std::string* errMsg, bool interruptible) {
  size_t got = 0;
  errMsg->clear();
  while (!readSome(fd, buf, n, &got, errMsg)) {
    if (!errMsg->empty()) return false;
    pollfd pf{fd, POLLIN, 0};
    if ((interruptible ? pollInterruptible(&pf, 1, d) : ::poll(&pf, 1, d.pollMs())) == 0 &&
        d.expired()) {
      *errMsg = "timed out";
      return false;
    }
  }
  return true;
}

bool writeFull(int fd, const void* buf, size_t n, Deadline d, std::string* errMsg) {
  const char* p = static_cast<const char*>(buf);
  return moveFull(
      n, d, errMsg, false,
      [&](size_t done) { return ::send(fd, p + done, n - done, MSG_NOSIGNAL); },
      [&](Deadline dl) {
        pollfd pf{fd, POLLOUT, 0};
        return !(::poll(&pf, 1, dl.pollMs()) == 0 && dl.expired());
      });
}

}  // namespace rr::transport::tcp
