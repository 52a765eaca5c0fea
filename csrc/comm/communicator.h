// Communicator: this rank's view of the group -- rank, size, one Connection per peer, the
// collective sequence number, the scratch arena and the failure state. Algorithms drive
// connections through it and wait on it; it never knows which algorithm is running.
// Implemented by concern: communicator.cc (life cycle, begin, poison/abort), wait.cc (the
// waits and their one liveness check), diagnostics.cc (stall reports, wait chains, what a
// peer was doing), lazy_connect.cc (connections on first use), recorder.h (flight
// recorder), fault.h (test-only fault injection: a null plan unless a test armed one).
//
// Threading: every method except abort() is called by the one thread executing collectives
// (runtime::Executor). abort() may be called from any thread; it wakes a blocked wait.
#pragma once

#include <poll.h>

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/fault.h"
#include "comm/recorder.h"
#include "comm/scratch.h"
#include "core/deadline.h"
#include "core/params.h"
#include "core/types.h"
#include "transport/heartbeat.h"
#include "transport/shm/domain.h"
#include "transport/shm/liveness.h"
#include "transport/transport.h"

namespace rr::comm {

// What a failed thread start says to do (std::thread's EAGAIN: a pids or thread limit, or
// no address space left for the thread's stack under `ulimit -v`).
inline constexpr const char* kThreadLimitText =
    "the process is at its thread limit (a container's pids.max, ulimit -u) or has no address "
    "space left for a thread's stack (ulimit -v); raise it, or make fewer groups and channels";

// A call on a destroyed communicator: what it says to do depends on who owns it, so it
// names every remedy (a torch group of the backend rides on ringreduce's world or groups).
inline constexpr const char* kDestroyedText =
    "communicator was destroyed; make a new one: ringreduce.init() for the world, "
    "ringreduce.new_group() for a group, or for a torch process group "
    "torch.distributed.new_group() for a subgroup, destroy_process_group() and "
    "init_process_group() for the default one";

using transport::Connection;
using transport::FrameHeader;
using transport::RecvOp;
using transport::SendOp;

// A sender outside a sparse world's overlay that a receive from any rank asked for
// heartbeats (probePeers' anyOf) answered none and is closed or silent: it crashed -- or it
// left the job normally before it was asked, which only the store can tell (its goodbye
// reached its overlay and the ranks asking it then). So no failure of this communicator
// (not poisoned): the caller decides (ringreduce._watch.probe, by its store sign). Also a
// sender whose goodbye is known (cause kLeft): passed over.
class UnansweredError : public PeerError {
 public:
  using PeerError::PeerError;
};

// A new job in this process (ringreduce.init() after destroy()): the failure of the last one
// is not why this one's communicators leave, nor is the rank it lost theirs to name.
void forgetFirstFailure();

class Communicator {
 public:
  Communicator(int rank, int world, std::vector<std::unique_ptr<Connection>> conns, Options opts);
  ~Communicator();

