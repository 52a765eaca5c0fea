#include "transport/tcp/mesh.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "transport/redial.h"
#include "transport/tcp/accept_queue.h"
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

namespace {

// A set-up that gives up tells each peer it reached why, as a failed collective's abort
// frames do, naming the rank to blame: the one another rank's failure named (StoppedFor),
// the peer it lost, where its wait ended, or else this rank. Called while handling the
// failure. Before, the connections just closed: a peer done with its own set-up took that
// for this rank's crash and named it, a bystander (found by a helper: a rank at its thread
// limit made a third member blame the one that had stopped because of it).
void tellMade(const Identity& me, std::vector<std::unique_ptr<Connection>>& conns) {
  std::string why;
  AbortCode code = AbortCode::kPeer;
  Culprit who{me.rank, PeerCause::kAborted};
  try {
    throw;
  } catch (const StoppedFor& e) {
    why = e.what();
    who = e.culprit() >= 0 ? Culprit{e.culprit(), PeerCause::kAborted, e.outside()} : Culprit{};
    if (e.culprit() < 0) code = AbortCode::kOther;
  } catch (const PeerError& e) {
    why = e.what();
    if (!e.outside() && e.peer() >= 0) who = Culprit{e.peer(), e.cause()};
  } catch (const TimeoutError& e) {
    why = e.what();
    code = AbortCode::kTimeout;
    who = e.stuck() >= 0 ? Culprit{e.stuck(), PeerCause::kAborted} : Culprit{};
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    return;
  }
  try {  // best effort: the failure being handled is what the caller raises
    for (auto& c : conns)  // the lost rank itself hears of its own loss (Communicator::poison)
      if (c) c->sendAbort(code, why, !who.outside && c->peer() == who.rank ? Culprit{} : who);
  } catch (...) {
  }
}

// Connect to `peer` and authenticate; a connection it closed before its hello or reply is
// dialled again while time is left (redial.h).
Fd dialPeer(const Identity& me, int peer, const Endpoint& ep, Deadline d,
            const StillWanted& check) {
  Redial redial;
  while (true) {
    Fd fd = connectTo(ep, d,
                      detail::concat("rank ", me.shown(me.rank), " connecting to rank ",
                                     me.shown(peer)),
                      Retry::kUnlessRefused, check);
    try {
      connectHandshake(fd.get(), me, peer, ep.str(), d);
      return fd;
    } catch (const PeerError& e) {
      if (!redial.again(e, peer, d)) throw;
      RR_DEBUG("rank ", me.shown(me.rank), ": dialling rank ", me.shown(peer), " again (",
               e.what(), ")");
    }
    if (check) check();
    redial.pause();
  }
}

void connectInto(std::vector<std::unique_ptr<Connection>>& conns, const Identity& me,
                 Listener& listener, const std::vector<std::string>& peerAddrs,
                 const std::vector<int>& want, Deadline d, const StillWanted& check,
                 const MakeConnection& makeConn) {
  auto make = [&](int peer, const std::string& host, Fd fd) -> std::unique_ptr<Connection> {
    if (makeConn) return makeConn(peer, host, std::move(fd));
    return std::make_unique<TcpConnection>(peer, host, std::move(fd));
  };
  std::vector<uint8_t> wanted(static_cast<size_t>(me.world), 0);
  for (int p : want) wanted[static_cast<size_t>(p)] = 1;
  // Connect to every wanted lower rank, in order.
  for (int peer = 0; peer < me.rank; ++peer) {
    if (!wanted[static_cast<size_t>(peer)]) continue;
    Endpoint ep = parseEndpoint(peerAddrs[static_cast<size_t>(peer)]);
    try {
      conns[static_cast<size_t>(peer)] = make(peer, ep.host, dialPeer(me, peer, ep, d, check));
    } catch (const Refused& e) {
      throwUnreachable(peer, me.shown(peer), ep, e);
    } catch (const TimeoutError& e) {  // named, as a collective's timeout names its peer
      throw TimeoutError(e.what(), peer, peer);
    }
    RR_DEBUG("connected to rank ", me.shown(peer), " at ", ep.str());
  }
  // Accept every wanted higher rank, in any order; refuse strangers and duplicates. All
  // pending handshakes are served at once (accept_queue.h): a silent stranger holds up nobody.
  int missing = 0;
  for (int r = me.rank + 1; r < me.world; ++r) missing += wanted[static_cast<size_t>(r)];
  AcceptQueue q(me, detail::concat("rank ", me.shown(me.rank)));
  auto expected = [](void* c, int r) {
    return !(*static_cast<std::vector<std::unique_ptr<Connection>>*>(c))[static_cast<size_t>(r)];
  };
  auto take = [&](std::vector<AcceptQueue::Accepted> batch) {
    for (auto& a : batch) {
      RR_DEBUG("accepted rank ", me.shown(a.rank), " from ", a.from);
      missing -= wanted[static_cast<size_t>(a.rank)];
      conns[static_cast<size_t>(a.rank)] = make(a.rank, a.from, std::move(a.fd));
    }
  };
  Deadline nextCheck = Deadline::after(0.25);
  while (missing > 0) {
    std::vector<pollfd> pfds{{listener.fd(), POLLIN, 0}};
    for (int fd : q.fds()) pfds.push_back({fd, POLLIN, 0});
    Deadline wait = check ? d.capped(0.25) : d;
    if (const int due = q.nextDueMs(); due >= 0) wait = wait.capped(due / 1000.0);
    pollInterruptible(pfds.data(), pfds.size(), wait);
    q.acceptWaiting(listener.fd());
    take(q.progress(expected, &conns));
    if (missing == 0) break;
    if (d.expired()) {
      std::string who;
      int one = -1;  // the missing rank, when only one is: named as a collective's peer
      for (int r = me.rank + 1; r < me.world; ++r)
        if (wanted[static_cast<size_t>(r)] && !conns[static_cast<size_t>(r)]) {
          one = who.empty() ? r : -1;
          who += (who.empty() ? "" : ", ") + std::to_string(me.shown(r));
        }
      throw TimeoutError(
          detail::concat("rank ", me.shown(me.rank), " timed out waiting for rank(s) ", who,
                         " to connect to ", listener.host(), ":", listener.port(),
                         " (they published their addresses, so they started: did they die "
                         "or freeze during set-up? is a firewall blocking TCP to this "
                         "address? raise RINGREDUCE_CONNECT_TIMEOUT if set-up is slow)"),
          one, one);
    }
    if (check && nextCheck.expired()) {
      check();
      nextCheck = Deadline::after(0.25);
    }
  }
  // Connections still authenticating when the peers are all in: a duplicate RANK or another
  // job's process answers at once and is told why it is refused (as it was when the accept
  // loop served them in turn); a silent one is dropped after this short grace.
  const Deadline grace = Deadline::after(0.5);
  while (!q.empty() && !grace.expired()) {
    q.awaitAnswer(grace);
    take(q.progress(expected, &conns));
  }
}

}  // namespace

std::vector<std::unique_ptr<Connection>> connectSubset(const Identity& me, Listener& listener,
                                                       const std::vector<std::string>& peerAddrs,
                                                       const std::vector<int>& want, Deadline d,
                                                       const StillWanted& check,
                                                       const MakeConnection& makeConn) {
  RR_CHECK_EQ(static_cast<int>(peerAddrs.size()), me.world, "one address per rank");
  std::vector<std::unique_ptr<Connection>> conns(static_cast<size_t>(me.world));
  try {
    connectInto(conns, me, listener, peerAddrs, want, d, check, makeConn);
  } catch (...) {
    tellMade(me, conns);
    throw;
  }
  return conns;
}

}  // namespace rr::transport::tcp
