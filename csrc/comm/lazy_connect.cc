// Lazy connections (Communicator::setDialer): large jobs connect a sparse overlay at init
// and every other pair on first use, inside the collective that needs it.
//
// Why this cannot deadlock: the higher rank of a pair dials, the lower accepts, and both
// need the pair in the same collective (data flows both ways or one way, but both sides
// call conn()). Every wait of a rank -- data, shared memory, or its own dial -- accepts
// whoever is dialling it and reads their answers, so a dialler waits only for its peer to
// reach some wait of that collective. No wait blocks on a peer's answer: a dialler waits
// for the hello and then the ack in a wait like any other (deadline, liveness, other
// diallers served), and an acceptor reads an answer whenever it has arrived
// (accept_queue.h), so a stranger that connects and says nothing holds up no wait.
#include <poll.h>

#include <algorithm>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "transport/redial.h"

namespace rr::comm {

namespace {
constexpr double kHandshakeCapSec = 5.0;  // to connect; to read what is already readable
}  // namespace

void Communicator::setDialer(std::unique_ptr<transport::Dialer> dialer,
                             const std::vector<int>& watch) {
  dialer_ = std::move(dialer);
  if (dialer_) dialer_->setLabels(opts_.rankLabels);
  watch_.assign(static_cast<size_t>(world_), 0);
  watchList_.clear();
  for (int p : watch) {
    RR_CHECK(p >= 0 && p < world_ && p != rank_, "bad overlay peer ", p);
    watch_[static_cast<size_t>(p)] = 1;
    watchList_.push_back(p);
  }
}

std::string Communicator::peerHost(int peer) const {
  if (peer < 0 || peer >= world_) return "?";
  const auto& c = conns_[static_cast<size_t>(peer)];
  if (c) return c->peerHost();
  return dialer_ ? dialer_->peerHost(peer) : std::string("?");
}

bool Communicator::incoming(int peer) {
  RR_CHECK(peer >= 0 && peer < world_ && peer != rank_, "no rank ", peer, " to probe");
  if (failed()) return true;  // the receive that follows reports it
  const auto& c = conns_[static_cast<size_t>(peer)];
  if (c && c->fd() >= 0) {
    pollfd p{c->fd(), c->pollEvents(POLLIN), 0};
    // A frame, EOF or an error: the receive reads it -- but not a goodbye: the peer left
    // without sending (an any-source receive waits on for the others, as over shared memory).
    if (::poll(&p, 1, 0) > 0) return !c->goodbyeNext();
  }
  if (!shmAll()) return false;
  // Shared memory: every local rank's index is its communicator rank. A peer that failed
  // before writing its line (its slots did not fit /dev/shm) counts: the receive reports it.
  // So does one whose process ended without leaving (its pidfd; the TCP path's EOF) -- an
  // any-source receive waited on for the others until RINGREDUCE_TIMEOUT, or the heartbeat
  // timeout, for a sender that was killed (found by a helper).
  if (shm_->lineAhead(peer) || shm_->abortOf(peer, nullptr) != 0) return true;
  auto others = [](const void* want, int r) { return r != *static_cast<const int*>(want); };
  return procs_ && !shm_->leftOf(peer) && procs_->exited(others, &peer) == peer;
}

int Communicator::openConnections() const {
  int n = 0;
  for (const auto& c : conns_)
    if (c && c->fd() >= 0) ++n;
  return n;
}

void Communicator::connectLazily(int peer) {
  RR_CHECK(peer >= 0 && peer < world_ && peer != rank_, "no connection to rank ", peer);
  if (!dialer_ || dialer_->listenFd() < 0) {
    checkUsable();
    RR_THROW(Error, "rank ", label(rank_), " has no connection to rank ", label(peer),
             " and can no longer make one (the communicator is shutting down)");
  }
  if (hb_) hb_->setWaiting(peer);
  double left = deadline_.pollMs() / 1000.0;
  double cap = std::min(left, opts_.connectTimeoutSec);
  if (peer < rank_) {
    // A connection closed before the peer's hello or ack is dialled again (redial.h).
    transport::Redial redial;
    auto again = [&](auto&& step) {
      try {
        step();
        return false;
      } catch (const PeerError& e) {
        if (!redial.again(e, peer, deadline_)) throw;
        RR_DEBUG("rank ", label(rank_), ": dialling rank ", label(peer), " again (", e.what(),
                 ")");
        redial.pause();
        return true;
      }
    };
    while (true) {
      int fd = dialer_->dial(peer, std::min(cap, kHandshakeCapSec));
      waitForLink(peer, fd);  // its hello: sent once it accepts, in one of its waits
      if (again([&] { dialer_->answerDial(peer, kHandshakeCapSec); })) continue;
      waitForLink(peer, fd);  // its ack: sent once it reads the answer, in one of its waits
      if (again([&] {
            conns_[static_cast<size_t>(peer)] = dialer_->finishDial(peer, kHandshakeCapSec);
          }))
        continue;
      break;
    }
  } else {
    waitForLink(peer, -1);
  }
  adopt(*conns_[static_cast<size_t>(peer)]);
}

void Communicator::adopt(transport::Connection& c) const {
  c.setChecksum(opts_.checksum);
  c.setLabels(label(c.peer()), label(rank_), opts_.rankLabels);
  c.setP2p(opts_.p2pChannel);
  c.setScope(opts_.p2pChannel ? "" : opts_.groupName);
}

void Communicator::acceptDialler() {
  auto wanted = [](void* self, int r) {
    auto* me = static_cast<Communicator*>(self);
    return r > me->rank_ && r < me->world_ && !me->conns_[static_cast<size_t>(r)];
  };
  while (std::unique_ptr<Connection> c = dialer_->acceptOne(wanted, this)) {
    const int p = c->peer();
    adopt(*c);
    conns_[static_cast<size_t>(p)] = std::move(c);
  }
  // The wait in progress polls the connections still authenticating (accept_queue.h), not
  // the ones that finished or were dropped (their numbers may be reused).
  std::vector<int> now = dialer_->pendingFds();
  for (size_t i = 0; i < pfds_.size(); ++i)
    if (pfdPeer_[i] == kListenerSlot && pfds_[i].fd != dialer_->listenFd() &&
        std::find(now.begin(), now.end(), pfds_[i].fd) == now.end())
      pfds_[i].fd = -1;
  for (int fd : now) {
    bool seen = false;
    for (size_t i = 0; i < pfds_.size() && !seen; ++i)
      seen = pfdPeer_[i] == kListenerSlot && pfds_[i].fd == fd;
    if (!seen) {
      pfds_.push_back({fd, POLLIN, 0});
      pfdPeer_.push_back(kListenerSlot);
    }
  }
}

void Communicator::waitForLink(int peer, int dialFd) {
  noteWait();
  livenessAtMs_ = steadyMs();  // livenessDue counts from this wait's start
  while (true) {
    if (dialFd < 0 && conns_[static_cast<size_t>(peer)]) return;
    pfds_.clear();
    pfdPeer_.clear();
    pfds_.push_back({wakeFd_, POLLIN, 0});
    pfdPeer_.push_back(-1);
    if (dialFd >= 0) {
      pfds_.push_back({dialFd, POLLIN, 0});
      pfdPeer_.push_back(peer);
    }
    watchIdle(peer, peer);
    if (pollWaits() == 0) {
      if (deadline_.expired()) {
        int stuck = -1;
        const std::string diag = diagnosis(peer, &stuck);
        throw TimeoutError(
            detail::concat("rank ", label(rank_), ": ", describeCurrent(), " timed out after ",
                           curTimeoutSec_, " s waiting for rank ", label(peer), " (",
                           peerHost(peer), ") to ",
                           dialFd >= 0 ? "accept a connection" : "connect",
                           " (it needs no connection before this collective)", diag,
                           " (is that rank stuck, or did it skip this collective?)"),
            peer, stuck);
      }
      // Local peers' aborts and deaths (a group on one host has no connection to carry
      // them), heartbeats, signals: as every other wait.
      checkLiveness(peer, peer, false);
      continue;
    }
    for (size_t i = 1; i < pfds_.size(); ++i) {
      if (!pfds_[i].revents) continue;
      const int p = pfdPeer_[i];
      if (p == peer && dialFd >= 0) return;  // its hello or ack (or EOF: the dialer says)
      if (p == kListenerSlot) acceptDialler();
      else if (p >= 0) onIdleReadable(p);
    }
    livenessDue(peer, peer);
  }
}

}  // namespace rr::comm