  int rank() const { return rank_; }
  // The world rank of rank `p` of this communicator, for messages (a group's ranks are
  // named as the user knows them; the world's label is the rank itself).
  int label(int p) const { return rankLabel(opts_.rankLabels, p); }
  // The communicator rank labelled `world` (label's inverse), or -1: not one of ours.
  int localOf(int world) const;
  // Whether a peer's culprit outside this communicator names a rank of the job, not this
  // process (a world has no outside; a group's or channel's is a world rank).
  bool outsideRank(int worldRank) const {
    return worldRank >= 0 && worldRank < opts_.jobWorld && worldRank != label(rank_);
  }
  int world() const { return world_; }
  const Options& options() const { return opts_; }
  // Init's own collectives (the shared-memory set-up over TCP) wait at most `sec`, what is
  // left of the connect timeout, not RINGREDUCE_TIMEOUT, and a timeout says so;
  // endSetup() gives the collectives their own timeout back.
  void beginSetup(double sec) {
    setupOf_ = timeoutSec_.exchange(sec);
  }
  void endSetup() {
    timeoutSec_.store(setupOf_);
    setupOf_ = -1;
  }
  // The collectives begun from now on wait at most `sec` (torch's Backend.setTimeout, through
  // the c10d adapter). Any thread may call it; a collective in flight keeps its deadline.
  void setTimeout(double sec) { timeoutSec_.store(sec); }
  // One call's own timeout (torch's dist.barrier(timeout=), a c10d Options.timeout): the
  // collectives begun while it is set wait at most `sec` (< 0: the communicator's). Set and
  // cleared around them by the thread that runs them (bindings' withCallTimeout).
  void setCallTimeout(double sec) { callTimeoutSec_ = sec; }
  uint64_t seq() const { return seq_; }
  // The connection to `peer`, made now (comm/lazy_connect.cc) if it is not there yet.
  Connection& conn(int peer) {
    auto& c = conns_[static_cast<size_t>(peer)];
    if (!c) connectLazily(peer);
    return *c;
  }
  // Host of `peer`, for messages (no connection needed).
  std::string peerHost(int peer) const;

  // Lazy connections: init connected only the peers in `watch` (a sparse overlay, sorted);
  // `dialer` makes the others on first use. Those peers are also the only ones whose
  // connections and heartbeats waits watch: a failure elsewhere reaches this rank as an
  // abort frame relayed along the overlay. Without this call every peer is connected and
  // watched (full mesh).
  void setDialer(std::unique_ptr<transport::Dialer> dialer, const std::vector<int>& watch);
  bool watched(int peer) const { return watch_[static_cast<size_t>(peer)] != 0; }
  // Has `peer` started a collective this rank has not yet (a message is waiting), or has
  // its connection something to report (data, EOF, an abort frame)? Never blocks. Only
  // meaningful while this rank runs nothing on the communicator (Executor::incomingIdle).
  bool incoming(int peer);
  // Between collectives: throw PeerError if a peer is known to be gone -- its process exited
  // (shared memory's pidfds), its connection closed or carries an abort, or its heartbeats
  // stopped -- so a wait outside any collective (a group's creation, a p2p channel's
  // rendezvous in the store) names a dead or frozen peer instead of timing out. Same
  // threading as incoming(). A peer of `waitedFor` that said goodbye (destroy(), or its
  // program ended) is gone too: this wait cannot end -- unless `anyOf` (a receive from any
  // of them: another may still send), which also asks every unwatched one of them for
  // heartbeats (the receive already looks at each of them; see probeOnce) and throws
  // UnansweredError for one that left or is found closed or silent.
  void probePeers(const std::vector<int>& waitedFor = {}, bool anyOf = false);
  // Open TCP connections (for link_stats and tests). Executor thread.
  int openConnections() const;

  // Start a collective: checks the communicator is usable, takes the next sequence number,
  // arms the deadline and returns the header every frame of this collective carries.
  FrameHeader begin(CollectiveKind kind, DataType dtype, ReduceOp op, int root, Algorithm algo,
                    size_t count, size_t bytesTotal);
  // A collective that moves no data (count 0, world 1) still consumes a sequence number so
  // that later collectives line up on every rank.
  void skip() { checkUsable(); ++seq_; }

  // While one is in scope, the next begin()'s frames describe the caller's call (dtype, op,
  // per-rank count) instead of the call that carries it: an integer avg runs as an int64
  // sum (collectives/int_avg.h), yet ranks must still agree on what they were asked for --
  // int32 avg must not meet int64 sum, nor int8 avg uint8 avg, unnoticed.
  class DescribedAs {
   public:
    DescribedAs(Communicator& c, DataType dtype, ReduceOp op, size_t count) : c_(c) {
      c_.as_ = {true, dtype, op, count};
    }
    ~DescribedAs() { c_.as_.on = false; }
    DescribedAs(const DescribedAs&) = delete;
    DescribedAs& operator=(const DescribedAs&) = delete;

   private:
    Communicator& c_;
  };

