// Streams multiplexed over one TCP connection per pair of processes.
//
// Why: a group (or point-to-point channel) whose members sit on different hosts opened its
// own connections among them, so every new group cost a mesh of handshakes, sockets and
// ports. A Link carries any number of streams to one peer process instead: each stream an
// ordered, bounded, bidirectional byte pipe named by a 64-bit id both ends agree on (a
// group derives it from its store prefix), which behaves like a non-blocking socket --
// write/read/peek, an end after the peer shut its side, an error when the link fails.
//
// Each stream's outgoing bytes are cut into sub-frames of at most 256 KiB, so streams
// interleave on the wire. A stream's user writes them onto the socket itself, and reads its
// own straight from it (readFd/writeFd); one pump thread per process does the I/O nobody
// else is there for: it sends what waits in outboxes and moves incoming sub-frames into the
// inbox of a stream whose user is not reading. Flow control is per stream, by credits:
// a sender has at most `window` bytes on the way and unread at the receiver, and gets
// credit back as the receiving stream's user reads. So the pump can always take everything
// the socket holds: a stream whose user is busy elsewhere never holds up the others, and no
// buffer grows beyond two windows per stream (outbox and inbox, allocated on first use).
//
// Wire: each sub-frame is a SubHeader (link_state.h) -- data (len payload bytes follow),
// credit (len bytes granted), open (the sender opened the stream: the rest of the window
// granted) or fin (the sender writes no more on that stream). Until its receiver opens a
// stream, its sender has 256 KiB of credit (kUnopenedCredit): bytes a peer sends on a stream
// this end has not opened yet wait in its inbox, at most that much, for open().
//
// Threads: a Stream is used by one thread at a time (its communicator's executor); one
// thread at a time reads the socket (rxBusy) and one writes it (txBusy). Lock order: the
// pump's hub lock before a link's lock; a stream's calls take its link's lock only.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/tcp/socket.h"

namespace rr::transport::tcp {

class Link;
struct StreamState;  // link.cc

// One end of a stream. Calls never block; fd() says when to call again.
class Stream {
 public:
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  uint64_t id() const { return id_; }
  // An eventfd, readable (POLLIN) while what arm() asked for holds -- until the caller
  // reads (readv: no longer kData) or writes (write: no longer kRoom) itself: it is not
  // waiting then, and the next wait arms again (what arrives meanwhile costs no eventfd
  // writes).
  int fd() const;
  enum Want : unsigned {
    kData = 1,  // bytes to read, or the end (the peer shut its side, the link went down)
    kEnd = 2,   // the end only (data that arrives does not wake)
    kRoom = 4,  // write() would take bytes (or fail: shut, link down)
  };
  void arm(unsigned want);
  // The link's socket (-1 once down), to poll for POLLIN beside fd() while waiting for data:
  // when it is readable, readv() reads it itself -- this stream's bytes straight into the
  // caller's buffer -- instead of waiting for the pump. Calling it says the caller does so
  // (until its next arm()): the pump then leaves a readable socket to it for a moment.
  int readFd();
  // The same for writing: the link's socket, to poll for POLLOUT beside fd() while waiting
  // for room, when what holds this stream's writes back is the socket (-1 when it is the
  // peer's credit, which fd() signals, or the link is down). Calling it says the caller
  // does so (until its next arm()): write() then copies into the outbox only what cannot go
  // yet for want of credit, or while another thread writes, and the end of a sub-frame the
  // socket took in part -- no more waits there for the pump.
  int writeFd();

  // As send() on a non-blocking socket: the bytes taken (some or all of iov), or -1 with
  // *err = EAGAIN (no room: the peer has not read enough yet) or EPIPE (shut, link down).
  // What the socket does not take at once is copied into the outbox (up to the credit
  // window), for the pump to send -- unless `mode` is kPaced: the caller polls writeFd()
  // before it writes again, and only the rest of a sub-frame the socket took in part is
  // copied (and what goes while another thread is writing on the link).
  enum Mode { kQueue, kPaced };
  ssize_t write(const iovec* iov, int n, int* err, Mode mode = kQueue);
  // As recv(): bytes copied; 0: the end (after every byte the peer wrote before it shut its
  // side or its process closed the link); -1 with *err = EAGAIN (nothing yet) or the
  // link's error (ECONNRESET, EPROTO: the peer broke the sub-frame protocol).
  ssize_t readv(const iovec* iov, int n, int* err);
  ssize_t read(void* buf, size_t n, int* err);
  // As recv(MSG_PEEK), from `off` bytes into what is stored (nothing consumed).
  ssize_t peek(void* buf, size_t n, size_t off, int* err) const;
  // Bytes stored and not read yet.
  size_t available() const;
  // No more writes: the peer reads the end after every byte written before.
  void shutdownWrite();
  // shutdownWrite and drop what is unread (later arrivals too); the link forgets the stream
  // once the peer has shut its side as well. The destructor closes.
  void close();

 private:
  friend class Link;
  Stream(std::shared_ptr<Link> link, std::shared_ptr<StreamState> st, uint64_t id);
  std::shared_ptr<Link> link_;
  std::shared_ptr<StreamState> st_;
  uint64_t id_;
};

class Link : public std::enable_shared_from_this<Link> {
 public:
  // As much as a connection of its own holds in flight (socket.h asks 4 MiB per buffer, the
  // kernel doubles it: 8 MiB sent and 8 MiB received): a ring step's data keeps coming
  // while the receiver reduces (a 2-rank group's 16 MiB all-reduce, ad hoc here: 1.27x the
  // time on connections of its own with a 4 MiB window, 0.94-1.08x with 16 MiB). The
  // buffers grow only as far as a stream uses them (core/byte_ring.h).
  static constexpr size_t kDefaultWindow = 16 << 20;
  // Start carrying streams over `fd` (connected and authenticated; made non-blocking here)
  // to the process `peerName` names in messages. `window`: per stream and direction.
  static std::shared_ptr<Link> start(Fd fd, std::string peerName,
                                     size_t window = kDefaultWindow);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  const std::string& peerName() const { return peer_; }
  // One end of stream `id`. Throws InvalidArgument if this process has it open already (or
  // closed it and the peer has not shut its side yet). On a link that is down, the stream
  // reads the end at once.
  std::unique_ptr<Stream> open(uint64_t id);
  // -1 while the link is up; 0 once closed (by either side); else the errno it failed with.
  int error() const;
  // Send what streams wrote before (and their fins) for at most `seconds`, then close the
  // socket: streams still open read the end, writes get EPIPE. The owner must call it (the
  // pump holds the link until then). Not from a stream's pump callback (there are none).
  void close(double seconds);
  // Streams the link still tracks (open ones, and closed ones awaiting the peer's fin).
  size_t streamCount() const;

 private:
  friend class Stream;
  friend class Hub;
  struct Impl;
  Link(Fd fd, std::string peerName, size_t window);
  std::unique_ptr<Impl> impl_;
  std::string peer_;
};

// Tests: whether the pump thread runs (while any link is open).
bool linkPumpRunning();

}  // namespace rr::transport::tcp
