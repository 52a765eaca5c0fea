#include "transport/tcp/tcp_connection.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/crc32c.h"
#include "core/error.h"

namespace rr::transport::tcp {


TcpConnection::TcpConnection(int peer, std::string peerHost, Fd fd)
    : TcpConnection(peer, std::move(peerHost), socketPipe(std::move(fd))) {}

TcpConnection::TcpConnection(int peer, std::string peerHost, std::unique_ptr<Pipe> pipe)
    : Connection(peer, std::move(peerHost)), pipe_(std::move(pipe)),
      recvPiece_(pipe_->recvPiece()) {}

TcpConnection::~TcpConnection() { close(); }

void TcpConnection::close() { pipe_->close(); }

void TcpConnection::failClosed(const char* doing) {
  // The goodbye was read before -- consumed by checkIdle while this rank waited on another
  // peer -- and this is the close after it: the peer left (found under load: a rank that
  // called destroy() was named as crashed, "closed the connection", when the wait loop's
  // idle check ran between the goodbye's arrival and the receive that met the close).
  if (goodbyeSeen_) failLeft(detail::concat("was ", doing).c_str());
  throw PeerError(peer_, PeerCause::kClosed, detail::concat("rank ", label_, " (", peerHost_,
                                        ") closed the connection while this rank was ", doing,
                                        " (the peer process probably exited or crashed)"));
}

void TcpConnection::failLeft(const char* doing) {
  if (!leftWhy_.empty()) {
    std::string msg = detail::concat("rank ", label_, " (", peerHost_, ") ",
                                     leftAfterFailure(scope_), ": ",
                                     saidBy(std::to_string(label_), leftWhy_));
    if (leftCulprit_.rank >= 0 && (leftCulprit_.outside || leftCulprit_.rank != peer_))
      throw PeerError(leftCulprit_.rank, leftCulprit_.cause, std::move(msg), peer_,
                      leftCulprit_.outside);  // the communicator checks it
    throw PeerError(peer_, PeerCause::kLeft, std::move(msg));
  }
  // Its goodbye says which collective it began last: when that is this one, it ran it with
  // other arguments (a reduce's root, a size, a group), finished, and left.
  throw PeerError(peer_, PeerCause::kLeft, detail::concat(
                             "rank ", label_, " (", peerHost_, ") ", leftText(scope_),
                             " after its collective #", leftAfter_, " while this rank ", doing,
                             " -- did it skip this collective, call it with other arguments "
                             "(root, size, group), or fail?"));
}

void TcpConnection::failErrno(const char* doing, int err) {
  // ETIMEDOUT: TCP gave up resending what the peer never acknowledged (seen in an MTU
  // black hole, the peer's heartbeats still arriving).
  throw PeerError(peer_, PeerCause::kNetwork, detail::concat(
      "connection to rank ", label_, " (", peerHost_, ") failed while ", doing, ": ",
      std::strerror(err),
      err == ETIMEDOUT ? " (TCP gave up resending data the peer never acknowledged: the network "
                         "loses this connection's packets -- full-size ones only if an MTU "
                         "differs on the path -- or the peer's host is down)"
                       : ""));
}

namespace {
// The text payload of a control frame (abort, goodbye) whose header was read, `already` of
// it read with the header. Bounded by kMaxAbortReason; best effort (0.5 s).
std::string readReason(Pipe& pipe, const FrameHeader& h, const char* already, size_t alreadyLen) {
  size_t want = std::min<size_t>(h.payloadBytes, kMaxAbortReason);
  std::string reason(already ? already : "", already ? std::min(alreadyLen, want) : 0);
  if (reason.size() < want) {
    std::string rest(want - reason.size(), '\0');
    std::string err;
    if (readFull(pipe, rest.data(), rest.size(), Deadline::after(0.5), &err)) reason += rest;
  }
  return reason;
}
}  // namespace

void TcpConnection::readGoodbye(const FrameHeader& h, const char* already, size_t alreadyLen) {
  noteGoodbye(h, readReason(*pipe_, h, already, alreadyLen));
}

void TcpConnection::noteGoodbye(const FrameHeader& h, std::string why) {
  goodbyeSeen_ = true;
  leftWhy_ = std::move(why);
  leftAfter_ = h.seq;
  leftCulprit_ = decodeCulprit(static_cast<uint32_t>(h.root), h.step);
}

void TcpConnection::raiseAbort(const FrameHeader& h, const char* already, size_t alreadyLen) {
  throwAbort(h, readReason(*pipe_, h, already, alreadyLen));
}

void TcpConnection::throwAbort(const FrameHeader& h, const std::string& reason) {
  std::string msg = abortText(label_, peerHost_, reason);
  const Culprit who = decodeCulprit(static_cast<uint32_t>(h.root), h.step);
  switch (static_cast<AbortCode>(h.op)) {
    case AbortCode::kMismatch: throw MismatchError(msg, peer_);
    case AbortCode::kTimeout:  // where its wait chain ended (the communicator checks it)
      throw TimeoutError(msg, -1, who.rank >= 0 && !who.outside ? who.rank : -1, peer_);
    case AbortCode::kPeer:  // it lost a rank: name that one (the communicator checks it)
      if (who.rank >= 0) throw PeerError(who.rank, who.cause, msg, peer_, who.outside);
      [[fallthrough]];
    default: throw PeerError(peer_, PeerCause::kAborted, msg);
  }
}

bool TcpConnection::progressSend(SendOp& op) {
  constexpr size_t H = sizeof(FrameHeader);
  const size_t total = H + op.len;
  if (op.done == 0 && checksum_) {
    op.hdr.flags |= kFlagCrc;
    op.hdr.crc = crc32c(op.data, op.len);
  }
  while (op.done < total) {
    iovec iov[2];
    int n = 0;
    if (op.done < H) {
      iov[n++] = {reinterpret_cast<char*>(&op.hdr) + op.done, H - op.done};
      if (op.len) iov[n++] = {const_cast<void*>(op.data), op.len};
    } else {
      iov[n++] = {const_cast<char*>(static_cast<const char*>(op.data)) + (op.done - H),
                  total - op.done};
    }
    ssize_t r = pipe_->sendSome(iov, n);  // the communicator's waitIo polls writeFd()
    if (r > 0) {
      op.done += static_cast<size_t>(r);
      midRemain_ = total - op.done;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      // The peer may have said why before closing, behind frames this rank has not read yet
      // (a goodbye read only as "closed" named a rank that called destroy() as crashed).
      const Pending p = peekControl();
      if (p.kind == CollectiveKind::kAbort) throwAbort(p.hdr, p.text);
      if (p.kind == CollectiveKind::kGoodbye) {
        noteGoodbye(p.hdr, p.text);
        failLeft("was still sending to it");
      }
      failClosed("sending to it");
    }
    failErrno("sending", errno);
  }
  midRemain_ = 0;
  return true;
}

// A data frame's flags: only kFlagCrc exists, and a rank that checksums (RINGREDUCE_CHECKSUM,
// the same on every rank: init compares it) requires it -- a frame without it was changed
// on the way, its payload unchecked.
void TcpConnection::checkFlags(const FrameHeader& h) const {
  if (h.flags & ~kFlagCrc)
    throw PeerError(peer_, PeerCause::kProtocol, detail::concat(
                               "protocol error from rank ", label_, " (", peerHost_,
                               "): unknown frame flags ", h.flags, " in ",
                               toString(static_cast<CollectiveKind>(h.kind)), " #", h.seq));
  if (checksum_ && !(h.flags & kFlagCrc))
    throw PeerError(peer_, PeerCause::kCorrupt, detail::concat(
                               "payload from rank ", label_, " (", peerHost_, ") came without ",
                               "its checksum (RINGREDUCE_CHECKSUM=1 on every rank) in ",
                               toString(static_cast<CollectiveKind>(h.kind)), " #", h.seq,
                               "; the result was discarded"));
}

bool TcpConnection::progressRecv(RecvOp& op) {
  constexpr size_t H = sizeof(FrameHeader);
  const size_t total = H + op.len;
  while (op.done < total) {
    iovec iov[2];
    int n = 0;
    if (op.done < H) {
      iov[n++] = {reinterpret_cast<char*>(&op.got) + op.done, H - op.done};
      if (op.len) iov[n++] = {op.data, std::min(op.len, recvPiece_)};
    } else {
      iov[n++] = {static_cast<char*>(op.data) + (op.done - H), std::min(total - op.done, recvPiece_)};
    }
    ssize_t r = pipe_->recvv(iov, n);
    if (r > 0) {
      op.done += static_cast<size_t>(r);
      if (!op.checked && op.done >= H) {
        op.checked = true;
        if (op.got.magic == kFrameMagic &&
            op.got.kind == static_cast<uint8_t>(CollectiveKind::kAbort)) {
          raiseAbort(op.got, static_cast<const char*>(op.data), op.done - H);
        }
        if (op.got.magic == kFrameMagic &&
            op.got.kind == static_cast<uint8_t>(CollectiveKind::kGoodbye)) {
          readGoodbye(op.got, static_cast<const char*>(op.data), op.done - H);
          failLeft("still expected data from it");
        }
        std::string mm = describeMismatch(op.got, op.expect, p2p_, label_, selfLabel_, *labels_);
        if (!mm.empty()) {
          if (op.got.magic != kFrameMagic)
            throw PeerError(peer_, PeerCause::kProtocol, detail::concat("protocol error from rank ", label_, " (",
                                                  peerHost_, "): ", mm));
          throw MismatchError(detail::concat("rank ", label_, " (", peerHost_, "): ", mm), -1,
                              peer_);
        }
        checkFlags(op.got);
      }
      continue;
    }
    if (r == 0) failClosed("receiving from it");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) failClosed("receiving from it");
    failErrno("receiving", errno);
  }
  if ((op.got.flags & kFlagCrc) && crc32c(op.data, op.len) != op.got.crc)
    throw PeerError(peer_, PeerCause::kCorrupt, detail::concat(
                               "payload from rank ", label_, " (", peerHost_, ") is corrupted: ",
                               "CRC32C mismatch in ", toString(static_cast<CollectiveKind>(op.got.kind)),
                               " #", op.got.seq, " step ", op.got.step, " (", op.len,
                               " bytes); the result was discarded"));
  return true;
}