  // Block until sendPeer is writable or recvPeer readable (-1 = none), watching all other
  // peers for EOF/abort meanwhile. Throws TimeoutError at the deadline, PeerError on a dead
  // peer, Error after abort().
  void waitIo(int sendPeer, int recvPeer);
  // Drive one send and/or one receive to completion (either may be null).
  void sendRecv(int sendPeer, SendOp* s, int recvPeer, RecvOp* r);
  // conn(peer).progressSend(op), counting the payload once the frame is through. Algorithms
  // send through here (or sendRecv) so that payloadBytesSent() sees every byte.
  bool progressSend(int peer, SendOp& op) {
    if (!conn(peer).progressSend(op)) return false;
    bytesSent_.fetch_add(op.len, std::memory_order_relaxed);
    return true;
  }
  // conn(peer).progressRecv(op), counting its payload as this collective's progress as it
  // arrives (addBytesDone), not once the frame is whole: over a slow link one piece takes
  // seconds, and a peer waiting for this rank -- which reads its progress from the
  // heartbeats -- reported a stall while the data moved (4 Mbit/s, 1 s RINGREDUCE_STALL_WARN).
  bool progressRecv(int peer, transport::RecvOp& op) {
    const bool whole = conn(peer).progressRecv(op);
    const size_t got = whole ? op.len : std::min(op.len, op.payloadDone());
    if (got > op.counted) {
      addBytesDone(got - op.counted);
      op.counted = got;
    }
    return whole;
  }
  // Payload bytes this rank has sent to its peers over TCP since the communicator was made
  // (frame headers and checksums excluded; shared memory is not a wire and is not counted):
  // lets tests and benchmarks check what a collective puts on the wire. Any thread.
  uint64_t payloadBytesSent() const { return bytesSent_.load(std::memory_order_relaxed); }
  void addBytesDone(size_t n) {
    bytesDone_ += n;
    if (hb_) hb_->setState(static_cast<uint8_t>(curKind_), seq_, bytesDone_);
  }
  // The collective finished (ok = no exception): heartbeats say "idle", recorder notes it.
  void finish(bool ok) {
    if (ok) {
      finished_ = seq_;
      finishedAtMs_ = transport::livenessMs();
    }
    if (ok && fault_) maybeFault(FaultPlan::Point::kEnd);
    if (hb_) hb_->setState(0, seq_, bytesDone_);
    recorder_.end(ok);
  }
  // The Python line that issues the next collective (comm/site.h id). Executor thread.
  void setSite(uint32_t site);
  // Arm fault injection (RINGREDUCE_FAULT, tests only) on this rank; without it the
  // communicator carries a null plan. `plan.fire` is the test module's hook (fault.h).
  void setFault(FaultPlan plan) { fault_ = std::make_unique<FaultPlan>(std::move(plan)); }
  Recorder& recorder() { return recorder_; }
  // Where poison() writes the flight recorder ("" = nowhere).
  void setFlightPath(std::string path) { flightPath_ = std::move(path); }
  // Heartbeats run from here on; peers silent for too long fail waits (PeerError).
  void setHeartbeat(std::unique_ptr<transport::Heartbeat> hb);
  const transport::Heartbeat* heartbeat() const { return hb_.get(); }

  ScratchArena& scratch() { return scratch_; }

  // Whether waits may busy-spin: yes for a synchronous call running on the caller's thread
  // (latency is what it waits for), no on the worker thread, which runs async work beside
  // the caller's computation (e.g. DDP's backward) and must not take its core.
  void setSpinAllowed(bool on) { spinAllowed_ = on; }
  bool spinAllowed() const { return spinAllowed_; }

