#include "comm/communicator.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "comm/site.h"
#include "core/error.h"
#include "core/log.h"

namespace rr::comm {

namespace {
// The first failure of any communicator of this process (poison()): a communicator that
// later leaves normally (destroy()) tells its peers, so a rank waiting for this one learns
// why it left -- e.g. the rank whose death made it fail -- not only that it did.
// Only a failure after a communicator was made is its business: a group made after another
// group's failure, used, then destroyed normally told its peers that old failure -- and
// named its lost rank as the culprit of its leaving (found by a helper). So the latest
// failure is kept too, and each failure is numbered.
struct ProcessFailure {
  std::string reason;
  int lost = -1;  // the rank it lost (a world rank: its label), and how; -1: none
  PeerCause cause = PeerCause::kClosed;
  uint64_t number = 0;  // gFailures when it was recorded
};
std::mutex gFailureMu;
ProcessFailure gFirst, gLatest;  // guarded by gFailureMu
uint64_t gFailures = 0;          // failures recorded so far (never reset); gFailureMu
}  // namespace

void forgetFirstFailure() {
  std::lock_guard<std::mutex> lock(gFailureMu);
  gFirst = gLatest = ProcessFailure{};
}

Communicator::Communicator(int rank, int world, std::vector<std::unique_ptr<Connection>> conns,
                           Options opts)
    : rank_(rank), world_(world), conns_(std::move(conns)), opts_(opts),
      timeoutSec_(opts_.timeoutSec) {
  RR_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "rank ", rank_, " world ", world_);
  {
    std::lock_guard<std::mutex> lock(gFailureMu);
    failuresBefore_ = gFailures;
  }
  RR_CHECK_EQ(conns_.size(), static_cast<size_t>(world_), "one connection slot per rank");
  if (!opts_.rankLabels.empty())
    RR_CHECK_EQ(opts_.rankLabels.size(), static_cast<size_t>(world_), "rank_labels: one per rank");
  for (size_t p = 0; p < conns_.size(); ++p) {
    if (conns_[p]) adopt(*conns_[p]);
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
  if (elsewhere_.load(std::memory_order_acquire) && failure_.empty()) throwElsewhere();
  if (aborted_.load() && destroying_.load() && !opts_.groupName.empty())
    RR_THROW(Error, "the communicator of ", opts_.groupName, " was destroyed (",
             opts_.p2pChannel ? "ringreduce.destroy()" : "its Group.destroy() or ringreduce.destroy()",
             ") before this call could run");
  if (aborted_.load())
    RR_THROW(Error, destroying_.load() ? kDestroyedText
                                       : "communicator was aborted; destroy it and init again");
  if (!failure_.empty() && opts_.p2pChannel) {
    std::string msg = detail::concat(
        "this point-to-point channel (", opts_.groupName, ") is unusable after an earlier "
        "failure: ", failure_, " -- destroy the world (ringreduce.destroy() / "
        "destroy_process_group()) and init again");
    // Failed by another channel of its family (a rank lost): that rank is the culprit of
    // the first error the user sees on it, as if this channel had seen the loss itself.
    if (elsewhere_.load(std::memory_order_acquire) && failure_ == elsewhereWhy_ &&
        !elsewhereIsSelf())
      throw PeerError(elsewhereWho_.rank, elsewhereWho_.cause, msg, -1, true);
    throw Error(msg);
  }
  if (failure_.empty()) return;
  std::string msg = detail::concat("communicator is unusable after an earlier failure: ",
                                   failure_, " -- destroy it and init again");
  // A rank lost: typed as the first failure was (PeerFailure naming it), so the works queued
  // behind it fail as `except PeerFailure` expects (they were plain errors: found by a helper)
  if (failedPeer_ >= 0) throw PeerError(failedPeer_, failedCause_, msg, -1, true);
  throw Error(msg);
}


FrameHeader Communicator::begin(CollectiveKind kind, DataType dtype, ReduceOp op, int root,
                                Algorithm algo, size_t count, size_t bytesTotal) {
  begun_ = false;  // until it passed checkUsable: its errors are not "during" anything
  checkUsable();
  throwDeferred();
  FrameHeader h;
  h.kind = static_cast<uint8_t>(kind);
  h.dtype = static_cast<uint8_t>(dtype);
  h.op = static_cast<uint8_t>(op);
  h.algo = static_cast<uint8_t>(algo);
  h.seq = ++seq_;
  h.root = root;
  h.count = count;
  if (as_.on) {
    as_.on = false;
    h.dtype = static_cast<uint8_t>(as_.dtype);
    h.op = static_cast<uint8_t>(as_.op);
    h.count = as_.count;
  }
  curKind_ = kind;
  curAlgo_ = algo;
  curHeader_ = h;
  begun_ = true;
  bytesTotal_ = bytesTotal;
  bytesDone_ = 0;
  std::fill(early_.begin(), early_.end(), 0);
  const auto now = Deadline::Clock::now();  // one clock read for deadline, stall, recorder
  curTimeoutSec_ = callTimeoutSec_ >= 0 ? callTimeoutSec_ : timeoutSec_.load();
  deadline_ = Deadline::after(now, curTimeoutSec_);
  stallReported_ = false;
  movedBytes_ = 0;
  movedMs_ = 0;
  faultWaited_ = false;
  if (hb_) {
    hb_->setRoot(h.seq, root);
    hb_->setAlgo(h.seq, h.algo);
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
  if (fault_) maybeFault(FaultPlan::Point::kBegin);
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
  bool hit = fault_->matches(kind, seq_, p) ||
             // kMid in a collective that never had to wait: at its end.
             (p == FaultPlan::Point::kEnd && !faultWaited_ &&
              fault_->matches(kind, seq_, FaultPlan::Point::kMid));
  if (!hit) return;
  const std::unique_ptr<FaultPlan> plan = std::move(fault_);  // one fault per process
  RR_WARN("RINGREDUCE_FAULT: rank ", rank_, " injects '", faultActionName(plan->action), "' in ",
          describeCurrent());
  plan->fire(static_cast<uint8_t>(plan->action), plan->stampPath.c_str());
}

void Communicator::setHeartbeat(std::unique_ptr<transport::Heartbeat> hb) {
  hb_ = std::move(hb);
  hbSinceMs_ = transport::livenessMs();
  // Set-up's collectives ran before: peers waiting on this rank say "idle after collective
  // #<the last of them>", not #0, until its first call.
  hb_->setState(0, seq_, 0);
}

int Communicator::localOf(int world) const { return rankOf(opts_.rankLabels, world_, world); }

void Communicator::poison(const std::string& reason, transport::AbortCode code,
                          transport::Culprit lost) {
  if (!failure_.empty()) return;
  failure_ = reason;
  deferred_ = nullptr;  // failed now: the next call repeats this failure instead
  // Dead, frozen or cut off: it will say no goodbye (the farewell speaks for it). A rank
  // that left or aborted is named in the abort too, but says its own goodbye.
  lostPeer_ = isGone(lost.cause) && !lost.outside ? lost.rank : -1;
  bool processFirst = false;  // this is the process's first failure
  {
    std::lock_guard<std::mutex> lock(gFailureMu);
    ProcessFailure f{reason, -1, lost.cause, ++gFailures};
    if (code == transport::AbortCode::kPeer && lost.rank >= 0 &&
        (lost.outside || lost.rank != rank_)) {
      f.lost = failedPeer_ = lost.outside ? lost.rank : label(lost.rank);
      failedCause_ = lost.cause;
    }
    processFirst = gFirst.reason.empty();
    if (processFirst) gFirst = f;
    gLatest = std::move(f);
  }
  if (!flightPath_.empty()) {
    // Named by world rank, plus the group's name for a group (its rank 0 overwrote world
    // rank 0's file: found by a helper).
    std::string group;
    for (char ch : opts_.groupName)
      group += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    std::string path = flightPath_ + ".rank" + std::to_string(label(rank_)) +
                       (group.empty() ? "" : "." + group) + ".json";
    // Its folder, if the program has not made it (init() checked it could be): mkdir -p.
    for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
      ::mkdir(path.substr(0, at).c_str(), 0777);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::string r = jsonEscape(reason);
      std::string g = jsonEscape(opts_.groupName.empty() ? "world" : opts_.groupName);
      std::fprintf(f,
                   "{\"rank\": %d, \"world\": %d, \"group\": \"%s\", \"group_rank\": %d, "
                   "\"error\": \"%s\",\n \"last_collectives\": %s}\n",
                   label(rank_), world_, g.c_str(), rank_, r.c_str(),
                   recordsToJson(recorder_.flight()).c_str());
      std::fclose(f);
      RR_WARN("flight recorder written to ", path);
    } else {
      RR_WARN("could not write the flight recorder to ", path, ": ", std::strerror(errno),
              " (RINGREDUCE_FLIGHT_RECORDER)");
    }
  }
  if (dialer_) dialer_->close();
  std::string msg = reason;  // receivers prefix "rank <us> (<host>) failed: "
  // This rank's destroy() stopped the call after another communicator of the process had
  // failed (a program leaving on that exception): tell the peers why it leaves, as its
  // goodbye would, naming the rank that failure lost (found by CI: a ring's survivors were
  // told only "rank 0 failed: communicator was destroyed ..." when rank 0's irecv was still
  // in flight as it left on its send's failure to a dead rank 1).
  if (!processFirst && destroying_.load() && code == transport::AbortCode::kOther &&
      lost.rank < 0) {
    transport::Culprit first;
    const std::string why = processFailure(&first);
    if (!why.empty()) {
      msg = detail::concat(reason, "; it was leaving after a failure: ", why);
      if (first.rank >= 0) {
        code = transport::AbortCode::kPeer;
        lost = first;
      }
    }
  }
  if (shm_) shm_->publishAbort(static_cast<uint8_t>(code), msg, lost);
  for (auto& c : conns_) {
    if (!c) continue;
    // The lost rank itself (silent, not dead) hears of its own loss from this rank.
    c->sendAbort(code, msg, !lost.outside && c->peer() == lost.rank ? transport::Culprit{} : lost);
    c->close();
  }
}

std::string Communicator::processFailure(transport::Culprit* who) const {
  std::lock_guard<std::mutex> lock(gFailureMu);
  // The first failure since this communicator was made (the first of the process, else the
  // latest one if that came after), or none.
  const ProcessFailure& f = gFirst.number > failuresBefore_ ? gFirst : gLatest;
  if (f.reason.empty() || f.number <= failuresBefore_) return "";
  if (f.lost >= 0 && f.lost != label(rank_)) {
    const int r = localOf(f.lost);
    *who = r >= 0 ? transport::Culprit{r, f.cause} : transport::Culprit{f.lost, f.cause, true};
  }
  return f.reason;
}

void Communicator::farewell() {
  if (dialer_) dialer_->close();
  // A failure told the peers already (abort frames). So did abort(), unless it was this
  // destroy's own, stopping a call on another thread: if that call had begun a collective
  // it failed it (poisoned); else nothing was lost and the peers need the goodbye (without
  // it a group's shared-memory peers waited for this rank until their timeout).
  if (poisoned() || (aborted_.load() && !destroying_.load())) return;
  warnUnread();
  findUnsaidLocal();
  transport::Culprit who;  // the first failure's lost rank: one of ours, or outside
  const std::string why = processFailure(&who);
  if (shm_) shm_->publishLeft(why, seq_, who);
  for (auto& c : conns_) {
    if (!c) continue;
    c->sendGoodbye(why, seq_, !who.outside && c->peer() == who.rank ? transport::Culprit{} : who);
    c->close();
  }
}

void Communicator::warnUnread() {
  for (auto& c : conns_) {
    if (!c || gone_[static_cast<size_t>(c->peer())]) continue;  // left: its close is no news
    try {
      c->checkIdle(seq_ ? &curHeader_ : nullptr);  // throws MismatchError for such data
    } catch (const MismatchError& e) {
      RR_WARN("rank ", label(rank_), " is leaving ", name(), " with data unread that a peer "
              "sent for a collective this rank finished, so the ranks' results of it differ: ",
              e.what());
    } catch (const PeerError& e) {
      // Closed with nothing unread, no goodbye or abort first: it ended without a word since
      // the last collective (killed, os._exit), and nobody found it. The store's farewell
      // then waited its 5 s for that rank's "bye" (a helper; gloo's destroy returns at once).
      if (e.cause() == PeerCause::kClosed && e.via() < 0 && unsaidPeer_ < 0)
        unsaidPeer_ = c->peer();
    } catch (const std::exception&) {  // its goodbye or abort: this rank leaves too
    }
  }
}

void Communicator::findUnsaidLocal() {
  if (!shm_ || !procs_) return;
  for (int r; (r = procs_->exited()) >= 0;) {
    procs_->forget(r);
    std::string why;
    transport::Culprit who;
    const int p = shm_->globalRank(r);
    const auto& c = conns_[static_cast<size_t>(p)];
    if (c && c->fd() >= 0) continue;  // its connection says (warnUnread)
    if (!shm_->leftOf(r) && !shm_->abortOf(r, &why, &who) && unsaidPeer_ < 0) unsaidPeer_ = p;
  }
}

void Communicator::throwAborted() const {
  if (destroying_.load() && !abortedFirst_.load())
    RR_THROW(Error, "communicator was destroyed (",
             opts_.groupName.empty() || opts_.p2pChannel ? "ringreduce.destroy()"
                                                         : "Group.destroy() or ringreduce.destroy()",
             " was called while it ran) during ", describeCurrent(), "; the ",
             opts_.p2pChannel ? "send/recv" : "collective", " did not complete on this rank");
  RR_THROW(Error, "communicator aborted during ", describeCurrent());
}

void Communicator::failFromElsewhere(const std::string& reason, transport::Culprit who) {
  if (elsewhereClaimed_.exchange(true)) return;
  elsewhereWhy_ = reason;
  elsewhereWho_ = who;
  elsewhere_.store(true, std::memory_order_release);
  uint64_t one = 1;
  ssize_t w = ::write(wakeFd_, &one, sizeof(one));  // a wait in progress looks now
  (void)w;
}

void Communicator::throwElsewhere() const {
  // This rank's own failure on a sibling channel (no room for its shared memory...): not a
  // peer's -- a plain error, as the failed channel's own (its peers are told it names this
  // rank by the abort frames, Culprit).
  if (elsewhereIsSelf()) throw Error(elsewhereWhy_);
  throw PeerError(elsewhereWho_.rank, elsewhereWho_.cause, elsewhereWhy_, -1, true);
}

bool Communicator::elsewhereIsSelf() const {
  return elsewhereWho_.outside && elsewhereWho_.rank == label(rank_);
}

void Communicator::announce() {
  if (aborted_.load()) return announceAbort();
  if (elsewhere_.load(std::memory_order_acquire) && failure_.empty())
    poison(elsewhereWhy_, transport::AbortCode::kPeer, elsewhereWho_);
}

void Communicator::announceAbort() {
  if (!failure_.empty()) return;
  poison(detail::concat("communicator aborted (ringreduce.abort() on rank ", label(rank_),
                        ", idle after collective #", seq_, ")"),
         transport::AbortCode::kOther);
}

void Communicator::abort(bool destroying) {
  if (destroying) destroying_.store(true);
  else if (!aborted_.load()) abortedFirst_.store(true);
  aborted_.store(true);
  uint64_t one = 1;
  ssize_t w = ::write(wakeFd_, &one, sizeof(one));
  (void)w;
}

}  // namespace rr::comm
