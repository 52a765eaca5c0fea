#include "transport/tcp/mesh.h"

#include "core/error.h"
#include "core/log.h"
#include "transport/tcp/tcp_connection.h"

namespace rr::transport::tcp {

Listener::Listener(const std::string& host) : host_(host) { fd_ = listenOn(host, 0, &port_); }

void throwUnreachable(int peer, int shown, const Endpoint& ep, const Error& why) {
  throw PeerError(peer, PeerCause::kClosed,
                  detail::concat("rank ", shown, " (", ep.host, ") cannot be reached at ", ep.str(),
                                 " (it exited, crashed or destroyed its communicator): ",
                                 why.what()));
}

std::vector<std::unique_ptr<Connection>> connectMesh(const Identity& me, Listener& listener,
                                                     const std::vector<std::string>& peerAddrs,
                                                     Deadline d, const StillWanted& check) {
  std::vector<int> all;
  for (int r = 0; r < me.world; ++r)
    if (r != me.rank) all.push_back(r);
  return connectSubset(me, listener, peerAddrs, all, d, check);
}

std::vector<std::unique_ptr<Connection>> connectSubset(const Identity& me, Listener& listener,
                                                       const std::vector<std::string>& peerAddrs,
                                                       const std::vector<int>& want, Deadline d,
                                                       const StillWanted& check) {
  RR_CHECK_EQ(static_cast<int>(peerAddrs.size()), me.world, "one address per rank");
  std::vector<std::unique_ptr<Connection>> conns(static_cast<size_t>(me.world));
  std::vector<uint8_t> wanted(static_cast<size_t>(me.world), 0);
  for (int p : want) wanted[static_cast<size_t>(p)] = 1;
  // Connect to every wanted lower rank, in order.
  for (int peer = 0; peer < me.rank; ++peer) {
    if (!wanted[static_cast<size_t>(peer)]) continue;
    Endpoint ep = parseEndpoint(peerAddrs[static_cast<size_t>(peer)]);
    Fd fd;
    try {
      fd = connectTo(ep, d,
                     detail::concat("rank ", me.shown(me.rank), " connecting to rank ",
                                    me.shown(peer)),
                     Retry::kUnlessRefused, check);
    } catch (const Refused& e) {
      throwUnreachable(peer, me.shown(peer), ep, e);
    }
    connectHandshake(fd.get(), me, peer, ep.str(), d);
    conns[static_cast<size_t>(peer)] = std::make_unique<TcpConnection>(peer, ep.host, std::move(fd));
    RR_DEBUG("connected to rank ", peer, " at ", ep.str());
  }
  // Accept every wanted higher rank, in any order; refuse strangers and duplicates.
  int missing = 0;
  for (int r = me.rank + 1; r < me.world; ++r) missing += wanted[static_cast<size_t>(r)];
  while (missing > 0) {
    std::string from;
    Fd fd = acceptOne(listener.fd(), check ? d.capped(0.25) : d, &from);
    if (!fd.valid() && check && !d.expired()) {
      check();
      continue;
    }
    if (!fd.valid()) {
      std::string who;
      for (int r = me.rank + 1; r < me.world; ++r)
        if (wanted[static_cast<size_t>(r)] && !conns[static_cast<size_t>(r)])
          who += (who.empty() ? "" : ", ") + std::to_string(me.shown(r));
      RR_THROW(TimeoutError, "rank ", me.shown(me.rank), " timed out waiting for rank(s) ", who,
               " to connect to ", listener.host(), ":", listener.port(),
               " (did they start? are WORLD_SIZE and MASTER_ADDR the same everywhere? "
               "is a firewall in the way? raise RINGREDUCE_CONNECT_TIMEOUT if startup is slow)");
    }
    std::string reason;
    // A stranger gets a short window so it cannot stall the legitimate peers for long.
    int peer = acceptHandshake(fd.get(), me, d.capped(5.0),
                               [&](int r) { return !conns[static_cast<size_t>(r)]; }, &reason);
    if (peer < 0) {
      RR_WARN("refused a connection from ", from, ": ", reason);
      continue;
    }
    conns[static_cast<size_t>(peer)] = std::make_unique<TcpConnection>(peer, from, std::move(fd));
    RR_DEBUG("accepted rank ", peer, " from ", from);
    missing -= wanted[static_cast<size_t>(peer)];
  }
  return conns;
}

}  // namespace rr::transport::tcp