  // Shared memory among the ranks of this host, or null: collectives then use TCP.
  transport::shm::ShmDomain* shm() { return shm_.get(); }
  // True when shared memory reaches every rank (single host): all collectives use it.
  bool shmAll() const { return shm_ && shm_->world() == world_; }
  // With several hosts: the ranks (one per host, hosts ordered by their lowest rank) that
  // share this rank's local index; hierarchical all-reduce rings over them.
  const std::vector<int>& slicePeers() const { return slicePeers_; }
  void setShm(std::unique_ptr<transport::shm::ShmDomain> d, std::vector<int> slicePeers) {
    shm_ = std::move(d);
    slicePeers_ = std::move(slicePeers);
  }
  // A communicator without TCP connections (one host): watch the local peers' processes
  // through pidfds, where connections would show EOF (transport/shm/liveness.h).
  void watchLocalProcesses() { procs_ = std::make_unique<transport::shm::PeerProcesses>(*shm_); }
  int watchedProcesses() const { return procs_ ? procs_->watched() : 0; }
  // For waits outside poll (shared memory): throw on abort, deadline (naming `peer`, the
  // rank waited for, when >= 0) or a peer whose connection shows EOF/abort. Cheap.
  void checkAlive(int peer);
  // A wait whose data is all here met another rank's failure (its abort, goodbye, closed
  // connection or silence; not an interrupt, abort() or this rank's deadline): keep it for
  // the next call (begin, probePeers), which throws it, and return true -- the collective
  // completed everywhere, so it must return. False: a failure of this rank, to throw now.
  bool deferPeerFailure(std::exception_ptr e);
  static bool peerFailure(std::exception_ptr e);  // what deferPeerFailure keeps
  // The kept failure, for a collective that fails later on (its cause, read then).
  std::exception_ptr takeDeferred() { return std::exchange(deferred_, nullptr); }
  void throwDeferred() {
    if (deferred_) std::rethrow_exception(takeDeferred());
  }
  // Its socket part: read what peers' idle connections hold -- an abort (throws), a
  // goodbye, a dialler -- without waiting. A point-to-point sender never reads otherwise.
  void pollIdle();
  // One pass of probePeers' checks (peers probeSkip_ marks are passed over).
  void probeOnce(const std::vector<int>& waitedFor, bool anyOf);
  bool probeSkipped(int p) const { return probeSkip_ && (*probeSkip_)[static_cast<size_t>(p)]; }
  // Its shared-memory part, without waiting: a local peer's published failure (its abort)
  // throws here. One load per local peer: for a sender that may return before the receiver
  // reads (an eager point-to-point send), which would otherwise never look.
  void checkLocalAborts();

  // Record the first failure, tell every peer (abort frames) and close all connections.
  // Later begin() calls throw a clear "unusable" error.
  // lostPeer: the peer found dead or frozen (it will not say goodbye), if that was the cause.
  void poison(const std::string& reason, transport::AbortCode code,
              transport::Culprit lost = {});
  bool poisoned() const { return !failure_.empty(); }
  // After abort(): tell the peers (abort frames, shared-memory abort) if no failed
  // collective did. Only while no collective runs (Executor's worker, under execMu_).
  void announceAbort();
  // This process lost `who` (a world rank: outside this communicator) on another channel of
  // this one's group (Options::p2pFamily): a call waiting here now fails naming it (at its
  // next wait check), as does the next call; announce() tells an idle one's peer. Any thread.
  void failFromElsewhere(const std::string& reason, transport::Culprit who);
  // The executor's announcement when it is idle: the abort (abort()) or the failure from
  // elsewhere (failFromElsewhere) told to the peers, once.
  void announce();
  int lostPeer() const { return lostPeer_; }  // poison()'s lost.rank if dead/silent; else -1
  // A peer found at farewell to have ended without a word (its connection closed, or its
  // process gone, with no goodbye or abort before): killed or os._exit since the last
  // collective, which nobody saw. -1: none. Read once the executor has stopped.
  int unsaidPeer() const { return unsaidPeer_; }
  // False when the last collective was refused before it began (describeCurrent would
  // describe the one before it).
  bool begun() const { return begun_; }
  // A call starts (Executor::run): until its begin(), its errors are not "during" the
  // collective before it (an allocation failing first was reported "during barrier #3").
  void newCall() { begun_ = false; }
  // Poisoned or aborted. Executor thread, or any thread once the executor has stopped.
  bool failed() const { return poisoned() || aborted_.load(); }
  void checkUsable() const;

