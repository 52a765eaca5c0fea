#include "comm/communicator.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/site.h"
#include "core/error.h"
#include "core/log.h"

namespace rr::comm {

namespace {
constexpr size_t kSpinMaxBytes = 256 * 1024;
}  // namespace

Communicator::Communicator(int rank, int world, std::vector<std::unique_ptr<Connection>> conns,
                           Options opts)
    : rank_(rank), world_(world), conns_(std::move(conns)), opts_(opts) {
  RR_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "rank ", rank_, " world ", world_);
  RR_CHECK_EQ(conns_.size(), static_cast<size_t>(world_), "one connection slot per rank");
  if (!opts_.rankLabels.empty())
    RR_CHECK_EQ(opts_.rankLabels.size(), static_cast<size_t>(world_), "rank_labels: one per rank");
  for (size_t p = 0; p < conns_.size(); ++p) {
    if (!conns_[p]) continue;
    conns_[p]->setChecksum(opts_.checksum);
    conns_[p]->setLabel(label(static_cast<int>(p)));
  }
  early_.assign(static_cast<size_t>(world_), 0);
  gone_.assign(static_cast<size_t>(world_), 0);
  watch_.assign(static_cast<size_t>(world_), 1);
  watch_[static_cast<size_t>(rank_)] = 0;
  for (int p = 0; p < world_; ++p)
    if (p != rank_) watchList_.push_back(p);
  wakeFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeFd_ < 0) RR_THROW(Error, "eventfd failed: ", std::strerror(errno));
  pfds_.reserve(static_cast<size_t>(world_) + 1);
  pfdPeer_.reserve(static_cast<size_t>(world_) + 1);
}

Communicator::~Communicator() {
  if (hb_) hb_->stop();
  for (auto& c : conns_)
    if (c) c->close();
  if (wakeFd_ >= 0) ::close(wakeFd_);
}

void Communicator::checkUsable() const {
  if (aborted_.load())
    RR_THROW(Error, destroying_.load() ? "communicator was destroyed; call ringreduce.init() again"
                                       : "communicator was aborted; destroy it and init again");
  if (!failure_.empty())
    RR_THROW(Error, "communicator is unusable after an earlier failure: ", failure_,
             " -- destroy it and init again");
}

static int64_t steadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

FrameHeader Communicator::begin(CollectiveKind kind, DataType dtype, ReduceOp op, int root,
                                Algorithm algo, size_t count, size_t bytesTotal) {
  checkUsable();
  FrameHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.dtype = static_cast<uint8_t>(dtype);
  h.op = static_cast<uint8_t>(op);
  h.algo = static_cast<uint8_t>(algo);
  h.seq = ++seq_;
  h.root = root;
  h.count = count;
  curKind_ = kind;
  curAlgo_ = algo;
  curHeader_ = h;
  bytesTotal_ = bytesTotal;
  bytesDone_ = 0;
  std::fill(early_.begin(), early_.end(), 0);
  const auto now = Deadline::Clock::now();  // one clock read for deadline, stall, recorder
  deadline_ = Deadline::after(now, opts_.timeoutSec);
  stallReported_ = false;
  faultWaited_ = false;
  if (hb_) {
    hb_->setState(h.kind, h.seq, 0);
    beganMs_ = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch())
                   .count();
  }
  Record rec;
  rec.seq = h.seq;
  rec.kind = h.kind;
  rec.dtype = h.dtype;
  rec.op = h.op;
  rec.algo = h.algo;
  rec.root = root;
  rec.count = count;
  rec.bytes = bytesTotal;
  rec.site = site_;
  recorder_.start(rec, now);
  if (fault_.armed) maybeFault(FaultPlan::Point::kBegin);
  return h;
}

void Communicator::setSite(uint32_t site) {
  if (site == site_) return;
  site_ = site;
  std::string name = siteName(site);
  siteText_ = name.empty() ? std::string() : " called from " + name;
  if (hb_) hb_->setSite(name);
}

void Communicator::maybeFault(FaultPlan::Point p) {
  const auto kind = static_cast<uint8_t>(curKind_);
  bool hit = fault_.matches(kind, seq_, p) ||
             // kMid in a collective that never had to wait: at its end.
             (p == FaultPlan::Point::kEnd && !faultWaited_ &&
              fault_.matches(kind, seq_, FaultPlan::Point::kMid));
  if (!hit) return;
  fault_.armed = false;  // one fault per process
  fireFault(fault_, rank_, describeCurrent().c_str());
}

