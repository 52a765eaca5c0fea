// The Communicator's waits: sockets (waitIo: poll the peers a step moves data with, watch
// the others for EOF / abort frames, accept dialling peers) and everything else that waits
// outside poll (checkAlive: shared memory's futex waits call it every few ms). Both check
// abort, the deadline, the peers' heartbeats and Python's signal handlers (core/interrupt.h)
// the same way (checkLiveness).
#include <errno.h>

#include <algorithm>
#include <cstring>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/spin.h"

namespace rr::comm {

namespace {
constexpr size_t kSpinMaxBytes = 256 * 1024;
}  // namespace

void Communicator::waitIo(int sendPeer, int recvPeer) {
  noteWait();
  livenessAtMs_ = ioWaitSinceMs_ = steadyMs();  // livenessDue counts from this wait's start
  pfds_.clear();
  pfdPeer_.clear();
  pfds_.push_back({wakeFd_, POLLIN, 0});
  pfdPeer_.push_back(-1);
  // The peers this step moves data with (connected by the caller's progress calls).
  if (sendPeer >= 0) {
    Connection& c = conn(sendPeer);
    pfds_.push_back({c.fd(), c.pollEvents(sendPeer == recvPeer ? POLLOUT | POLLIN : POLLOUT), 0});
    pfdPeer_.push_back(sendPeer);
  }
  if (recvPeer >= 0 && recvPeer != sendPeer) {
    Connection& c = conn(recvPeer);
    pfds_.push_back({c.fd(), c.pollEvents(POLLIN), 0});
    pfdPeer_.push_back(recvPeer);
  }
  // A stream's link socket, which its send and receive write and read themselves (read
  // first: a writer that waits for credit and reads too reads the credit itself).
  const int rfd = recvPeer >= 0 ? conn(recvPeer).readFd() : -1;
  const int wfd = sendPeer >= 0 ? conn(sendPeer).writeFd() : -1;
  if (wfd >= 0 && wfd == rfd) {
    pfds_.push_back({wfd, POLLIN | POLLOUT, 0});
    pfdPeer_.push_back(recvPeer);
  } else {
    if (wfd >= 0) {
      pfds_.push_back({wfd, POLLOUT, 0});
      pfdPeer_.push_back(sendPeer);
    }
    if (rfd >= 0) {
      pfds_.push_back({rfd, POLLIN, 0});
      pfdPeer_.push_back(recvPeer);
    }
  }
  watchIdle(sendPeer, recvPeer);
  // The heartbeat thread names the peer we wait for in its stall reports (pollWaits wakes
  // at least every 250 ms to check heartbeats).
  const int waitingFor = recvPeer >= 0 ? recvPeer : sendPeer;
  if (hb_) hb_->setWaiting(waitingFor);
  // Spin phase (see Options::spinUs), for latency-bound collectives only: a large transfer
  // waits often and amortises wake-ups, and spinning would take CPU from the network stack.
  if (spinAllowed_ && bytesTotal_ <= kSpinMaxBytes)
    spinFor(opts_.spinUs, 1, [this] { return ::poll(pfds_.data(), pfds_.size(), 0) > 0; });
  while (true) {
    const int n = pollWaits();
    if (n == 0) {
      checkLiveness(sendPeer, recvPeer, false);
      continue;
    }
    // The peers this step moves data with first: their data may complete a collective
    // that another rank's failure, seen in the same poll, would fail -- a tree leaf's
    // result from its parent with a sibling's abort from the next collective (found by the
    // project's CI). The others are read on the next wait (poll is level-triggered) or by
    // the next call's probes; progress calls surface errors on these connections.
    bool ready = false;
    for (size_t i = 1; i < pfds_.size(); ++i) {
      if (!pfds_[i].revents) continue;
      if (pfdPeer_[i] == sendPeer || pfdPeer_[i] == recvPeer) ready = true;
      if (pfdPeer_[i] == kListenerSlot) acceptDialler();  // a dialler's handshake has a limit
    }
    if (ready) return;
    for (size_t i = 1; i < pfds_.size(); ++i) {
      if (!pfds_[i].revents) continue;
      int p = pfdPeer_[i];
      if (p != kListenerSlot) {
        onIdleReadable(p);  // throws on EOF / abort; otherwise stop watching this peer --
        // for data, that is; for it closing its side, still (see watchIdle)
        checkGone();
        if (gone_[static_cast<size_t>(p)]) pfds_[i].fd = -1;  // poll skips it, HUP and all
        else pfds_[i].events = conn(p).pollEvents(POLLRDHUP);
      }
    }
    // After the connections (a killed peer's EOF says "closed" before its silence would
    // say "stopped responding": CI caught the other order).
    livenessDue(sendPeer, recvPeer);
  }
}

int Communicator::pollWaits() {
  while (true) {
    int ms = deadline_.pollMs();
    if (hb_ && ms > kLivenessEveryMs) ms = static_cast<int>(kLivenessEveryMs);  // heartbeats
    int n = ::poll(pfds_.data(), pfds_.size(), ms);
    if (n < 0) {
      if (errno == EINTR) {  // a signal: see whether its Python handler raised
        checkInterrupt(true);
        continue;
      }
      RR_THROW(Error, "poll failed: ", std::strerror(errno));
    }
    checkStopped();
    return n;
  }
}

void Communicator::watchIdle(int sendPeer, int recvPeer) {
  for (int p : watchList_) {
    if (p == sendPeer || p == recvPeer) continue;
    if (gone_[static_cast<size_t>(p)] || probeSkipped(p)) continue;
    const auto& c = conns_[static_cast<size_t>(p)];
    if (!c) continue;
    // Watch for death/abort; once its data of this collective is waiting unread, only for
    // the peer closing its side (POLLRDHUP: data stays readable, a FIN does not).
    pfds_.push_back({c->fd(), c->pollEvents(early_[static_cast<size_t>(p)] ? POLLRDHUP : POLLIN),
                     0});
    pfdPeer_.push_back(p);
  }
  if (dialer_ && dialer_->listenFd() >= 0) {
    pfds_.push_back({dialer_->listenFd(), POLLIN, 0});
    pfdPeer_.push_back(kListenerSlot);
    for (int fd : dialer_->pendingFds()) {  // dialling peers still authenticating
      pfds_.push_back({fd, POLLIN, 0});
      pfdPeer_.push_back(kListenerSlot);
    }
  }
}

void Communicator::onIdleReadable(int p) {
  Connection& c = conn(p);
  const bool early = early_[static_cast<size_t>(p)] != 0;
  if ((early ? c.checkClosedAfterEarlyData() : c.checkIdle(&curHeader_)) ==
      Connection::Idle::kGoodbye)
    markGone(p);
  else
    early_[static_cast<size_t>(p)] = 1;
}

void Communicator::checkAlive(int peer) {
  noteWait();
  if (hb_ && peer >= 0) hb_->setWaiting(peer);
  // The connections first (over shared memory none carries this collective's data): a peer
  // killed while this rank was between collectives is silent by now too, but its closed
  // connection says what happened -- the heartbeats would call it frozen.
  pollIdle();
  checkLiveness(-1, peer, true);
  if (peer >= 0 && gone_[static_cast<size_t>(peer)])
    throwLeft(peer, detail::concat(" while rank ", label(rank_), " waited for it in ",
                                   describeCurrent()));
}

bool Communicator::peerFailure(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const PeerError&) {
    return true;
  } catch (const MismatchError& m) {
    return m.via() >= 0;  // relayed by its abort (found here: this collective's own)
  } catch (const TimeoutError& t) {
    return t.via() >= 0;  // relayed (else this rank's own deadline)
  } catch (...) {
    return false;
  }
}