  // Normal shutdown: tell every peer we leave on purpose, then close. Executor thread only.
  void farewell();
  // At farewell: warn about data a peer sent for a collective this rank has finished -- the
  // ranks disagreed about it (two ranks that both named themselves a broadcast's root both
  // return over TCP); with no later call to fail, nothing else would say so. Notes a peer
  // that ended without a word (unsaidPeer).
  void warnUnread();
  // At farewell, shared memory: a local peer whose process is gone, which neither left nor
  // aborted (unsaidPeer). Reads nothing a peer sent.
  void findUnsaidLocal();
  // The first failure of any communicator of this process ("" if none), and in *who the
  // rank it lost as this communicator names it (one of ours, or outside), if any.
  std::string processFailure(transport::Culprit* who) const;

  // Thread-safe: make the current and every later wait fail promptly. `destroying`: the
  // reason is destroy() on another thread (the error says so instead of "aborted").
  void abort(bool destroying = false);

  // "allreduce #12 (ring, 4.0 of 16.0 MiB done)" for error messages.
  std::string describeCurrent() const;
  // What users call collective kind `k` here: a point-to-point channel runs its messages as
  // broadcasts from the sender -- "send" / "recv" for `root` (this rank or not), "message"
  // when root < 0 (unknown).
  const char* kindName(CollectiveKind k, int root) const;
  // "world", "group3", "p2p 0->1 tag 2": for logs.
  std::string name() const { return opts_.groupName.empty() ? "world" : opts_.groupName; }
  // What heartbeats last said of `peer`: "; rank 2 (pid 4711) was last heard 0.3 s ago, at
  // allreduce #12 with 64 KiB received; last call site train.py:57" ("" if unknown).
  std::string peerContext(int peer) const;

