// The interface between algorithms and the wire. A Connection moves framed messages to one
// peer without blocking; the communicator waits on many connections at once (through their
// file descriptors) with a deadline. Algorithms never see sockets.
//
// Threading: a Connection is used by one thread at a time (the communicator's executor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/frame.h"

namespace rr::transport {

// One outgoing frame: header then `len` payload bytes. `done` counts bytes of both.
struct SendOp {
  FrameHeader hdr;
  const void* data = nullptr;
  size_t len = 0;
  size_t done = 0;
  void reset(const FrameHeader& h, const void* d, size_t n) {
    hdr = h;
    hdr.payloadBytes = n;
    data = d;
    len = n;
    done = 0;
  }
};

// One incoming frame whose header must equal `expect` and whose payload (exactly
// expect.payloadBytes) lands in `data`.
struct RecvOp {
  FrameHeader expect;
  FrameHeader got;
  void* data = nullptr;
  size_t len = 0;
  size_t done = 0;  // header + payload bytes received
  size_t counted = 0;  // payload bytes counted as progress (Communicator::progressRecv)
  bool checked = false;
  void reset(const FrameHeader& h, void* d, size_t n) {
    expect = h;
    expect.payloadBytes = n;
    data = d;
    len = n;
    done = 0;
    counted = 0;
    checked = false;
  }
  size_t payloadDone() const {
    return done > sizeof(FrameHeader) ? done - sizeof(FrameHeader) : 0;
  }
};

// The labels of a connection no communicator adopted (roots shown as they are).
inline const std::vector<int> kNoLabels;

// What a peer's goodbye (no failure given) tells on a communicator of group `scope`: the
// world's and point-to-point channels' ("") close only when the peer's process leaves the
// job; a group's also at its Group.destroy() -- the peer may be alive and well.
inline std::string leftText(const std::string& scope) {
  if (scope.empty())
    return "left the job (it called destroy(), or its program ended: normally or by an "
           "exception)";
  return "left " + scope + " (it called " + scope + "'s Group.destroy() or ringreduce."
         "destroy(), or its program ended: normally or by an exception)";
}
// The same when its goodbye gave a failure on its side as the reason.
inline std::string leftAfterFailure(const std::string& scope) {
  return "left " + (scope.empty() ? std::string("the job") : scope) +
         " after a failure on its side";
}

class Connection {
 public:
  Connection(int peer, std::string peerHost) : peer_(peer), peerHost_(std::move(peerHost)) {}
  virtual ~Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int peer() const { return peer_; }
  // The ranks messages name the peer and this rank by (world ranks, when this is a group's
  // connection), and every rank (roots in a mismatch): `all` is the owning communicator's
  // list, which outlives its connections.
  void setLabels(int peer, int self, const std::vector<int>& all) {
    label_ = peer;
    selfLabel_ = self;
    labels_ = &all;
  }
  const std::string& peerHost() const { return peerHost_; }

  // Advance without blocking; return true once the whole frame is through. Throw
  // PeerError on EOF/reset/abort frames and MismatchError on an unexpected header.
  virtual bool progressSend(SendOp& op) = 0;
  virtual bool progressRecv(RecvOp& op) = 0;

  // The group this connection belongs to ("": the world's or a point-to-point channel's),
  // for messages about the peer's goodbye (leftText).
  void setScope(std::string group) { scope_ = std::move(group); }

  // RINGREDUCE_CHECKSUM=1: send a CRC32C of every payload; received CRCs are always checked.
  void setChecksum(bool on) { checksum_ = on; }
  // A point-to-point channel's connection: mismatches name messages, not broadcasts.
  void setP2p(bool on) { p2p_ = on; }

  // Descriptor to poll for readiness, and the events to poll it for to learn `want`
  // (POLLIN, POLLOUT, POLLRDHUP, or'ed): the same, except for a stream on a shared link,
  // whose descriptor is an eventfd this call arms (readable once `want` holds).
  virtual int fd() const = 0;
  virtual short pollEvents(short want) { return want; }
  // While waiting for this peer's data, poll this too (POLLIN; -1: nothing more): a stream's
  // shared link socket, which the receive then reads itself instead of waiting for the pump
  // (which leaves it to this thread for a moment). Call after pollEvents, for each wait.
  virtual int readFd() { return -1; }
  // The same for sending (POLLOUT; -1: nothing more): the socket a stream's send writes to
  // itself while the stream may send, so that a send the socket cannot take yet waits for
  // room there rather than being copied into a buffer for the pump to send.
  virtual int writeFd() { return -1; }

