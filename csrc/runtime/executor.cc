#include "runtime/executor.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <system_error>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "transport/frame.h"

namespace rr::runtime {

namespace {
// Bumped in every forked child (pthread_atfork): executors made before are the parent's.
std::atomic<unsigned> gForkGen{0};
const bool kAtFork = [] {
  ::pthread_atfork(nullptr, nullptr, [] { gForkGen.fetch_add(1, std::memory_order_relaxed); });
  return true;
}();

struct Bell {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t rings = 0;
};
// A forked child starts a bell of its own (a parent's thread may have held mu at the fork).
Bell* gBell = [] {
  ::pthread_atfork(nullptr, nullptr, [] { gBell = new Bell; });
  return new Bell;  // never destroyed: Works may complete after statics
}();

[[noreturn]] void throwForked() {
  RR_THROW(Error, "this communicator was made by the parent of this forked process (a "
                  "DataLoader worker, os.fork()); its connections and threads belong to the "
                  "parent: run collectives there, or init a new communicator in this process");
}
}  // namespace

unsigned forkGeneration() { return gForkGen.load(std::memory_order_relaxed); }

void ringCompletionBell() {
  Bell* b = gBell;
  {
    std::lock_guard<std::mutex> g(b->mu);
    ++b->rings;
  }
  b->cv.notify_all();
}

uint64_t completionBell() {
  Bell* b = gBell;
  std::lock_guard<std::mutex> g(b->mu);
  return b->rings;
}

uint64_t awaitCompletionBell(uint64_t seen, double timeoutSec) {
  Bell* b = gBell;
  std::unique_lock<std::mutex> lk(b->mu);
  b->cv.wait_for(lk, std::chrono::duration<double>(clampSeconds(timeoutSec)),
                 [&] { return b->rings != seen; });
  return b->rings;
}

void throwForkedWork(const std::string& what) {
  RR_THROW(Error, what, " was started by the parent of this forked process (a DataLoader "
                  "worker, os.fork()) and had not completed at the fork: only the parent "
                  "completes it; wait for it there (before forking), or init a new "
                  "communicator in this process");
}

Executor::Executor(std::unique_ptr<comm::Communicator> comm)
    : comm_(std::move(comm)), forkGen_(gForkGen.load(std::memory_order_relaxed)) {
  (void)kAtFork;
  try {
    worker_ = std::thread([this] { loop(); });
  } catch (const std::system_error& e) {
    // The last step of a set-up: the peers may be done with theirs and waiting in their
    // first collective on it (they waited until this process exited, then blamed its exit:
    // found by a helper under a container's pids limit). Tell them, as a failed collective
    // does (abort frames, the shared-memory abort).
    std::string why = detail::concat(
        "rank ", comm_->label(comm_->rank()), " could not start the thread of ", comm_->name(),
        " (", e.what(), "): ", comm::kThreadLimitText);
    comm_->poison(why, transport::AbortCode::kPeer,  // names this rank, also when relayed
                  transport::Culprit{comm_->rank(), PeerCause::kAborted});
    RR_THROW(Error, why);
  }
}

bool Executor::forked() const { return forkGen_ != gForkGen.load(std::memory_order_relaxed); }

Executor::~Executor() { shutdown(); }

std::shared_ptr<Work> Executor::submit(Task fn, std::string what, uint32_t site) {
  if (forked()) throwForked();
  auto w = std::make_shared<Work>(std::move(what), site);
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) {
      w->complete(std::make_exception_ptr(Error(comm::kDestroyedText)));
      return w;
    }
    std::weak_ptr<Executor> self = weak_from_this();
    if (!self.expired()) {
      w->setClaim([self](Work* me) {
        std::shared_ptr<Executor> e = self.lock();  // held while running: see shutdown()
        return e != nullptr && e->runIfNext(me);
      });
    }
    queue_.emplace_back(std::move(fn), w);
  }
  cv_.notify_one();
  return w;
}