Connection::Idle TcpConnection::checkIdle(const FrameHeader* current) {
  FrameHeader h;
  ssize_t r = pipe_->peek(&h, sizeof(h));
  if (r == 0) failClosed("waiting on other peers");
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Idle::kEarlyData;
    if (errno == ECONNRESET) failClosed("waiting on other peers");
    failErrno("watching", errno);
  }
  if (static_cast<size_t>(r) == sizeof(h) && h.magic == kFrameMagic &&
      h.kind == static_cast<uint8_t>(CollectiveKind::kAbort)) {
    consumeHeader();  // then the reason
    raiseAbort(h, nullptr, 0);
  }
  if (static_cast<size_t>(r) == sizeof(h) && h.magic == kFrameMagic &&
      h.kind == static_cast<uint8_t>(CollectiveKind::kGoodbye)) {
    consumeHeader();
    readGoodbye(h, nullptr, 0);
    return Idle::kGoodbye;
  }
  if (current && static_cast<size_t>(r) == sizeof(h) && h.magic == kFrameMagic &&
      h.seq <= current->seq) {
    // Data of this (or an older) collective from a peer this rank does not expect it from
    // yet. In a matching run that can only be a later step of the same collective.
    FrameHeader want = *current;
    want.payloadBytes = h.payloadBytes;
    std::string mm = describeMismatch(h, want, p2p_, label_, selfLabel_, *labels_);
    if (h.seq < current->seq) {
      // A root that only sends (broadcast, scatter) left it: the ranks named different roots.
      const auto k = static_cast<CollectiveKind>(h.kind);
      const bool rooted = k == CollectiveKind::kBroadcast || k == CollectiveKind::kScatter;
      mm = detail::concat("collective mismatch: rank ", label_, " sent data of ", toString(k),
                          " #", h.seq, " that rank ", selfLabel_,
                          " never received, while it is at ",
                          toString(static_cast<CollectiveKind>(current->kind)), " #", current->seq,
                          rooted && !p2p_ ? detail::concat(" (probably a root mismatch in ",
                                                           toString(k), " #", h.seq,
                                                           "; every rank must pass the same src)")
                                          : std::string());
    }
    if (!mm.empty())
      throw MismatchError(detail::concat("rank ", label_, " (", peerHost_, "): ", mm), -1, peer_);
  }
  return Idle::kEarlyData;
}

