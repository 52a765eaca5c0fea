// A TCP connection to one peer: non-blocking framed sends/receives (header + payload in one
// writev/readv), header validation before payload is trusted, abort frames, EOF detection.
#pragma once

#include <memory>

#include "transport/tcp/pipe.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace rr::transport::tcp {

class TcpConnection final : public Connection {
 public:
  TcpConnection(int peer, std::string peerHost, Fd fd);  // a socket of its own
  // Through `pipe`: a socket, or a stream on a link the process's communicators share.
  TcpConnection(int peer, std::string peerHost, std::unique_ptr<Pipe> pipe);
  ~TcpConnection() override;

  bool progressSend(SendOp& op) override;
  bool progressRecv(RecvOp& op) override;
  int fd() const override { return pipe_->fd(); }
  short pollEvents(short want) override { return pipe_->pollEvents(want); }
  int readFd() override { return pipe_->readFd(); }
  int writeFd() override { return pipe_->writeFd(); }
  Idle checkIdle(const FrameHeader* current) override;
  Idle checkClosedAfterEarlyData() override;
  bool goodbyeNext() override;
  void sendAbort(AbortCode code, const std::string& reason, Culprit who) override;
  void sendGoodbye(const std::string& why, uint64_t lastSeq, Culprit who) override;
  void close() override;

 private:
  [[noreturn]] void failClosed(const char* doing);
  [[noreturn]] void failErrno(const char* doing, int err);
  // The peer said goodbye (leftWhy_ holds its why) while this rank still `doing`.
  [[noreturn]] void failLeft(const char* doing);
  void checkFlags(const FrameHeader& h) const;  // unknown bits; a CRC this rank requires
  // The first abort or goodbye among the bytes received and not read yet, peeked (not
  // consumed) past any complete frames ahead of it; kind 0: none there.
  struct Pending {
    CollectiveKind kind{};
    FrameHeader hdr;
    std::string text;
  };
  Pending peekControl();
  void sendControl(CollectiveKind kind, uint8_t code, const std::string& payload,
                   Culprit who = {}, uint64_t seq = 0);
  // Finish a partially written frame with zeros, within `d` (false: not done).
  bool padFrame(Deadline d);
  [[noreturn]] void raiseAbort(const FrameHeader& h, const char* already, size_t alreadyLen);
  [[noreturn]] void throwAbort(const FrameHeader& h, const std::string& reason);
  // A goodbye's header was read (`already`: payload bytes read with it): read its `why`.
  void readGoodbye(const FrameHeader& h, const char* already, size_t alreadyLen);
  // What a goodbye's header and reason say (leftWhy_, leftAfter_, leftCulprit_).
  void noteGoodbye(const FrameHeader& h, std::string why);

  void consumeHeader();  // drop a frame header peeked whole

  std::unique_ptr<Pipe> pipe_;
  // Most payload bytes one read takes (see pipe.cc's kLocalRecvPiece).
  size_t recvPiece_;
  // Bytes of a partially written frame still to go (> 0: an abort frame would corrupt it).
  size_t midRemain_ = 0;
  // noteGoodbye ran: the close that follows is its leaving, not a crash (failClosed).
  bool goodbyeSeen_ = false;
};

}  // namespace rr::transport::tcp