bool Executor::runIfNext(Work* w) {
  if (forked()) return false;  // Work::wait refuses first; never take a parent's mu_
  std::unique_lock<std::mutex> g(mu_);
  if (stop_ || busy_ || queue_.empty() || queue_.front().second.get() != w) return false;
  std::pair<Task, std::shared_ptr<Work>> item = std::move(queue_.front());
  queue_.pop_front();
  item.second->complete(runInline(g, item.first, item.second->site()));
  return true;
}

std::exception_ptr Executor::runInline(std::unique_lock<std::mutex>& g, Task& fn,
                                       uint32_t site) {
  // Take execMu_ while still holding mu_ (g) so the worker cannot start a task queued
  // after the caller's check before this one.
  std::unique_lock<std::mutex> ex(execMu_);
  ++inline_;
  g.unlock();
  comm_->setSpinAllowed(true);
  comm_->setSite(site);
  std::exception_ptr e = run(fn);
  inline_.fetch_sub(1);  // no need for mu_: shutdown() only reads it (raised under mu_)
  return e;
}

bool Executor::incomingIdle(int peer) {
  std::unique_lock<std::mutex> g(mu_);
  if (stop_) RR_THROW(Error, comm::kDestroyedText);
  if (!queue_.empty() || busy_) return false;
  std::unique_lock<std::mutex> ex(execMu_, std::try_to_lock);  // an inline run holds it
  return ex.owns_lock() && comm_->incoming(peer);
}

// `inCall`: the failure is the current collective's (its description ends the message);
// false between collectives (a probe), where the last one's would mislead.
static void rethrowWithContext(comm::Communicator& c, bool inCall = true);

void Executor::probeIdle(const std::vector<int>& waitedFor, bool anyOf) {
  std::unique_lock<std::mutex> g(mu_);
  if (stop_) RR_THROW(Error, comm::kDestroyedText);
  if (!queue_.empty() || busy_) return;
  std::unique_lock<std::mutex> ex(execMu_, std::try_to_lock);  // an inline run holds it
  if (!ex.owns_lock()) return;
  try {
    comm_->probePeers(waitedFor, anyOf);
  } catch (const Interrupted&) {  // Ctrl-C during a probe's wait: no failure of the world
    throw;
  } catch (const comm::UnansweredError& e) {  // maybe it left: the caller decides
    throw PeerError(comm_->label(e.peer()), e.cause(), e.what());
  } catch (...) {
    // A peer found gone between collectives fails the communicator as a collective's
    // failure does: the next call repeats this cause. Else, over shared memory, a rank
    // that relayed the loss and then left was blamed next as crashed (its socket closed
    // first) -- found by a helper.
    if (comm_->poisoned()) throw;
    rethrowWithContext(*comm_, false);
  }
}

void Executor::runSync(Task fn, std::string what, uint32_t site) {
  if (forked()) throwForked();  // before mu_, which a parent's thread may have held
  {
    std::unique_lock<std::mutex> g(mu_);
    if (stop_) RR_THROW(Error, comm::kDestroyedText);
    if (queue_.empty() && !busy_) {
      std::exception_ptr e = runInline(g, fn, site);
      if (e) std::rethrow_exception(e);
      return;
    }
  }
  submit(std::move(fn), std::move(what), site)->wait(-1);
}