bool Communicator::deferPeerFailure(std::exception_ptr e) {
  if (!peerFailure(e)) return false;
  if (!deferred_) deferred_ = e;
  return true;
}

void Communicator::throwLeft(int p, const std::string& during) {
  const std::string why = leftWhy(p);
  // It left after losing a rank of ours: name that one, as its abort frame would have.
  const transport::Culprit who = leftCulprit(p);
  if (why.empty())
    throw PeerError(p, PeerCause::kLeft, detail::concat(
        "rank ", label(p), " (", peerHost(p), ") ",
        transport::leftText(opts_.p2pChannel ? "" : opts_.groupName), during));
  std::string msg =
      detail::concat("rank ", label(p), " (", peerHost(p), ") ",
                     transport::leftAfterFailure(opts_.p2pChannel ? "" : opts_.groupName), during,
                     ": ", transport::saidBy(std::to_string(label(p)), why));
  if (knownCulprit(who, p))
    throw PeerError(who.rank, who.cause, std::move(msg), p, who.outside);
  throw PeerError(p, PeerCause::kLeft, std::move(msg));
}

void Communicator::throwLeftAnyOf(int p) {
  try {
    throwLeft(p, "");
  } catch (const PeerError& e) {
    if (e.cause() != PeerCause::kLeft || e.peer() != p || e.via() >= 0) throw;  // a culprit
    throw UnansweredError(p, PeerCause::kLeft, e.what());
  }
}