TcpConnection::Pending TcpConnection::peekControl() {
  constexpr size_t H = sizeof(FrameHeader);
  const ssize_t avail = pipe_->available();
  if (avail < 0) failErrno("watching", errno);
  std::vector<char> buf(static_cast<size_t>(avail));
  ssize_t r = buf.empty() ? 0 : pipe_->peek(buf.data(), buf.size());
  if (r < 0) {
    if (errno == ECONNRESET) failClosed("waiting on other peers");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) failErrno("watching", errno);
    r = 0;
  }
  const size_t n = static_cast<size_t>(r);
  for (size_t off = 0; off + H <= n;) {
    FrameHeader h;
    std::memcpy(&h, buf.data() + off, H);
    if (h.magic != kFrameMagic) break;
    if (h.kind == static_cast<uint8_t>(CollectiveKind::kGoodbye) ||
        h.kind == static_cast<uint8_t>(CollectiveKind::kAbort)) {
      const size_t len = std::min<size_t>({h.payloadBytes, kMaxAbortReason, n - off - H});
      return {static_cast<CollectiveKind>(h.kind), h, std::string(buf.data() + off + H, len)};
    }
    if (h.payloadBytes > n - off - H) break;  // cut off mid-frame
    off += H + h.payloadBytes;
  }
  return {};
}

