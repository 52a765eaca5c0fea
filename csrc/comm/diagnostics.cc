// Communicator diagnostics: what errors and stall reports say about the peers -- the wait
// chain (who waits for whom, from the heartbeats), which ranks are behind, what a peer was
// doing when last heard, the current collective -- and the heartbeat checks that turn a
// silent peer or a collective issued out of order into a typed error.
#include <cstdio>
#include <mutex>
#include <set>

#include "comm/communicator.h"
#include "comm/site.h"
#include "core/error.h"
#include "core/log.h"

namespace rr::comm {

namespace {
// ", pid 42" -- or nothing for a peer never heard from (its pid is not known).
std::string pidText(const transport::PeerStatus& s) {
  return s.pid ? detail::concat(", pid ", s.pid) : std::string();
}

// Whether this process has yet to say that heartbeats from `host` never arrive (once per
// host and process: every communicator and wait would say it again).
bool firstWordOn(const std::string& host) {
  static auto* mu = new std::mutex;  // never destroyed: threads may outlive exit's destructors
  static auto* said = new std::set<std::string>;
  std::lock_guard<std::mutex> g(*mu);
  return said->insert(host).second;
}
}  // namespace

bool Communicator::heartbeatsNeverCame(int peer) const {
  // Watched peers only: they heartbeat this rank from their start; a sparse world's others
  // only while asked, so one connected and never heard says nothing of the network (a
  // review: a frozen one went unnamed, with a false firewall warning).
  const int64_t limit = hbTimeoutMs();
  if (!watched(peer) || !conns_[static_cast<size_t>(peer)] || hb_->status(peer).ageMs >= 0 ||
      transport::livenessMs() - hbSinceMs_ <= limit)
    return false;
  const std::string host = peerHost(peer);
  for (int q = 0; q < world_; ++q)
    if (q != rank_ && q != peer && hb_->status(q).ageMs >= 0 && peerHost(q) == host)
      return false;  // datagrams from that host arrive: this one's silence is its own
  if (firstWordOn(host))
    RR_WARN("no heartbeat from host ", host, " (rank ", label(peer), ") has arrived since "
            "heartbeats started ", (transport::livenessMs() - hbSinceMs_) / 1000.0, " s ago, "
            "though its connection works: UDP from there to this rank's heartbeat port ",
            hb_->port(), " is dropped (a firewall passing TCP only?). Its ranks are not judged "
            "by heartbeats: one that freezes or is cut off is found by its connection or at "
            "RINGREDUCE_TIMEOUT. Allow UDP between the hosts, or set "
            "RINGREDUCE_HEARTBEAT_TIMEOUT=0 to turn the heartbeat check off");
  return true;
}

std::string Communicator::peerDoing(int peer, const transport::PeerStatus& s,
                                    const char* note) const {
  std::string site = hb_ ? hb_->site(peer) : std::string();
  // Blocked on another communicator of its process: groups called in different orders.
  std::string other = hb_ ? hb_->elsewhere(peer) : std::string();
  // Collectives this rank has finished since that report (fast ones run many per heartbeat
  // period): the state is older than "last heard" makes it look (found by a helper: a rank
  // killed after three quick all-reduces was "idle after collective #0"). Only a report
  // sent before this rank finished them: a fresh one of a rank really behind (a TCP
  // broadcast's root returns without waiting) is current.
  const bool stale = s.seq < finished_ && s.reportAgeMs > transport::livenessMs() - finishedAtMs_;
  return detail::concat(
      s.kind ? "at " : "idle after ",
      s.kind                ? kindName(static_cast<CollectiveKind>(s.kind), -1)
      : opts_.p2pChannel ? "message"
                            : "collective",
      " #", s.seq,
      s.kind ? detail::concat(" with ", s.bytesDone >> 10, " KiB received") : std::string(),
      // Heard since on another communicator of its process: this state may be stale.
      s.reportAgeMs > s.ageMs + 200 ? detail::concat(" (as of its report ", s.reportAgeMs / 1000.0,
                                                     " s earlier)")
      : stale ? detail::concat(" (as of its last report; this rank has finished #", finished_,
                               " since)")
              : std::string(),
      note,
      other.empty() ? std::string() : ", meanwhile in " + other + " (on another communicator)",
      site.empty() ? std::string() : "; last call site " + site);
}

std::string Communicator::waitChain(int first, int* end) {
  *end = -1;
  if (!hb_ || first < 0 || first >= world_) return "";
  std::string chain = detail::concat("; wait chain: rank ", label(rank_));
  std::vector<uint8_t> seen(static_cast<size_t>(world_), 0);
  seen[static_cast<size_t>(rank_)] = 1;
  for (int p = first;;) {
    chain += detail::concat(" -> rank ", label(p));
    seen[static_cast<size_t>(p)] = 1;
    *end = p;
    // An unwatched peer only while it answers this rank's asks (else its state is stale).
    const transport::PeerStatus st = hb_->status(p);
    if (!watched(p) && !(hb_->reaches(p) && st.ageMs >= 0 &&
                         st.ageMs < hbTimeoutMs())) {
      *end = -1;  // unknown: not a rank the chain shows stuck
      return chain + " (not among the peers this rank watches)";
    }
    const transport::PeerStatus& s = st;
    if (s.ageMs < 0)
      return chain + (heartbeatsNeverCame(p)
                          ? " (never heard from: heartbeats from its host do not arrive)"
                          : " (never heard from)");
    if (s.kind == 0 || s.seq != seq_)
      return chain + detail::concat(" (not in this collective: ", peerDoing(p, s), ")");
    if (s.waitingFor < 0 || s.waitingFor >= world_)
      return chain + detail::concat(" (", peerDoing(p, s, " and waits for no rank: stuck outside "
                                                          "communication, e.g. in a callback, a "
                                                          "signal handler or a hung device"), ")");
    if (seen[static_cast<size_t>(s.waitingFor)]) {
      *end = -1;  // every rank of a cycle waits for the next: none is the one stuck
      // Each in this collective, waiting for the next: no rank runs it as the others do
      // (a helper found tree against shared memory at 3 and 5 ranks: no frame to compare).
      return chain + detail::concat(" -> rank ", label(s.waitingFor),
                                    " (a cycle within this collective; likely causes: ranks "
                                    "running different algorithms -- their algo= differs -- or "
                                    "disagreeing on its arguments, a network that stalls their "
                                    "data, or a timeout too short for it)");
    }
    p = s.waitingFor;
  }
}

std::string Communicator::diagnosis(int waitingFor, int* stuck) {
  int end = -1;
  std::string chain = waitChain(waitingFor, &end);
  if (stuck != nullptr) *stuck = end;
  return chain + behindSummary(end);
}

std::string Communicator::behindSummary(int exclude) {
  if (!hb_) return "";
  std::string behind;
  for (int p : watchList_) {
    if (p == exclude) continue;
    transport::PeerStatus s = hb_->status(p);
    if (s.ageMs >= 0 && (s.seq < seq_ || (s.seq == seq_ && s.kind == 0)))
      behind += detail::concat(behind.empty() ? "" : ", ", "rank ", label(p), " (", peerDoing(p, s), ")");
  }
  return behind.empty() ? "" : "; by their heartbeats, ranks not in this collective yet: " + behind;
}

void Communicator::reportStall(int64_t waitedMs, int64_t idleMs, int waitingFor) {
  // Who is behind? Heartbeats carry every peer's collective sequence number and call site.
  std::string behind, ahead;
  int nAhead = 0;
  std::vector<uint8_t> isBehind(static_cast<size_t>(world_), 0);
  for (int p : watchList_) {
    transport::PeerStatus s = hb_->status(p);
    if (s.seq < seq_ || (s.seq == seq_ && s.kind == 0 && s.bytesDone == 0)) {
      isBehind[static_cast<size_t>(p)] = 1;
      behind += detail::concat(behind.empty() ? "" : "; ", "rank ", label(p), " (", peerHost(p),
                               pidText(s), ") is ", peerDoing(p, s));
    } else {
      ahead += detail::concat(nAhead++ ? ", " : "", label(p));
    }
  }
  int end = -1;
  std::string chain = waitChain(waitingFor, &end);
  if (end >= 0 && isBehind[static_cast<size_t>(end)]) chain.clear();  // named above already
  std::string here;
  if (!behind.empty())
    here = detail::concat("; others (", nAhead ? (nAhead == 1 ? "rank " : "ranks ") + ahead + " and "
                                               : std::string(),
                          "this rank) at ", kindName(curKind_, curHeader_.root), " #", seq_);
  // Reported once nothing moved for RINGREDUCE_STALL_WARN: a collective that had moved data
  // (this rank's bytes: the peer's sequence number, also counted as movement, changes at
  // every collective's start) says for how long nothing has -- its wait is longer.
  std::string idle;
  if (bytesDone_ > 0)
    idle = detail::concat("; no data moved for ", idleMs / 1000.0, " s");
  RR_WARN("stall: rank ", label(rank_), " has waited ", waitedMs / 1000.0, " s in ", describeCurrent(),
          idle, "; ", behind.empty() ? std::string("no rank reports being behind") : behind, here, chain,
          " (a rank stuck in user code, or one that skipped this collective?)");
}

void Communicator::checkHeartbeats(int waitingFor) {
  if (!hb_) return;
  const int64_t now = steadyMs();
  // Data moved by this rank or by the one it waits for, in this collective or (behind) in
  // an earlier one: a sender waits while its receiver reads the buffer in place; a small
  // collective's rank waits for one still receiving the last large one over a slow link.
  uint64_t moved = bytesDone_;
  if (waitingFor >= 0 && waitingFor < world_) {
    const transport::PeerStatus s = hb_->status(waitingFor);
    moved += s.bytesDone + (s.seq << 40);
  }
  if (moved != movedBytes_) {
    movedBytes_ = moved;
    movedMs_ = now;
  }
  if (!stallReported_ && opts_.stallWarnSec > 0 && beganMs_ > 0 &&
      now - std::max(beganMs_, movedMs_) > static_cast<int64_t>(opts_.stallWarnSec * 1000)) {
    stallReported_ = true;
    reportStall(now - beganMs_, now - std::max(beganMs_, movedMs_), waitingFor);
  }
  // A peer whose heartbeat shows it in this very collective number but a different
  // collective has issued the collectives in another order: no data need ever cross for
  // that (both may wait to receive), so this is the only way to see it before the timeout.
  for (int p : watchList_) {
    if (gone_[static_cast<size_t>(p)]) continue;
    transport::PeerStatus s = hb_->status(p);
    if (s.ageMs >= 0 && s.seq == seq_ && s.kind != 0 && s.kind != static_cast<uint8_t>(curKind_))
      throw MismatchError(detail::concat(
          "collective mismatch: rank ", label(p), " (", peerHost(p), ") is in ",
          kindName(static_cast<CollectiveKind>(s.kind), -1), " #", s.seq, " while rank ",
          label(rank_), " is in ", kindName(curKind_, curHeader_.root), " #", seq_,
          " (every rank must issue the same collectives in the same order)"), -1, p);
    // The same rooted collective with another root: in a tree every rank may wait to
    // receive from a child the other's tree does not have (TCP reduce, gather, scatter).
    if (s.ageMs >= 0 && s.seq == seq_ && s.kind == static_cast<uint8_t>(curKind_) &&
        s.root >= 0 && s.root != curHeader_.root)
      throw MismatchError(detail::concat(
          "root mismatch in ", toString(curKind_), " #", seq_, ": rank ", label(p), " (",
          peerHost(p), ") has root rank ", label(s.root), ", rank ", label(rank_),
          " has root rank ", label(curHeader_.root),
          " (every rank must pass the same src/dst to a rooted collective)"), -1, p);
    // The same collective by another algorithm (algo= per call): over shared memory and
    // TCP no frame is compared, and each waits for the other (named only at the timeout).
    if (s.ageMs >= 0 && s.seq == seq_ && s.kind == static_cast<uint8_t>(curKind_) &&
        s.algo >= 0 && s.algo != static_cast<int>(curHeader_.algo))
      throw MismatchError(detail::concat(
          "algorithm mismatch in ", kindName(curKind_, curHeader_.root), " #", seq_, ": rank ",
          label(p), " (", peerHost(p), ") runs ", toString(static_cast<Algorithm>(s.algo)),
          ", rank ", label(rank_), " runs ", toString(static_cast<Algorithm>(curHeader_.algo)),
          " (pass the same algo= on every rank)"), -1, p);
  }
  if (opts_.heartbeatTimeoutSec <= 0) return;
  transport::PeerStatus s;
  int64_t age = 0;
  const int p = silentPeer(true, &s, &age);
  if (p < 0) return;
  std::string doing = s.ageMs < 0 ? std::string("never heard from")
                                  : "at its last heartbeat it was " + peerDoing(p, s);
  throw PeerError(p, PeerCause::kSilent, detail::concat(
      silence(p, s, age), "; ", doing, "; rank ", label(rank_), " was in ", describeCurrent(),
      waitingFor >= 0 ? detail::concat(" waiting for rank ", label(waitingFor)) : std::string()));
}

int Communicator::silentPeer(bool neverHeard, transport::PeerStatus* s, int64_t* ageMs) const {
  const int64_t limit = hbTimeoutMs();
  const int64_t sinceStart = transport::livenessMs() - hbSinceMs_;
  for (int p : watchList_) {
    if (gone_[static_cast<size_t>(p)] || probeSkipped(p)) continue;
    *s = hb_->status(p);
    if (s->ageMs < 0 && !neverHeard) continue;
    *ageMs = s->ageMs >= 0 ? s->ageMs : sinceStart;
    // One that said goodbye (destroy()) is silent by design; if this rank waits for it, its
    // connection or shared memory says it left.
    if (*ageMs > limit && !s->left && !(s->ageMs < 0 && heartbeatsNeverCame(p))) return p;
  }
  return -1;
}

bool Communicator::remoteOnConnection(int peer) const {
  return hb_ && opts_.heartbeatTimeoutSec > 0 && !gone_[static_cast<size_t>(peer)] &&
         conns_[static_cast<size_t>(peer)] && !(shm_ && shm_->localIndex(peer) >= 0);
}

void Communicator::checkStalledGoodbye(int peer) {
  // Its goodbye comes on its connection after everything it sent; its heartbeat's goodbye
  // (UDP) came, but nothing has come on the connection for as long (TCP retransmitting into
  // a one-way partition): the rank waited for RINGREDUCE_TIMEOUT and then blamed a wait
  // chain ending at the departed rank (a helper's network-fault hunt). A local peer's
  // shared memory and process say more (checkLocalPeers).
  const int64_t limit = hbTimeoutMs();
  const int64_t quiet = steadyMs() - ioWaitSinceMs_;
  const transport::PeerStatus s = hb_->status(peer);
  if (!s.left || s.ageMs <= limit || quiet <= limit) return;
  throw PeerError(peer, PeerCause::kNetwork, detail::concat(
      "rank ", label(peer), " (", peerHost(peer), ") said goodbye by heartbeat ",
      s.ageMs / 1000.0, " s ago, but nothing has arrived on its connection for ",
      quiet / 1000.0, " s while rank ", label(rank_), " waited for it in ", describeCurrent(),
      ": the network between the two hosts stalls its traffic (one way or both), and what it "
      "said last (its goodbye, or why it failed) is lost"));
}

void Communicator::checkUndelivered(int peer) {
  // Found by a helper's network-fault hunt: with an MTU black hole both ranks wait for each
  // other's data while every heartbeat arrives, and the wait chain blamed a healthy rank at
  // RINGREDUCE_TIMEOUT. Twice the heartbeat timeout: TCP recovers ordinary loss far sooner.
  transport::tcp::SendBacklog b;
  if (!transport::tcp::sendBacklog(conns_[static_cast<size_t>(peer)]->fd(), &b)) return;
  if (lossSince_.size() != static_cast<size_t>(world_)) lossSince_.assign(world_, {0, 0});
  auto& since = lossSince_[static_cast<size_t>(peer)];
  const int64_t now = steadyMs();
  if (b.queuedBytes == 0 || b.retransmits == 0) {
    since = {0, 0};
    return;
  }
  // A new episode: another collective, or an acknowledgement since the one recorded (one
  // that recovered unseen, then a long idle: one RTO would have fired; a review).
  if (since.first != seq_ || since.second == 0 || now - b.sinceAckMs > since.second)
    since = {seq_, now};
  const int64_t limit = 2 * hbTimeoutMs();
  const transport::PeerStatus s = hb_->status(peer);
  // Not heard lately, or gone: the heartbeat checks and checkStalledGoodbye say more.
  if (now - since.second <= limit || b.sinceAckMs <= limit || s.ageMs < 0 ||
      s.ageMs > limit / 2 || s.left)
    return;
  throw PeerError(peer, PeerCause::kNetwork, detail::concat(
      "the network loses what rank ", label(rank_), " sends to rank ", label(peer), " (",
      peerHost(peer), pidText(s), "): ", b.queuedBytes >> 10, " KiB queued on its connection "
      "are unacknowledged, the last acknowledgement ", b.sinceAckMs / 1000.0,
      " s ago (TCP retransmitted ", b.retransmits, " times) while its heartbeats arrive (last ",
      s.ageMs / 1000.0, " s ago; it was ", peerDoing(peer, s), "), in ", describeCurrent(),
      ". Full-size packets lost and small ones passing is an MTU mismatch on the path (jumbo "
      "frames on one side: compare `ip link` MTUs, try `ping -M do -s <MTU-28> ",
      peerHost(peer), "`); else traffic is lost one way"));
}

void Communicator::checkUnwatched(int peer, bool inCollective, bool leftOk) {
  if (!hb_ || opts_.heartbeatTimeoutSec <= 0 || watched(peer) || gone_[static_cast<size_t>(peer)])
    return;
  const int64_t asking = hb_->want(peer);
  const transport::PeerStatus s = hb_->status(peer);
  if (s.left) {
    // Its goodbye: unconnected, it never sends this rank anything again (connected, its
    // connection says it left, after whatever it sent -- but between collectives only the
    // overlay's connections are read: a receive from any rank, whose messages travel on
    // their own channels, passes it over either way; found by a review).
    if (leftOk) throwLeftAnyOf(peer);
    if (!conns_[static_cast<size_t>(peer)]) {
      throwLeft(peer, inCollective ? detail::concat(" while rank ", label(rank_),
                                                    " waited for it in ", describeCurrent())
                                   : std::string());
    }
    return;
  }
  const int64_t age = s.ageMs >= 0 ? std::min(s.ageMs, asking) : asking;
  if (age <= hbTimeoutMs()) return;
  const std::string last =
      s.ageMs >= 0 ? "; at its last heartbeat it was " + peerDoing(peer, s) : std::string();
  // Silent: gone (its listener, open until its communicator is destroyed or fails,
  // refuses) or frozen (it accepts). Only without a connection (a connected one's EOF says
  // "gone"), and while this communicator has not failed (probed once, not per probe) -- or
  // for a receive from any rank, which asks each sender once however its world fares (a
  // sender killed meanwhile was called "silent" at 32 ranks once the world had failed).
  auto fail = [leftOk](int p, PeerCause cause, std::string msg) {
    if (leftOk) throw UnansweredError(p, cause, msg);
    throw PeerError(p, cause, msg);
  };
  if (dialer_ && (leftOk || dialer_->listenFd() >= 0) && !conns_[static_cast<size_t>(peer)] &&
      dialer_->refuses(peer, 1.0))
    fail(peer, PeerCause::kClosed, detail::concat(
        "rank ", label(peer), " (", peerHost(peer), pidText(s), ") is gone: it answered no "
        "heartbeat for ", age / 1000.0, " s while rank ", label(rank_), " waited for it, and "
        "nothing listens at its address any more (it exited, crashed, or destroyed its "
        "communicator, or that failed)", last));
  fail(peer, PeerCause::kSilent, detail::concat(
      "rank ", label(peer), " (", peerHost(peer), pidText(s),
      ") stopped responding: no heartbeat for ", age / 1000.0, " s while rank ", label(rank_),
      " waited for it (process frozen or stopped, host overloaded or down, or network "
      "partition)", last));
}

std::string Communicator::silence(int peer, const transport::PeerStatus& s,
                                  int64_t ageMs) const {
  return detail::concat("rank ", label(peer), " (", peerHost(peer), pidText(s),
                        ") stopped responding: no heartbeat for ", ageMs / 1000.0,
                        " s (process frozen or stopped, host overloaded, or network partition)");
}

std::string Communicator::peerContext(int peer) const {
  if (!hb_ || peer < 0 || peer >= world_ || peer == rank_) return "";
  transport::PeerStatus s = hb_->status(peer);
  if (s.ageMs < 0) return "";
  // Its goodbye is newer than its last heartbeat (0.5 s apart): it left after that one.
  const uint64_t left = leftAfter(peer);
  if (left > s.seq || (left == s.seq && left > 0 && s.kind)) {
    s.seq = left;
    s.kind = 0;
    s.reportAgeMs = s.ageMs;
  }
  return detail::concat("; rank ", label(peer), " (pid ", s.pid, ") was last heard ", s.ageMs / 1000.0,
                        " s earlier, ", peerDoing(peer, s));
}

const char* Communicator::kindName(CollectiveKind k, int root) const {
  return rr::kindName(k, opts_.p2pChannel, root, rank_);
}

std::string Communicator::describeCurrent() const {
  const char* kind = kindName(curKind_, curHeader_.root);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s #%llu%s%s (%s, %.1f MiB received, buffer %.1f MiB)",
                kind,
                static_cast<unsigned long long>(seq_), opts_.groupName.empty() ? "" : " on ",
                opts_.groupName.c_str(), toString(curAlgo_),
                static_cast<double>(bytesDone_) / 1048576.0,
                static_cast<double>(bytesTotal_) / 1048576.0);
  return buf + siteText_;
}

}  // namespace rr::comm
