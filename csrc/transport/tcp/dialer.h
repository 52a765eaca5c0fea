// TCP Dialer (transport.h): lazy connections after init over the listener init opened, with
// the same mutual authentication (handshake.h) and the same rule as connectMesh: the higher
// rank of a pair dials, the lower accepts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/accept_queue.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/mesh.h"
#include "transport/transport.h"

namespace rr::transport::tcp {

class TcpDialer final : public Dialer {
 public:
  // peerAddrs[i] is "host:port" of rank i's listener, as exchanged at init.
  TcpDialer(Identity me, Listener listener, std::vector<std::string> peerAddrs);

  int listenFd() const override { return listener_.fd(); }
  const std::string& peerHost(int peer) const override;
  int dial(int peer, double timeoutSec) override;
  void answerDial(int peer, double timeoutSec) override;
  bool refuses(int peer, double timeoutSec) override;
  std::unique_ptr<Connection> finishDial(int peer, double timeoutSec) override;
  std::unique_ptr<Connection> acceptOne(bool (*wanted)(void*, int), void* ctx) override;
  std::vector<int> pendingFds() const override { return accepting_.fds(); }
  void close() override;

 private:
  Identity me_;
  Listener listener_;
  std::vector<std::string> addrs_;
  std::vector<std::string> hosts_;
  std::vector<Fd> pending_;  // dialled, not yet authenticated, per peer
  std::vector<ConnectState> answered_;  // per peer: its hello answered (answerDial)
  AcceptQueue accepting_;    // accepted, not yet authenticated
  std::vector<AcceptQueue::Accepted> ready_;  // authenticated, not yet taken by acceptOne
};

// The peers every rank connects at init when the job is too large for a full mesh: ranks
// r +- 2^k (mod world), a symmetric overlay of diameter O(log n) that carries liveness
// (EOF, abort frames) and heartbeats. Sorted, without `rank`.
std::vector<int> overlayPeers(int rank, int world);

}  // namespace rr::transport::tcp