void TcpConnection::consumeHeader() {
  FrameHeader h;
  const iovec v{&h, sizeof(h)};
  (void)pipe_->recvv(&v, 1);  // peeked whole before: it is there
}

bool TcpConnection::goodbyeNext() {
  FrameHeader h;
  const ssize_t r = pipe_->peek(&h, sizeof(h));
  return r == static_cast<ssize_t>(sizeof(h)) && h.magic == kFrameMagic &&
         h.kind == static_cast<uint8_t>(CollectiveKind::kGoodbye);
}

Connection::Idle TcpConnection::checkClosedAfterEarlyData() {
  const Pending p = peekControl();
  if (p.kind == CollectiveKind::kGoodbye) {  // peeked, not consumed: nothing reads past it
    noteGoodbye(p.hdr, p.text);
    return Idle::kGoodbye;
  }
  if (p.kind == CollectiveKind::kAbort) throwAbort(p.hdr, p.text);
  failClosed("waiting on other peers (it had sent this rank data of this collective, not yet "
             "read, and then closed the connection without a goodbye)");
}

void TcpConnection::sendAbort(AbortCode code, const std::string& reason, Culprit who) {
  // Failing in the middle of a frame (a rank interrupted or aborted while sending): finish
  // it with zeros if that is quick, so that the peer, which is reading it, gets the reason
  // next -- not a bare close, told "the peer process probably exited or crashed" (found by
  // a helper). The zeros land in a buffer that the failure leaves undefined anyway (with
  // RINGREDUCE_CHECKSUM=1 the peer reports a checksum error instead). At most 0.5 s: frames
  // are segments (RINGREDUCE_SEGMENT_BYTES) in most algorithms.
  if (midRemain_ > 0 && pipe_->fd() >= 0) padFrame(Deadline::after(0.5));
  sendControl(CollectiveKind::kAbort, static_cast<uint8_t>(code), reason, who);
}

bool TcpConnection::padFrame(Deadline d) {
  static const std::vector<char> zeros(64 << 10, 0);
  std::string err;
  while (midRemain_ > 0) {
    const size_t n = std::min(midRemain_, zeros.size());
    if (!writeFull(*pipe_, zeros.data(), n, d, &err)) return false;
    midRemain_ -= n;
  }
  return true;
}

void TcpConnection::sendGoodbye(const std::string& why, uint64_t lastSeq, Culprit who) {
  sendControl(CollectiveKind::kGoodbye, 0, why, who, lastSeq);
}

void TcpConnection::sendControl(CollectiveKind kind, uint8_t code, const std::string& payload,
                                Culprit who, uint64_t seq) {
  if (pipe_->fd() < 0 || midRemain_ > 0) return;
  FrameHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.op = code;
  h.seq = seq;
  if (who.rank >= 0) {  // Culprit's encoding (frame.h)
    h.root = static_cast<int32_t>(encodeCulprit(who));
    h.step = static_cast<uint32_t>(who.cause);
  }
  std::string r = payload.substr(0, kMaxAbortReason);
  h.payloadBytes = r.size();
  iovec iov[2] = {{&h, sizeof(h)}, {r.data(), r.size()}};
  (void)pipe_->sendv(iov, 2);
}

}  // namespace rr::transport::tcp