  // Called on a connection that is readable although nothing is expected from it: throw if
  // it carries an abort frame or EOF, return kEarlyData if it is data of a later collective
  // (stop watching it for this collective), kGoodbye if the peer left cleanly (consumed;
  // stop watching it for good).
  // `current` (may be null) is the header of the collective this rank is in: a frame of
  // this or an earlier collective that does not match it is a mismatch (MismatchError).
  enum class Idle { kEarlyData, kGoodbye };
  virtual Idle checkIdle(const FrameHeader* current) = 0;
  // Called when the peer closed its side (POLLRDHUP, POLLHUP, POLLERR) of a connection whose
  // data of this collective arrived early and is not read yet: look past the unread frames
  // without consuming them. A goodbye there -- it finished and left: return (kGoodbye). An
  // abort frame: throw its reason. Neither: it ended without a word (killed, crashed):
  // throw PeerError now, not when a heartbeat goes missing.
  virtual Idle checkClosedAfterEarlyData() = 0;
  // Whether the next unread frame is the peer's goodbye (peeked, not consumed; never blocks).
  virtual bool goodbyeNext() = 0;

  // Best effort, non-blocking: tell the peer we are failing (because we lost `who`, if any).
  // Skipped mid-frame.
  virtual void sendAbort(AbortCode code, const std::string& reason, Culprit who) = 0;
  // Best effort, non-blocking: tell the peer we are leaving normally (destroy()); `why`:
  // "" or the failure (on another communicator of this process) we leave after, and `who`
  // the rank that failure lost, if it is one of this communicator's (the peer names it,
  // not us); `lastSeq`: the last collective this rank began (a peer in a later one knows
  // it will never come).
  virtual void sendGoodbye(const std::string& why, uint64_t lastSeq, Culprit who) = 0;
  // The `why` of the peer's goodbye, once one was read ("" before, or if it gave none).
  const std::string& leftWhy() const { return leftWhy_; }
  // The goodbye's lastSeq, once one was read (0 before).
  uint64_t leftAfter() const { return leftAfter_; }
  // The goodbye's `who` (rank -1: none, or none read).
  const Culprit& leftCulprit() const { return leftCulprit_; }
  virtual void close() = 0;

 protected:
  bool checksum_ = false;
  bool p2p_ = false;
  int peer_;
  int label_ = peer_;
  int selfLabel_ = -1;
  const std::vector<int>* labels_ = &kNoLabels;
  std::string peerHost_;
  std::string scope_;
  std::string leftWhy_;
  uint64_t leftAfter_ = 0;
  Culprit leftCulprit_;
};

// Makes connections after init, for peers a communicator did not connect at init (lazy
// connections, comm/communicator.h). The higher rank of a pair dials, the lower one accepts,
// both authenticated as at init. Only the communicator's executor thread calls it.
class Dialer {
 public:
  virtual ~Dialer() = default;
  // The rank messages name rank i by (world ranks, when this is a group's dialer).
  void setLabels(std::vector<int> labels) { labels_ = std::move(labels); }
  int label(int r) const { return rankLabel(labels_, r); }
  // Readable when a peer is dialling this rank (-1 once closed).
  virtual int listenFd() const = 0;
  // Host of `peer` as init learnt it (for messages).
  virtual const std::string& peerHost(int peer) const = 0;
  // Open a TCP connection to `peer` (a lower rank); returns its descriptor, on which the
  // peer's hello arrives once it accepts (the caller waits for it while watching everything
  // else). Throws PeerError when the peer is gone (nothing listens there any more).
  virtual int dial(int peer, double timeoutSec) = 0;
  // Once the peer's hello is readable: answer it (authenticate); its acknowledgement then
  // arrives on the same descriptor (the caller waits for it while watching everything else).
  virtual void answerDial(int peer, double timeoutSec) = 0;
  // Once the acknowledgement is readable: check it and return the connection.
  virtual std::unique_ptr<Connection> finishDial(int peer, double timeoutSec) = 0;
  // Accept the peers that are dialling (listenFd or a pendingFds() readable) without
  // blocking: returns one authenticated connection, or null when none is complete (refused
  // callers are logged and dropped). Call it until null. `wanted(rank)` says whether that
  // rank may connect now.
  virtual std::unique_ptr<Connection> acceptOne(bool (*wanted)(void*, int), void* ctx) = 0;
  // Whether nothing listens at `peer`'s address any more (a connection attempt within
  // `timeoutSec` is refused): it exited, crashed, or destroyed its communicator -- the
  // listener stays open until then. false if it accepts (alive, maybe frozen) or the
  // attempt times out (its host is down or cut off: unknown).
  virtual bool refuses(int peer, double timeoutSec) = 0;
  // Accepted connections whose authentication is awaited: poll them (POLLIN) as listenFd.
  virtual std::vector<int> pendingFds() const = 0;
  // Stop accepting (destroy, failure): nothing of the job keeps listening.
  virtual void close() = 0;

 private:
  std::vector<int> labels_;
};

}  // namespace rr::transport