std::string Communicator::peerDoing(int peer, const transport::PeerStatus& s,
                                    const char* note) const {
  std::string site = hb_ ? hb_->site(peer) : std::string();
  return detail::concat(
      s.kind ? "at " : "idle after ",
      s.kind ? toString(static_cast<CollectiveKind>(s.kind)) : "collective", " #", s.seq,
      s.kind ? detail::concat(" with ", s.bytesDone >> 10, " KiB received") : std::string(), note,
      site.empty() ? std::string() : "; last call site " + site);
}

void Communicator::setHeartbeat(std::unique_ptr<transport::Heartbeat> hb) {
  hb_ = std::move(hb);
  hbSinceMs_ = steadyMs();
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
    if (!watched(p)) return chain + " (not among the peers this rank watches)";
    transport::PeerStatus s = hb_->status(p);
    if (s.ageMs < 0) return chain + " (never heard from)";
    if (s.kind == 0 || s.seq != seq_)
      return chain + detail::concat(" (not in this collective: ", peerDoing(p, s), ")");
    if (s.waitingFor < 0 || s.waitingFor >= world_)
      return chain + detail::concat(" (", peerDoing(p, s, " and waits for no rank: stuck outside "
                                                          "communication, e.g. in a callback, a "
                                                          "signal handler or a hung device"), ")");
    if (seen[static_cast<size_t>(s.waitingFor)])
      return chain + detail::concat(" -> rank ", label(s.waitingFor), " (a cycle)");
    p = s.waitingFor;
  }
}

std::string Communicator::diagnosis(int waitingFor) {
  int end = -1;
  std::string chain = waitChain(waitingFor, &end);
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

void Communicator::reportStall(int64_t waitedMs, int waitingFor) {
  // Who is behind? Heartbeats carry every peer's collective sequence number and call site.
  std::string behind, ahead;
  int nAhead = 0;
  std::vector<uint8_t> isBehind(static_cast<size_t>(world_), 0);
  for (int p : watchList_) {
    transport::PeerStatus s = hb_->status(p);
    if (s.seq < seq_ || (s.seq == seq_ && s.kind == 0 && s.bytesDone == 0)) {
      isBehind[static_cast<size_t>(p)] = 1;
      behind += detail::concat(behind.empty() ? "" : "; ", "rank ", label(p), " (", peerHost(p),
                               ", pid ", s.pid, ") is ", peerDoing(p, s));
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
                          "this rank) at ", toString(curKind_), " #", seq_);
  RR_WARN("stall: rank ", rank_, " has waited ", waitedMs / 1000.0, " s in ", describeCurrent(),
          "; ", behind.empty() ? std::string("no rank reports being behind") : behind, here, chain,
          " (a rank stuck in user code, or one that skipped this collective?)");
}

void Communicator::checkHeartbeats(int waitingFor) {
  if (!hb_) return;
  const int64_t now = steadyMs();
  if (!stallReported_ && opts_.stallWarnSec > 0 && beganMs_ > 0 &&
      now - beganMs_ > static_cast<int64_t>(opts_.stallWarnSec * 1000)) {
    stallReported_ = true;
    reportStall(now - beganMs_, waitingFor);
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
          toString(static_cast<CollectiveKind>(s.kind)), " #", s.seq, " while rank ", label(rank_),
          " is in ", toString(curKind_), " #", seq_,
          " (every rank must issue the same collectives in the same order)"));
  }
  if (opts_.heartbeatTimeoutSec <= 0) return;
  const int64_t limit = static_cast<int64_t>(opts_.heartbeatTimeoutSec * 1000);
  const int64_t sinceStart = now - hbSinceMs_;
  for (int p : watchList_) {
    if (gone_[static_cast<size_t>(p)]) continue;
    transport::PeerStatus s = hb_->status(p);
    int64_t age = s.ageMs >= 0 ? s.ageMs : sinceStart;
    if (age <= limit) continue;
    std::string doing = s.ageMs < 0 ? std::string("never heard from")
                                    : "at its last heartbeat it was " + peerDoing(p, s);
    throw PeerError(p, PeerCause::kSilent, detail::concat(
        "rank ", label(p), " (", peerHost(p), ", pid ", s.pid, ") stopped responding: no heartbeat for ",
        age / 1000.0, " s (process frozen or stopped, host overloaded, or network partition); ",
        doing, "; rank ", label(rank_), " was in ", describeCurrent(),
        waitingFor >= 0 ? detail::concat(" waiting for rank ", label(waitingFor)) : std::string()));
  }
}