void Communicator::probePeers(const std::vector<int>& waitedFor, bool anyOf) {
  // This communicator's failure named a rank this wait needs as closed (its process died):
  // it is known gone, though over TCP its connection closed with the failure and no probe
  // would see it again (found by a helper: a send to it on a new tag returned, failing
  // later). Not one found silent: it may resume (a stopped host: the CI).
  if (poisoned() && failedPeer_ >= 0 && failedCause_ == PeerCause::kClosed)
    for (int p : waitedFor)
      if (p >= 0 && p < world_ && label(p) == failedPeer_) checkUsable();  // PeerError
  // A failed rank this wait does not need must not hide one it does: each pass throws the
  // first failure it finds, and a rank that died earlier was found first by every probe --
  // the awaited rank's death after it went unseen until the timeout (found by a helper).
  // So a failure of another rank is kept, its rank passed over, and the probe goes on; it
  // is thrown last if no waited-for rank failed.
  std::vector<uint8_t> skip(static_cast<size_t>(world_), 0);
  struct Reset {
    const std::vector<uint8_t>*& p;
    ~Reset() { p = nullptr; }
  } reset{probeSkip_};
  probeSkip_ = &skip;
  std::exception_ptr other;
  for (int pass = 0; pass < world_; ++pass) {
    try {
      probeOnce(waitedFor, anyOf);
      break;
    } catch (const PeerError& e) {
      const int src = e.via() >= 0 ? e.via() : e.peer();  // the rank whose state said so
      if (waitedFor.empty() || e.outside() || src < 0 || src >= world_ || src == rank_ ||
          skip[static_cast<size_t>(src)] ||
          std::find(waitedFor.begin(), waitedFor.end(), src) != waitedFor.end())
        throw;
      if (!other) other = std::current_exception();
      skip[static_cast<size_t>(src)] = 1;
    }
  }
  if (other) std::rethrow_exception(other);
}

void Communicator::probeOnce(const std::vector<int>& waitedFor, bool anyOf) {
  checkStopped();
  throwDeferred();
  if (shm_) checkLocalPeers();
  // Between collectives (Executor::probeIdle): no data of a current collective waits unread.
  // A flag left by the last one made a peer that then died "had sent this rank data of this
  // collective, not yet read" while this rank created a group (found by a helper); data of
  // the next collective that did arrive is seen again by checkIdle.
  std::fill(early_.begin(), early_.end(), 0);
  // A closed connection or an abort frame throws; a goodbye marks it gone. Before the
  // heartbeats: a peer killed a while ago is silent too, but its closed socket says why.
  pollIdle();
  if (hb_ && opts_.heartbeatTimeoutSec > 0) {
    transport::PeerStatus s;
    int64_t age = 0;
    // Heard, silent since (a peer never heard from is not known yet here).
    const int p = silentPeer(false, &s, &age);
    if (p >= 0) throw PeerError(p, PeerCause::kSilent, silence(p, s, age));
  }
  // Ask the unwatched ones for heartbeats -- unless there are more of them than overlay
  // peers: a wait for many (a group's set-up) relies on the overlay, as asking them all
  // would cost every rank O(world) datagrams per period (found by a helper's review). A
  // receive from any of them asks them all: it looks at each of them anyway (the store,
  // its channel), and only it pays -- one ask each (a sender at the time has one asker
  // per receive waiting for it). Else a dead sender outside the overlay, whose neighbours
  // idled, was named by nobody until RINGREDUCE_TIMEOUT.
  size_t unwatched = 0;
  for (int p : waitedFor) unwatched += p >= 0 && p < world_ && p != rank_ && !watched(p);
  if (anyOf || unwatched <= std::max<size_t>(watchList_.size(), 1))
    for (int p : waitedFor)
      if (p >= 0 && p < world_ && p != rank_) checkUnwatched(p, false, anyOf);
  if (anyOf) {  // one that left is no failure (another may send): the caller passes it over
    for (int p : waitedFor)
      if (p >= 0 && p < world_ && p != rank_ && gone_[static_cast<size_t>(p)]) throwLeftAnyOf(p);
    return;
  }
  for (int p : waitedFor)
    if (p >= 0 && p < world_ && p != rank_ && gone_[static_cast<size_t>(p)]) throwLeft(p, "");
}

