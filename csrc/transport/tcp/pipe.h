// What a TcpConnection reads and writes through: a socket of its own, or a stream on a link
// to the peer's process that other communicators share (link.h). Every call behaves as the
// socket call it is named after: non-blocking, -1 with errno on failure, 0 from a read at
// the end. A stream's fd() is an eventfd rather than the socket: pollEvents() arms it for
// what the caller waits for and says which events to poll it for.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>

#include "core/deadline.h"
#include "transport/tcp/link.h"
#include "transport/tcp/socket.h"

namespace rr::transport::tcp {

class Pipe {
 public:
  virtual ~Pipe() = default;
  // The descriptor to poll (-1 once closed).
  virtual int fd() const = 0;
  // The poll() events on fd() that report `want` (POLLIN, POLLOUT, POLLRDHUP, or'ed).
  virtual short pollEvents(short want) = 0;
  // A second descriptor to poll for POLLIN while waiting for data (-1: none): a stream's
  // link socket, which recvv() then reads itself (Stream::readFd).
  virtual int readFd() { return -1; }
  // The same for POLLOUT while waiting for room: the link socket sendv() writes itself
  // (Stream::writeFd).
  virtual int writeFd() { return -1; }
  virtual ssize_t sendv(const iovec* iov, int n) = 0;  // sendmsg(MSG_NOSIGNAL | MSG_DONTWAIT)
  // As sendv, for a caller that after EAGAIN polls fd() (pollEvents(POLLOUT)) and writeFd()
  // before it calls again: a stream then takes only what can go on the wire now.
  virtual ssize_t sendSome(const iovec* iov, int n) { return sendv(iov, n); }
  virtual ssize_t recvv(const iovec* iov, int n) = 0;  // readv
  virtual ssize_t peek(void* buf, size_t n) = 0;       // recv(MSG_PEEK | MSG_DONTWAIT)
  virtual ssize_t available() = 0;                     // ioctl(FIONREAD)
  // The most payload bytes one read should take (tcp_connection.cc's kLocalRecvPiece).
  virtual size_t recvPiece() const = 0;
  // No more writes (the peer reads the end after them); drop a bounded amount of what the
  // peer sent (a socket closed with unread data resets, which could discard an abort frame
  // on its way to the peer); release the descriptor.
  virtual void close() = 0;
};

std::unique_ptr<Pipe> socketPipe(Fd fd);
std::unique_ptr<Pipe> streamPipe(std::unique_ptr<Stream> s);

// Read/write exactly n bytes, polling until the deadline; false on timeout, end or error
// (*errMsg says which). As socket.h's, for either kind of pipe.
bool readFull(Pipe& p, void* buf, size_t n, Deadline d, std::string* errMsg);
bool writeFull(Pipe& p, const void* buf, size_t n, Deadline d, std::string* errMsg);

}  // namespace rr::transport::tcp
