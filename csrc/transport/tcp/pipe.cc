#include "transport/tcp/pipe.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>

namespace rr::transport::tcp {

namespace {

// Between two processes of one host (both ends of the socket have one address: loopback, or
// a host's own address), a frame's payload is read in pieces of at most this size: a read
// holds the socket's lock while it copies, and the sender's packets, which the sending
// process itself pushes through the receive path, wait in the backlog meanwhile. Whole-frame
// reads halved loopback's rate here (a C test, 32 MiB: 2.0 GB/s read at once, 5.1 in 32 KiB
// pieces; 2-rank TCP gather / scatter of 64 MiB: ~22 -> ~15 ms). Across hosts the link paces
// the data and the extra reads cost: an emulated 10 Gbit/s 4-host all-reduce of 64 MiB was
// ~15% slower in pieces, so there a read takes all it can.
constexpr size_t kLocalRecvPiece = 32 << 10;

bool bothEndsLocal(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t la = sizeof a, lb = sizeof b;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &la) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &lb) != 0 || a.ss_family != b.ss_family)
    return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<sockaddr_in&>(b).sin_addr.s_addr;
  if (a.ss_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<sockaddr_in6&>(a).sin6_addr,
                       &reinterpret_cast<sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
  return false;
}

class SocketPipe final : public Pipe {
 public:
  explicit SocketPipe(Fd fd)
      : fd_(std::move(fd)), piece_(bothEndsLocal(fd_.get()) ? kLocalRecvPiece : SIZE_MAX) {}
  ~SocketPipe() override { close(); }
  int fd() const override { return fd_.get(); }
  short pollEvents(short want) override { return want; }
  ssize_t sendv(const iovec* iov, int n) override {
    msghdr mh{};
    mh.msg_iov = const_cast<iovec*>(iov);
    mh.msg_iovlen = static_cast<size_t>(n);
    return ::sendmsg(fd_.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  ssize_t recvv(const iovec* iov, int n) override { return ::readv(fd_.get(), iov, n); }
  ssize_t peek(void* buf, size_t n) override {
    return ::recv(fd_.get(), buf, n, MSG_PEEK | MSG_DONTWAIT);
  }
  ssize_t available() override {
    int avail = 0;
    if (::ioctl(fd_.get(), FIONREAD, &avail) < 0) return -1;
    return avail;
  }
  size_t recvPiece() const override { return piece_; }
  void close() override { closeAfterDrain(fd_); }

 private:
  Fd fd_;
  size_t piece_;
};

class StreamPipe final : public Pipe {
 public:
  explicit StreamPipe(std::unique_ptr<Stream> s) : s_(std::move(s)) {}
  int fd() const override { return s_ ? s_->fd() : -1; }
  int readFd() override { return s_ ? s_->readFd() : -1; }
  int writeFd() override { return s_ ? s_->writeFd() : -1; }
  short pollEvents(short want) override {
    if (!s_) return want;
    unsigned w = 0;
    if (want & POLLIN) w |= Stream::kData;
    if (want & POLLOUT) w |= Stream::kRoom;
    if (want & POLLRDHUP) w |= Stream::kEnd;
    s_->arm(w);
    return POLLIN;
  }
  ssize_t sendv(const iovec* iov, int n) override { return ret(s_->write(iov, n, &err_)); }
  ssize_t sendSome(const iovec* iov, int n) override {
    return ret(s_->write(iov, n, &err_, Stream::kPaced));
  }
  ssize_t recvv(const iovec* iov, int n) override { return ret(s_->readv(iov, n, &err_)); }
  ssize_t peek(void* buf, size_t n) override { return ret(s_->peek(buf, n, 0, &err_)); }
  ssize_t available() override { return static_cast<ssize_t>(s_->available()); }
  size_t recvPiece() const override { return SIZE_MAX; }  // copies out of a buffer
  void close() override {  // the stream's close drops what is unread (and credits it back)
    if (s_) s_->close();
    s_.reset();
  }

 private:
  ssize_t ret(ssize_t r) {
    if (r < 0) errno = err_;
    return r;
  }
  std::unique_ptr<Stream> s_;
  int err_ = 0;
};

}  // namespace

std::unique_ptr<Pipe> socketPipe(Fd fd) { return std::make_unique<SocketPipe>(std::move(fd)); }

std::unique_ptr<Pipe> streamPipe(std::unique_ptr<Stream> s) {
  return std::make_unique<StreamPipe>(std::move(s));
}

namespace {
// poll() p for `want` until ready or `d` passed: false once it passed.
bool awaitPipe(Pipe& p, short want, Deadline d) {
  pollfd pf{p.fd(), p.pollEvents(want), 0};
  return !(::poll(&pf, 1, d.pollMs()) == 0 && d.expired());
}
}  // namespace

bool readFull(Pipe& p, void* buf, size_t n, Deadline d, std::string* errMsg) {
  char* c = static_cast<char*>(buf);
  return moveFull(
      n, d, errMsg, true,
      [&](size_t done) {
        const iovec v{c + done, n - done};
        return p.recvv(&v, 1);
      },
      [&](Deadline dl) { return awaitPipe(p, POLLIN, dl); });
}

bool writeFull(Pipe& p, const void* buf, size_t n, Deadline d, std::string* errMsg) {
  char* c = const_cast<char*>(static_cast<const char*>(buf));
  return moveFull(
      n, d, errMsg, false,
      [&](size_t done) {
        const iovec v{c + done, n - done};
        return p.sendv(&v, 1);
      },
      [&](Deadline dl) { return awaitPipe(p, POLLOUT, dl); });
}

}  // namespace rr::transport::tcp