// Wrap a failure with what this rank was doing, keeping its type.
namespace {
// Point-to-point channels by their group (Options::p2pFamily), held weakly: a channel
// destroyed is skipped (and dropped at the next lookup).
std::mutex gFamilyMu;
std::map<std::string, std::vector<std::weak_ptr<Executor>>> gFamilies;

// The live channels of `family` (gFamilyMu held), the destroyed ones dropped.
std::vector<std::weak_ptr<Executor>>& liveFamily(const std::string& family) {
  auto& v = gFamilies[family];
  v.erase(std::remove_if(v.begin(), v.end(), [](auto& w) { return w.expired(); }), v.end());
  return v;
}

// A channel's peer, as a world rank (channels are communicators of two).
int channelPeer(const comm::Communicator& c) { return c.label(1 - c.rank()); }

// Channel `c` lost its peer: tell the family's other channels (they fail, naming it; an
// idle one tells its own peer -- a pipeline stage waiting on a neighbour that lost another
// stage is told at once, as a collective's ranks are by the abort frame). `samePeer`: only
// the channels with c's peer (either direction, any tag).
void failFamily(comm::Communicator& c, const std::string& why, transport::Culprit who,
                bool samePeer = false) {
  std::vector<std::shared_ptr<Executor>> others;
  {
    std::lock_guard<std::mutex> g(gFamilyMu);
    auto it = gFamilies.find(c.options().p2pFamily);  // not made again once all have left
    if (it != gFamilies.end())
      for (auto& w : it->second)
        if (auto e = w.lock(); e && &e->comm() != &c &&
                               (!samePeer || channelPeer(e->comm()) == channelPeer(c)))
          others.push_back(std::move(e));
  }
  for (auto& e : others) e->failFrom(why, who);
}
}  // namespace

// ": rank 5 (host) closed the connection ...": the last description of rank `lost` in a
// relayed failure's text -- the first one made, which every relay quotes last -- or "".
static std::string rootOf(const std::string& what, int lost) {
  const std::string key = detail::concat("rank ", lost, " (");
  size_t at = what.rfind(key);
  // Not a heartbeat footnote ("rank 3 (pid 42) was last heard ..."): the description.
  while (at != std::string::npos && what.compare(at + key.size(), 4, "pid ") == 0)
    at = at == 0 ? std::string::npos : what.rfind(key, at - 1);
  return at == std::string::npos ? std::string() : ": " + what.substr(at);
}