std::string Communicator::peerContext(int peer) const {
  if (!hb_ || peer < 0 || peer >= world_ || peer == rank_) return "";
  transport::PeerStatus s = hb_->status(peer);
  if (s.ageMs < 0) return "";
  return detail::concat("; rank ", label(peer), " (pid ", s.pid, ") was last heard ", s.ageMs / 1000.0,
                        " s earlier, ", peerDoing(peer, s));
}

std::string Communicator::describeCurrent() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s #%llu%s%s (%s, %.1f MiB received, buffer %.1f MiB)",
                toString(curKind_),
                static_cast<unsigned long long>(seq_), opts_.groupName.empty() ? "" : " on ",
                opts_.groupName.c_str(), toString(curAlgo_),
                static_cast<double>(bytesDone_) / 1048576.0,
                static_cast<double>(bytesTotal_) / 1048576.0);
  return buf + siteText_;
}

void Communicator::waitIo(int sendPeer, int recvPeer) {
  noteWait();
  pfds_.clear();
  pfdPeer_.clear();
  pfds_.push_back({wakeFd_, POLLIN, 0});
  pfdPeer_.push_back(-1);
  // The peers this step moves data with (connected by the caller's progress calls).
  if (sendPeer >= 0) {
    pfds_.push_back({conn(sendPeer).fd(), static_cast<short>(sendPeer == recvPeer ? POLLOUT | POLLIN : POLLOUT), 0});
    pfdPeer_.push_back(sendPeer);
  }
  if (recvPeer >= 0 && recvPeer != sendPeer) {
    pfds_.push_back({conn(recvPeer).fd(), POLLIN, 0});
    pfdPeer_.push_back(recvPeer);
  }
  watchIdle(sendPeer, recvPeer);
  // The heartbeat thread names the peer we wait for in its stall reports (pollWaits wakes
  // at least every 250 ms to check heartbeats).
  const int waitingFor = recvPeer >= 0 ? recvPeer : sendPeer;
  if (hb_) hb_->setWaiting(waitingFor);
  // Spin phase (see Options::spinUs), for latency-bound collectives only: a large transfer
  // waits often and amortises wake-ups, and spinning would take CPU from the network stack.
  if (spinAllowed_ && opts_.spinUs > 0 && bytesTotal_ <= kSpinMaxBytes) {
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::nanoseconds(static_cast<int64_t>(opts_.spinUs * 1000));
    do {
      if (::poll(pfds_.data(), pfds_.size(), 0) > 0) break;
    } while (std::chrono::steady_clock::now() < until);
  }
  while (true) {
    const int n = pollWaits();
    if (n == 0) {
      if (deadline_.expired()) timeout(sendPeer, recvPeer);
      checkHeartbeats(waitingFor);
      continue;
    }
    bool ready = false;
    for (size_t i = 1; i < pfds_.size(); ++i) {
      if (!pfds_[i].revents) continue;
      int p = pfdPeer_[i];
      if (p == sendPeer || p == recvPeer) {
        ready = true;  // progress calls will surface errors on this connection
      } else if (p == kListenerSlot) {
        acceptDialler();
      } else {
        onIdleReadable(p);  // throws on EOF / abort; otherwise stop watching this peer
        pfds_[i].events = 0;
      }
    }
    if (ready) return;
  }
}

int Communicator::pollWaits() {
  while (true) {
    int ms = deadline_.pollMs();
    if (hb_ && ms > 250) ms = 250;  // wake to look at heartbeats while waiting
    int n = ::poll(pfds_.data(), pfds_.size(), ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      RR_THROW(Error, "poll failed: ", std::strerror(errno));
    }
    if (aborted_.load()) throwAborted();
    return n;
  }
}

void Communicator::watchIdle(int sendPeer, int recvPeer) {
  for (int p : watchList_) {
    if (p == sendPeer || p == recvPeer) continue;
    if (early_[static_cast<size_t>(p)] || gone_[static_cast<size_t>(p)]) continue;
    const auto& c = conns_[static_cast<size_t>(p)];
    if (!c) continue;
    pfds_.push_back({c->fd(), POLLIN, 0});  // watch for death/abort
    pfdPeer_.push_back(p);
  }
  if (dialer_ && dialer_->listenFd() >= 0) {
    pfds_.push_back({dialer_->listenFd(), POLLIN, 0});
    pfdPeer_.push_back(kListenerSlot);
  }
}

void Communicator::onIdleReadable(int p) {
  if (conn(p).checkIdle(&curHeader_) == Connection::Idle::kGoodbye)
    gone_[static_cast<size_t>(p)] = 1;
  else
    early_[static_cast<size_t>(p)] = 1;
}

