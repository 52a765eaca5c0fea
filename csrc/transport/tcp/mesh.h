// Full-mesh bootstrap over TCP: every rank connects to each lower rank and accepts each
// higher one, authenticating both directions (handshake.h). Rank k's connects succeed once
// ranks < k have started accepting, so the procedure cannot deadlock.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"

namespace rr::transport::tcp {

// A bound, listening socket created before the addresses are exchanged.
class Listener {
 public:
  explicit Listener(const std::string& host);
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  int fd() const { return fd_.get(); }
  void close() { fd_.reset(); }

 private:
  std::string host_;
  int port_ = 0;
  Fd fd_;
};

// Returns one connection per peer rank (nullptr at index me.rank). peerAddrs[i] is
// "host:port" of rank i. Strangers and refused handshakes are logged and ignored; a rank
// that never shows up raises TimeoutError naming it; a rank whose listener refuses (every
// rank listens before it publishes its address) raises PeerError: it is gone. `check`
// runs every ~250 ms while they wait for a peer.
std::vector<std::unique_ptr<Connection>> connectMesh(const Identity& me, Listener& listener,
                                                     const std::vector<std::string>& peerAddrs,
                                                     Deadline d, const StillWanted& check = {});
// Turns an authenticated socket to `peer` (at `host`) into its connection (default: a
// TcpConnection of its own; link_table.h makes it a link the process's groups share).
using MakeConnection =
    std::function<std::unique_ptr<Connection>(int peer, const std::string& host, Fd fd)>;
// The same for the peers in `want` only (sorted; symmetric: rank a lists b iff b lists a,
// or the procedure waits for a peer that never dials). Higher ranks that dial early for a
// lazy connection (TcpDialer) are accepted too; other slots stay null.
std::vector<std::unique_ptr<Connection>> connectSubset(const Identity& me, Listener& listener,
                                                       const std::vector<std::string>& peerAddrs,
                                                       const std::vector<int>& want, Deadline d,
                                                       const StillWanted& check = {},
                                                       const MakeConnection& make = {});

// The PeerError of a peer (`shown` as in messages) whose listener at `ep` cannot be reached.
[[noreturn]] void throwUnreachable(int peer, int shown, const Endpoint& ep, const Error& why);

}  // namespace rr::transport::tcp