void Communicator::pollIdle() {
  pfds_.clear();
  pfdPeer_.clear();
  watchIdle(-1, -1);
  if (pfds_.empty() || ::poll(pfds_.data(), pfds_.size(), 0) <= 0) return;
  for (size_t i = 0; i < pfds_.size(); ++i) {
    if (!pfds_[i].revents) continue;
    if (pfdPeer_[i] == kListenerSlot)
      acceptDialler();
    else
      onIdleReadable(pfdPeer_[i]);
  }
}

void Communicator::sendRecv(int sendPeer, SendOp* s, int recvPeer, RecvOp* r) {
  bool sDone = s == nullptr, rDone = r == nullptr;
  while (!sDone || !rDone) {
    bool progressed = false;
    if (!sDone && progressSend(sendPeer, *s)) sDone = progressed = true;
    if (!rDone && progressRecv(recvPeer, *r)) rDone = progressed = true;
    if (!progressed && (!sDone || !rDone)) waitIo(sDone ? -1 : sendPeer, rDone ? -1 : recvPeer);
  }
}

void Communicator::checkLiveness(int sendPeer, int recvPeer, bool shm) {
  livenessAtMs_ = steadyMs();
  checkStopped();
  checkInterrupt();
  if (deadline_.expired()) timeout(sendPeer, recvPeer, shm);
  if (shm_) checkLocalPeers();
  checkGone();
  checkHeartbeats(recvPeer >= 0 ? recvPeer : sendPeer);
  for (int p : {recvPeer, sendPeer})
    if (p >= 0) {
      checkUnwatched(p, true);
      if (!shm && remoteOnConnection(p)) {  // a connection's wait (waitIo)
        checkStalledGoodbye(p);
        checkUndelivered(p);
      }
    }
}

void Communicator::markGone(int p) {
  if (gone_[static_cast<size_t>(p)]) return;
  gone_[static_cast<size_t>(p)] = 1;
  goneList_.push_back(p);
}

transport::Culprit Communicator::leftCulprit(int p) {
  const auto& c = conns_[static_cast<size_t>(p)];
  if (c && c->leftCulprit().rank >= 0) return c->leftCulprit();
  const int r = shm_ ? shm_->localIndex(p) : -1;
  return r >= 0 ? shm_->leftCulprit(r) : transport::Culprit{};
}

uint64_t Communicator::leftAfter(int p) const {
  const auto& c = conns_[static_cast<size_t>(p)];
  uint64_t seq = c ? c->leftAfter() : 0;
  const int r = shm_ ? shm_->localIndex(p) : -1;
  if (r >= 0 && shm_->leftOf(r)) seq = std::max(seq, shm_->leftAfter(r));
  return seq;
}

void Communicator::checkGone() {
  if (!begun_) return;
  for (int p : goneList_) {
    const uint64_t last = leftAfter(p);
    if (last < curHeader_.seq)  // every rank of a communicator takes part in each collective
      throwLeft(p, detail::concat(" after collective #", last, ", so it will never take part "
                                  "in ", describeCurrent(), " of rank ", label(rank_)));
  }
}

void Communicator::throwPeerAbort(int p, uint32_t code, const std::string& reason,
                                  transport::Culprit who) const {
  std::string msg = transport::abortText(label(p), peerHost(p), reason);
  switch (static_cast<transport::AbortCode>(code - 1)) {
    case transport::AbortCode::kMismatch: throw MismatchError(msg, p);
    case transport::AbortCode::kTimeout:  // where its wait chain ended (unless at us)
      throw TimeoutError(msg, -1, otherMember(who, p) ? who.rank : -1, p);
    case transport::AbortCode::kPeer:  // it lost a rank: name that one (unless it is us)
      if (knownCulprit(who, p))
        throw PeerError(who.rank, who.cause, msg, p, who.outside);
      [[fallthrough]];
    default: throw PeerError(p, PeerCause::kAborted, msg);
  }
}