void Communicator::checkAlive(int peer) {
  noteWait();
  if (hb_ && peer >= 0) hb_->setWaiting(peer);
  if (aborted_.load()) throwAborted();
  if (deadline_.expired()) {
    RR_THROW(TimeoutError, "rank ", label(rank_), ": ", describeCurrent(), " timed out after ",
             opts_.timeoutSec, " s waiting (shared memory) for rank ", label(peer), diagnosis(peer),
             " (is that rank stuck, or did it skip this collective? raise timeout= or "
             "RINGREDUCE_TIMEOUT for slow steps)");
  }
  if (peer >= 0 && gone_[static_cast<size_t>(peer)])
    throw PeerError(peer, PeerCause::kLeft, detail::concat("rank ", label(peer), " (", peerHost(peer),
                                         ") left the job (destroy() or normal exit) while rank ",
                                         label(rank_), " waited for it in ", describeCurrent()));
  pfds_.clear();
  pfdPeer_.clear();
  watchIdle(-1, -1);
  checkHeartbeats(peer);
  if (pfds_.empty() || ::poll(pfds_.data(), pfds_.size(), 0) <= 0) return;
  for (size_t i = 0; i < pfds_.size(); ++i) {
    if (!pfds_[i].revents) continue;
    if (pfdPeer_[i] == kListenerSlot)
      acceptDialler();
    else if (conn(pfdPeer_[i]).checkIdle(&curHeader_) == Connection::Idle::kGoodbye)
      gone_[static_cast<size_t>(pfdPeer_[i])] = 1;
  }
}

void Communicator::sendRecv(int sendPeer, SendOp* s, int recvPeer, RecvOp* r) {
  bool sDone = s == nullptr, rDone = r == nullptr;
  while (!sDone || !rDone) {
    bool progressed = false;
    if (!sDone && progressSend(sendPeer, *s)) sDone = progressed = true;
    if (!rDone && conn(recvPeer).progressRecv(*r)) {
      rDone = progressed = true;
      bytesDone_ += r->len;
    }
    if (!progressed && (!sDone || !rDone)) waitIo(sDone ? -1 : sendPeer, rDone ? -1 : recvPeer);
  }
}

[[noreturn]] void Communicator::timeout(int sendPeer, int recvPeer) {
  std::string who;
  auto name = [&](int p) { return detail::concat("rank ", label(p), " (", peerHost(p), ")"); };
  if (recvPeer >= 0) who = "waiting for data from " + name(recvPeer);
  if (sendPeer >= 0)
    who += (who.empty() ? "" : " and ") + std::string("waiting to send to ") + name(sendPeer);
  RR_THROW(TimeoutError, "rank ", label(rank_), ": ", describeCurrent(), " timed out after ",
           opts_.timeoutSec, " s ", who, diagnosis(recvPeer >= 0 ? recvPeer : sendPeer),
           " (is that rank stuck, or did it skip this collective? raise timeout= or "
           "RINGREDUCE_TIMEOUT for slow steps)");
}

void Communicator::poison(const std::string& reason, transport::AbortCode code) {
  if (!failure_.empty()) return;
  failure_ = reason;
  if (!flightPath_.empty()) {
    std::string path = flightPath_ + ".rank" + std::to_string(rank_) + ".json";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::string r = jsonEscape(reason);
      std::fprintf(f, "{\"rank\": %d, \"world\": %d, \"error\": \"%s\",\n \"last_collectives\": %s}\n",
                   rank_, world_, r.c_str(), recordsToJson(recorder_.flight()).c_str());
      std::fclose(f);
      RR_WARN("flight recorder written to ", path);
    }
  }
  if (dialer_) dialer_->close();
  const std::string& msg = reason;  // receivers prefix "rank <us> (<host>) failed: "
  for (auto& c : conns_) {
    if (!c) continue;
    c->sendAbort(code, msg);
    c->close();
  }
}

void Communicator::farewell() {
  if (dialer_) dialer_->close();
  if (poisoned() || aborted_.load()) return;
  for (auto& c : conns_) {
    if (!c) continue;
    c->sendGoodbye();
    c->close();
  }
}

void Communicator::throwAborted() const {
  if (destroying_.load())
    RR_THROW(Error, "communicator was destroyed (ringreduce.destroy() on another thread) during ",
             describeCurrent(), "; the collective did not complete on this rank");
  RR_THROW(Error, "communicator aborted during ", describeCurrent());
}

void Communicator::abort(bool destroying) {
  if (destroying) destroying_.store(true);
  aborted_.store(true);
  uint64_t one = 1;
  ssize_t w = ::write(wakeFd_, &one, sizeof(one));
  (void)w;
}

}  // namespace rr::comm