 private:
  struct {
    bool on = false;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    size_t count = 0;
  } as_;  // DescribedAs; consumed by begin()
  // The one liveness check of every wait (sockets: waitIo between polls; shared memory:
  // checkAlive): abort, the deadline, then the peers' heartbeats (silent peer, collective
  // issued out of order, stall report). `shm`: the wait is on shared memory (for messages).
  void checkLiveness(int sendPeer, int recvPeer, bool shm);
  // checkLiveness if it has not run for kLivenessEveryMs: a wait woken again and again by
  // other sockets (a stranger dialling the listener) still checks deadline and heartbeats.
  void livenessDue(int sendPeer, int recvPeer) {
    if (steadyMs() - livenessAtMs_ >= kLivenessEveryMs) checkLiveness(sendPeer, recvPeer, false);
  }
  static constexpr int64_t kLivenessEveryMs = 250;  // as pollWaits' longest sleep
  int64_t livenessAtMs_ = 0;  // steady ms of the last checkLiveness, or the wait's start
  int64_t ioWaitSinceMs_ = 0;  // when the current waitIo began (its peers silent since)
  [[noreturn]] void timeout(int sendPeer, int recvPeer, bool shm);
  // Shared memory's part of every liveness check: a local peer's published failure
  // (throws as its abort frame would), its goodbye (gone_), its exit (PeerError).
  void checkLocalPeers();
  // Why peer `p` left (its goodbye's or shared-memory farewell's reason), "" if it gave none.
  std::string leftWhy(int p);
  // Peer `p` said goodbye: "rank p (host) left the job ..." + `during` (" while ...", or "").
  [[noreturn]] void throwLeft(int p, const std::string& during);
  // throwLeft for a receive from any rank (probePeers' anyOf): a plain departure is an
  // UnansweredError (the caller passes the rank over; nothing is poisoned).
  [[noreturn]] void throwLeftAnyOf(int p);
  // Peer `p` said goodbye (gone_, goneList_).
  void markGone(int p);
  // The last collective peer `p` began before its goodbye (0: none, or not heard).
  uint64_t leftAfter(int p) const;
  // The rank peer `p`'s goodbye says it lost (rank -1: none).
  transport::Culprit leftCulprit(int p);
  // Whether `who`, named by peer `p`'s goodbye or abort, is a rank of this communicator
  // other than this one and `p` (then it is named, not `p`; an outside rank is too).
  bool otherMember(const transport::Culprit& who, int p) const {
    return !who.outside && who.rank >= 0 && who.rank < world_ && who.rank != rank_ &&
           who.rank != p;
  }
  // Peer p's abort names the rank whose loss already failed this communicator, another
  // than p: old news (p lost the same rank; found by CI: a shared-memory survivor's abort
  // record, which stays, failed every later group set-up that waited for that survivor).
  // Not p's own failure (it names itself: its loss is what failed this one).
  bool toldBack(const transport::Culprit& who, int p) const {
    if (!poisoned() || failedPeer_ < 0 || who.rank < 0) return false;
    const int lost = who.outside ? who.rank : label(who.rank);
    return lost == failedPeer_ && lost != label(p);
  }
  // The culprit a peer named, if it is one this rank can name in turn: another member, or a
  // rank of the job outside this communicator.
  bool knownCulprit(const transport::Culprit& who, int p) const {
    return who.outside ? outsideRank(who.rank) : otherMember(who, p);
  }
  // In a collective: throw (throwLeft) if a peer that left had left before it began -- it
  // will never come, even if this rank waits for someone else now (found by a helper: it
  // was named only once this rank waited for it, or a late rank was blamed at the timeout).
  void checkGone();
  // Raise what shared memory says peer `p` failed with (ShmDomain::abortOf's code, reason,
  // and the rank it lost, named instead of `p` when that is another rank).
  [[noreturn]] void throwPeerAbort(int p, uint32_t code, const std::string& reason,
                                   transport::Culprit who = {}) const;
  void connectLazily(int peer);
  // Wait until `dialFd` is readable (>= 0) or `peer` has dialled this rank, serving other
  // dialling peers and watching the overlay meanwhile.
  void waitForLink(int peer, int dialFd);
  // Accept one dialling peer (the listener is readable) into conns_.
  void acceptDialler();
  // Configure a new connection of this communicator (checksums, the peer's label, p2p).
  void adopt(transport::Connection& c) const;
  // poll(pfds_) until something is ready or 250 ms pass (heartbeats are looked at between
  // rounds) or the deadline; returns the ready count; throws after abort().
  int pollWaits();
  // Add the watched, idle connections (and the listener) to pfds_ for a wait.
  void watchIdle(int sendPeer, int recvPeer);
  // A watched idle connection was readable: EOF/abort throws, goodbye/early data noted.
  void onIdleReadable(int peer);
  static constexpr int kListenerSlot = -2;  // pfdPeer_ of the listener (-1: the wake fd)
  std::unique_ptr<transport::Dialer> dialer_;
  std::vector<uint8_t> watch_;  // 1: connected at init and watched in waits
  std::vector<int> watchList_;  // the same, as a list (waits cost O(watched), not O(world))
  // During probePeers: peers already found failed, whose failure must not hide a waited-for
  // one's (null otherwise).
  const std::vector<uint8_t>* probeSkip_ = nullptr;