std::string Communicator::leftWhy(int p) {
  const auto& c = conns_[static_cast<size_t>(p)];
  if (c && !c->leftWhy().empty()) return c->leftWhy();
  if (!shm_) return "";
  const int r = shm_->localIndex(p);
  return r >= 0 ? shm_->leftWhy(r) : std::string();
}

void Communicator::checkLocalPeers() {
  transport::shm::ShmDomain& d = *shm_;
  // A peer's own death first: a survivor that noticed it first publishes an abort naming it.
  auto skipped = [](const void* self, int r) {
    auto* c = static_cast<const Communicator*>(self);
    return c->probeSkipped(c->shm_->globalRank(r));
  };
  for (int r; procs_ && (r = procs_->exited(skipped, this)) >= 0;) {
    // One that said goodbye first and then ended is no failure (checkAlive says it left if
    // this rank waits for it); stop watching it, so that it cannot hide another's death.
    if (d.leftOf(r)) {
      procs_->forget(r);
      continue;
    }
    const int p = d.globalRank(r);
    // It failed, said why, and then ended (its destroy() after the failure): its reason
    // names the cause (a timeout, another rank's death), its exit only the consequence.
    std::string why;
    transport::Culprit who;
    // ... unless that cause is this rank's own failure, told back: then its exit is the news.
    const uint32_t code = d.abortOf(r, &why, &who);
    if (code && !toldBack(who, p)) throwPeerAbort(p, code, why, who);
    throw PeerError(p, PeerCause::kClosed, detail::concat(
        "rank ", label(p), " (", peerHost(p), ") exited ",
        code ? "after it failed too (" + why + ")" : "(its process is gone: crashed or killed)",
        " while rank ", label(rank_), " was in ", describeCurrent()));
  }
  std::string reason;
  for (int r = 0; r < d.world(); ++r) {
    if (r == d.rank()) continue;
    const int p = d.globalRank(r);
    if (probeSkipped(p)) continue;
    const auto& c = conns_[static_cast<size_t>(p)];
    if (c && c->fd() >= 0) continue;  // its connection says all this (abort frame, goodbye)
    transport::Culprit who;
    // A survivor of the loss that failed this communicator, saying so too, is alive: a wait
    // for it between collectives (a group's set-up after the failure) goes on.
    if (const uint32_t code = d.abortOf(r, &reason, &who); code && !toldBack(who, p))
      throwPeerAbort(p, code, reason, who);
    if (d.leftOf(r)) markGone(p);
  }
}

void Communicator::checkLocalAborts() {
  transport::shm::ShmDomain& d = *shm_;
  std::string why;
  transport::Culprit who;
  for (int r = 0; r < d.world(); ++r)
    if (r != d.rank())
      if (const uint32_t code = d.abortOf(r, &why, &who))
        throwPeerAbort(d.globalRank(r), code, why, who);
}

[[noreturn]] void Communicator::timeout(int sendPeer, int recvPeer, bool shm) {
  std::string who;
  auto name = [&](int p) { return detail::concat("rank ", label(p), " (", peerHost(p), ")"); };
  if (shm) who = detail::concat("waiting (shared memory) for rank ", label(recvPeer));
  else if (recvPeer >= 0) who = "waiting for data from " + name(recvPeer);
  if (sendPeer >= 0)
    who += (who.empty() ? "" : " and ") + std::string("waiting to send to ") + name(sendPeer);
  const int waited = recvPeer >= 0 ? recvPeer : sendPeer;
  int stuck = -1;
  const std::string diag = diagnosis(waited, &stuck);
  const char* hint =
      setupOf_ >= 0 ? " (in init's shared-memory set-up, within RINGREDUCE_CONNECT_TIMEOUT: is "
                      "that rank stuck or still starting?)"
      : callTimeoutSec_ >= 0 ? " (is that rank stuck, or did it skip this collective? the "
                               "timeout was this call's own, e.g. dist.barrier(timeout=))"
                             : " (is that rank stuck, or did it skip this collective? raise "
                               "timeout= or RINGREDUCE_TIMEOUT for slow steps)";
  throw TimeoutError(detail::concat("rank ", label(rank_), ": ", describeCurrent(),
                                    " timed out after ", curTimeoutSec_, " s ", who, diag, hint),
      waited, stuck);
}

}  // namespace rr::comm