static void rethrowWithContext(comm::Communicator& c, bool inCall) {
  std::string ctx = inCall && c.begun() ? " [rank " + std::to_string(c.label(c.rank())) +
                                              " during " + c.describeCurrent() + "]"
                                        : "";
  try {
    throw;
  } catch (const InvalidArgument&) {
    throw;
  } catch (const MismatchError& e) {
    c.poison(e.what(), transport::AbortCode::kMismatch);
    auto world = [&c](int p) { return p >= 0 && p < c.world() && p != c.rank() ? c.label(p) : -1; };
    throw MismatchError(e.what() + ctx, world(e.via()), world(e.peer()));
  } catch (const Interrupted& e) {  // abandoned in mid-collective: the peers must not wait
    c.poison(e.what(), transport::AbortCode::kOther);
    throw Interrupted(e.what() + ctx);
  } catch (const TimeoutError& e) {
    auto known = [&c](int p) { return p >= 0 && p < c.world() && p != c.rank(); };
    const int stuck = known(e.stuck()) ? e.stuck() : -1;
    // The abort names where the wait chain ended, so the peers' errors name it too.
    c.poison(e.what(), transport::AbortCode::kTimeout,
             stuck >= 0 ? transport::Culprit{stuck, PeerCause::kAborted} : transport::Culprit{});
    auto world = [&](int p) { return known(p) ? c.label(p) : -1; };  // users know world ranks
    throw TimeoutError(e.what() + ctx, world(e.waitingFor()), world(stuck), world(e.via()));
  } catch (const PeerError& e) {
    int peer = e.peer(), via = e.via();
    // Failed by its family (Communicator::throwElsewhere): the family knows already.
    const bool fromFamily = e.outside() && e.via() < 0;
    PeerCause cause = e.cause();
    // A world rank outside this communicator (`via` lost it elsewhere in the job) is named
    // as it is; one of ours after all is taken as ours (this rank itself: `via` is named).
    int outside = -1;
    if (e.outside()) {
      const int r = c.localOf(peer);
      if (r >= 0) peer = r;
      else if (c.outsideRank(peer)) outside = peer;
      else peer = -1;  // no rank of the job: the relaying rank is named below
    }
    // Told by `via` that it lost `peer` (its abort frame): name that rank, unless the frame
    // names no other rank of this communicator -- then the relaying rank, as before.
    if (outside < 0 && via >= 0 &&
        (peer < 0 || peer >= c.world() || peer == c.rank() || peer == via)) {
      peer = via;
      via = -1;
      cause = PeerCause::kAborted;
    }
    // A closed socket says nothing of what the peer was doing: its heartbeats do (a silent
    // peer's error already quotes its last heartbeat).
    std::string msg = e.what();
    if (cause != PeerCause::kSilent && via < 0 && outside < 0) msg += c.peerContext(peer);
    // A rank gone from the job (dead, silent, cut off, or left while needed) or that gave
    // up (its abort): this rank's abort names it, so survivors that never waited for it
    // name it too, not this rank.
    const bool lost = isGone(cause) || cause == PeerCause::kLeft || cause == PeerCause::kAborted;
    const transport::Culprit who = outside >= 0 ? transport::Culprit{outside, cause, true}
                                                : transport::Culprit{peer, cause};
    c.poison(msg, transport::AbortCode::kPeer, lost ? who : transport::Culprit{});
    // A channel that lost a rank -- or was told of the loss by its peer: the family's other
    // channels tell their own peers in turn, so the news crosses a pipeline hop by hop
    // (found by a helper: told ranks passed nothing on, and ranks two hops away waited
    // for RINGREDUCE_TIMEOUT or blamed the rank that had told them).
    const int lostRank = outside >= 0 ? outside
                         : peer >= 0 && peer < c.world() && peer != c.rank() ? c.label(peer)
                                                                              : -1;
    if (isGone(cause) && c.options().p2pChannel && lostRank >= 0 && !fromFamily)
      // A told channel quotes only the first description of the loss in its error (each
      // hop's whole text would nest).
      failFamily(c, via >= 0 || outside >= 0
                        ? detail::concat("rank ", c.label(c.rank()), " was told that rank ",
                                         lostRank, " was lost (", toString(cause), ") on ",
                                         c.options().groupName, rootOf(e.what(), lostRank))
                        : detail::concat("rank ", c.label(c.rank()), " lost rank ", lostRank,
                                         " (", toString(cause), ") on ",
                                         c.options().groupName, ": ", e.what()),
                 transport::Culprit{lostRank, cause, true});
    throw PeerError(outside >= 0 ? outside : c.label(peer), cause, msg + ctx,
                    via >= 0 ? c.label(via) : -1);  // users know world ranks
  } catch (const Error& e) {
    const bool cutOff = c.failed();  // aborted or destroyed (not poisoned: run() checked)
    c.poison(e.what(), transport::AbortCode::kOther);
    // A channel that failed on this rank (its shared-memory slots did not fit /dev/shm...):
    // this rank's other channels with that peer in its group fail too, and tell it. A
    // receive from the peer on another tag waited for RINGREDUCE_TIMEOUT while the peer,
    // told on the failed channel only, went on (a helper). Not for a call that abort() or
    // destroy() cut off: the siblings say their own goodbye or abort.
    if (c.options().p2pChannel && c.world() == 2 && !cutOff)
      failFamily(c, detail::concat("rank ", c.label(c.rank()), "'s point-to-point channel with rank ",
                                   channelPeer(c), " on ", c.options().groupName,
                                   " failed on this rank: ", e.what()),
                 transport::Culprit{c.label(c.rank()), PeerCause::kAborted, true}, true);
    throw Error(e.what() + ctx);
  } catch (const std::bad_alloc&) {  // a scratch buffer, most likely (a helper: ulimit -v)
    const std::string why = detail::concat(
        "rank ", c.label(c.rank()), " ran out of memory during this call (std::bad_alloc); "
        "free memory, or split the buffer into smaller calls");
    c.poison(why, transport::AbortCode::kOther);
    throw Error(why + ctx);
  } catch (const std::exception& e) {
    c.poison(e.what(), transport::AbortCode::kOther);
    throw Error(std::string(e.what()) + ctx);
  }
}