  int rank_, world_;
  std::vector<std::unique_ptr<Connection>> conns_;
  Options opts_;
  uint64_t seq_ = 0;
  Deadline deadline_ = Deadline::never();
  std::atomic<double> timeoutSec_;  // the next collective's (options' timeout, setTimeout)
  double curTimeoutSec_ = 0;  // the current collective's, for its timeout's message
  double callTimeoutSec_ = -1;  // setCallTimeout's, else -1
  double setupOf_ = -1;  // in init's set-up (beginSetup): the collective timeout, else -1
  ScratchArena scratch_;
  std::unique_ptr<transport::shm::ShmDomain> shm_;
  std::unique_ptr<transport::shm::PeerProcesses> procs_;  // watchLocalProcesses(), else null
  std::vector<int> slicePeers_;
  std::unique_ptr<transport::Heartbeat> hb_;
  Recorder recorder_;
  std::string flightPath_;
  bool spinAllowed_ = true;
  int64_t hbSinceMs_ = 0;  // transport::livenessMs() when heartbeats started
  int64_t beganMs_ = 0;    // steady ms when the current collective began
  // Stalls count from the last time data moved here or at the rank waited for (checked
  // with heartbeats): a 2 GiB copy into untouched memory is slow, not stuck (found by a
  // helper: a stall report and a "cycle" of ranks reading each other's buffers).
  // movedBytes_: a sum of this rank's bytes and that rank's place; movedMs_ 0: none moved.
  uint64_t movedBytes_ = 0;
  int64_t movedMs_ = 0;
  bool stallReported_ = false;
  void checkHeartbeats(int waitingFor);
  // The first watched peer silent for longer than the heartbeat timeout (one that said
  // goodbye never is), -1 if none; *s and *ageMs describe it. neverHeard: a peer not heard
  // from since heartbeats started counts as silent for that long. Needs hb_ and a timeout.
  int silentPeer(bool neverHeard, transport::PeerStatus* s, int64_t* ageMs) const;
  // A connected, watched `peer` never heard from, like every member on its host: datagrams do
  // not arrive (UDP blocked between the hosts; its heartbeats began before it connected), so
  // its silence says nothing -- it is left to its connection and the deadline. Warns once
  // per host and process. A peer on a host heard from (its own silence) is not.
  bool heartbeatsNeverCame(int peer) const;
  // A wait for `peer`, a rank outside the sparse overlay (no-op for a watched one): ask it
  // for heartbeats (Heartbeat::want) and throw PeerError once it has been silent for the
  // heartbeat timeout since this rank began asking, or (unconnected) said goodbye. A no-op
  // without heartbeats. inCollective: the wait is in the current collective (messages).
  // leftOk (a receive from any rank): its goodbye, or closed or silent (it may have left
  // before this rank asked it), throws UnansweredError.
  void checkUnwatched(int peer, bool inCollective, bool leftOk = false);
  // A remote `peer` this rank has waited for on its connection for longer than the
  // heartbeat timeout with nothing arriving, whose heartbeat said goodbye longer than that
  // ago: the network stalls its traffic (a one-way partition); throws PeerError (kNetwork).
  // A wait that makes progress (a slow link draining a departed peer's last data) returns
  // and starts over, so only a connection silent for the whole timeout counts. For a peer
  // remoteOnConnection() accepts (as checkUndelivered).
  void checkStalledGoodbye(int peer);
  // Whether checkStalledGoodbye and checkUndelivered apply to `peer`: heartbeats on, and it
  // is waited for on a connection of its own (not gone, not a shared-memory peer).
  bool remoteOnConnection(int peer) const;
  // RINGREDUCE_HEARTBEAT_TIMEOUT in ms: how long a peer may be silent.
  int64_t hbTimeoutMs() const { return static_cast<int64_t>(opts_.heartbeatTimeoutSec * 1000); }
  // A remote `peer` whose heartbeats arrive while TCP has been retransmitting this rank's data
  // to it, unacknowledged, for twice the heartbeat timeout (kept per peer for the current
  // collective in lossSince_): the network drops the connection's packets (an MTU black
  // hole: full-size packets lost, small ones and heartbeats passing; or one way only);
  // throws PeerError (kNetwork) where the ranks would otherwise wait for RINGREDUCE_TIMEOUT.
  void checkUndelivered(int peer);
  // Per peer: {collective seq_, steady ms} when checkUndelivered first saw TCP retransmitting.
  std::vector<std::pair<uint64_t, int64_t>> lossSince_;
  // "rank 3 (host, pid 42) stopped responding: no heartbeat for 4.1 s (...)"
  std::string silence(int peer, const transport::PeerStatus& s, int64_t ageMs) const;
  void maybeFault(FaultPlan::Point p);
  // First wait of the collective: the FaultPlan kMid point.
  void noteWait() {
    if (faultWaited_) return;
    faultWaited_ = true;
    if (fault_) maybeFault(FaultPlan::Point::kMid);
  }
  // "at allreduce #5 with 64 KiB received<note>; last call site train.py:57", from heartbeats.
  std::string peerDoing(int peer, const transport::PeerStatus& s, const char* note = "") const;
  std::unique_ptr<FaultPlan> fault_;  // null unless a test armed one
  bool faultWaited_ = false;  // the current collective has waited (FaultPlan kMid)
  uint32_t site_ = 0;
  std::string siteText_;      // siteName(site_): " called from train.py:57" or 
  void reportStall(int64_t waitedMs, int64_t idleMs, int waitingFor);
  // "; ... ranks not in this collective yet: rank 2 (idle after collective #4; ...)"
  std::string behindSummary(int exclude = -1);
  // "; wait chain: rank 0 -> rank 2 -> rank 1 (...)": follow the peers' heartbeats from
  // `first` (the rank this one waits for) to the rank that waits for nobody; *end = it when
  // it is stuck (not in this collective, or waiting for no rank), else -1 (a cycle, a rank
  // not watched).
  std::string waitChain(int first, int* end);
  // waitChain + behindSummary of the others; *stuck (optional): waitChain's end.
  std::string diagnosis(int waitingFor, int* stuck = nullptr);
  std::vector<pollfd> pfds_;      // reused by waitIo: no allocation per wait
  std::vector<int> pfdPeer_;      // peer rank of each pfds_ entry (-1: wake fd)
  std::vector<uint8_t> early_;    // peer sent data for a later collective: stop watching it
  std::vector<uint8_t> gone_;     // peer said goodbye: never watch it for EOF again
  std::vector<int> goneList_;     // the peers gone_ marks, in the order they left
  std::string failure_;
  int failedPeer_ = -1;  // world rank of the peer failure_ lost (checkUsable's PeerError)
  PeerCause failedCause_ = PeerCause::kClosed;
  std::exception_ptr deferred_;  // deferPeerFailure's, thrown by the next call
  uint64_t failuresBefore_ = 0;  // the process's failures before this was made
  int lostPeer_ = -1;
  int unsaidPeer_ = -1;
  bool begun_ = false;  // the last begin() passed checkUsable (describeCurrent is about it)
  uint64_t finished_ = 0;  // the last collective that finished here without an error
  int64_t finishedAtMs_ = 0;  // when (transport::livenessMs, as heartbeat report ages)
  int wakeFd_ = -1;               // eventfd written by abort()
  std::atomic<bool> aborted_{false};
  std::atomic<bool> destroying_{false};  // set before aborted_ by abort(true)
  // abort() came before any destroy: the call it stopped says "aborted", not "destroyed"
  // (torch's _abort_process_group() aborts, then destroys at once).
  std::atomic<bool> abortedFirst_{false};
  [[noreturn]] void throwAborted() const;
  [[noreturn]] void throwElsewhere() const;
  bool elsewhereIsSelf() const;  // failFromElsewhere named this rank (its own failure)
  void checkStopped() const {
    if (aborted_.load()) throwAborted();
    if (elsewhere_.load(std::memory_order_acquire)) throwElsewhere();
  }
  std::atomic<bool> elsewhereClaimed_{false};
  std::atomic<bool> elsewhere_{false};  // published after the two below
  std::string elsewhereWhy_;
  transport::Culprit elsewhereWho_;
  // Current collective, for messages.
  CollectiveKind curKind_ = CollectiveKind::kBarrier;
  FrameHeader curHeader_;  // header of the current collective (checkIdle compares it)
  Algorithm curAlgo_ = Algorithm::kAuto;
  size_t bytesTotal_ = 0, bytesDone_ = 0;
  std::atomic<uint64_t> bytesSent_{0};  // written by the executor thread, read by any
};

}  // namespace rr::comm