std::exception_ptr Executor::run(Task& fn) {
  try {
    try {
      comm_->newCall();
      fn(*comm_);
      comm_->finish(true);
    } catch (...) {
      comm_->finish(false);
      if (comm_->poisoned()) throw;  // already failed earlier: message says so
      // A peer's failure kept by an earlier wait of this collective is this one's cause:
      // its abort was read then; a closed connection may be all that is left now.
      std::exception_ptr kept = comm_->takeDeferred();
      if (kept && comm::Communicator::peerFailure(std::current_exception())) {
        try {
          std::rethrow_exception(kept);
        } catch (...) {
          rethrowWithContext(*comm_);
        }
      }
      rethrowWithContext(*comm_);
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void Executor::loop() {
  while (true) {
    std::pair<Task, std::shared_ptr<Work>> item;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait(g, [&] { return stop_ || !queue_.empty() || announce_; });
      if (announce_) {
        announce_ = false;
        g.unlock();
        // Under execMu_: after a collective running now (inline) has failed and told the
        // peers itself, never while one writes frames.
        std::lock_guard<std::mutex> ex(execMu_);
        comm_->announce();
        continue;
      }
      if (queue_.empty()) return;  // stop_ and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> ex(execMu_);
      comm_->setSpinAllowed(false);
      comm_->setSite(item.second->site());
      err = run(item.first);
    }
    // Idle and complete in one step under mu_: a waiter that destroys the communicator as
    // soon as its wait returns must not find it busy -- shutdown() then took the finished
    // collective for one in flight, aborted it and reported the destroy as failed -- and
    // no later Work may be claimed (runIfNext) before this one is complete.
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
    item.second->complete(err);
  }
}


void Executor::joinFamily(const std::shared_ptr<Executor>& e) {
  const std::string& family = e->comm().options().p2pFamily;
  if (family.empty()) return;
  std::lock_guard<std::mutex> g(gFamilyMu);
  liveFamily(family).push_back(e);
}

std::pair<size_t, size_t> Executor::familyCounts() {
  std::lock_guard<std::mutex> g(gFamilyMu);
  size_t channels = 0;
  for (const auto& kv : gFamilies) channels += kv.second.size();
  return {gFamilies.size(), channels};
}

// A destroyed channel leaves its family: a weak_ptr left behind keeps the executor's
// make_shared block (object storage + control block, ~270 B) allocated, and the family's
// map entry -- named after a group that may be gone -- would stay for good.
void Executor::leaveFamily() {
  const std::string& family = comm_->options().p2pFamily;
  if (family.empty()) return;
  const std::weak_ptr<Executor> self = weak_from_this();
  std::lock_guard<std::mutex> g(gFamilyMu);
  auto it = gFamilies.find(family);
  if (it == gFamilies.end()) return;
  auto& v = it->second;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const std::weak_ptr<Executor>& w) {
            return w.expired() || (!w.owner_before(self) && !self.owner_before(w));
          }), v.end());
  if (v.empty()) gFamilies.erase(it);
}

void Executor::failFrom(const std::string& reason, transport::Culprit who) {
  comm_->failFromElsewhere(reason, who);
  {
    std::lock_guard<std::mutex> g(mu_);
    announce_ = true;
  }
  cv_.notify_all();
}

void Executor::abort() {
  comm_->abort();
  {
    std::lock_guard<std::mutex> g(mu_);
    announce_ = true;
  }
  cv_.notify_all();
}

void Executor::shutdown() {
  leaveFamily();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_ && !worker_.joinable()) return;
    stop_ = true;
    // Anything still queued or running (also a synchronous call on another thread) would
    // block on peers that are shutting down too: fail it fast.
    if (!queue_.empty() || busy_ || inline_.load() > 0) comm_->abort(/*destroying=*/true);
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // A synchronous call on another thread holds execMu_ until its (aborted) collective has
  // unwound: only then may the connections be used for goodbyes, or freed.
  std::lock_guard<std::mutex> ex(execMu_);
  comm_->farewell();
}

}  // namespace rr::runtime
