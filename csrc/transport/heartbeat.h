// Heartbeats: how every rank notices, within seconds, a peer that is frozen (SIGSTOP, a
// debugger, swapping), cut off by a partition, or dead without its sockets closing.
//
// One background thread per process (HeartbeatHub, heartbeat.cc) serves every running
// Heartbeat -- the world's, each group's and each point-to-point channel's: it sends each
// peer a small UDP datagram every `interval` and records when it last heard from each.
// Datagrams are authenticated (HMAC-SHA256 with the job secret, truncated) and carry the
// sender's pid and what it is doing (collective kind, sequence number, bytes done), so an
// error can say what the culprit was doing. The thread shares nothing with the data path
// but a few atomics.
//
// Liveness is shared per peer process: any authenticated datagram from a process (each
// carries a random number that process drew) shows it alive to every communicator of this
// process that has it as a member. The world's heartbeat is the carrier: it always runs at
// full rate. Another communicator (a group, a point-to-point channel) that is idle skips a
// peer the carrier reached within the last two periods (and heard from: a two-way live
// path), saying anything new in two rounds in a row and everything every kRefreshRounds
// rounds; so idle groups cost almost no traffic or CPU, and a frozen process still falls
// silent to all of them at once.
//
// A sparse communicator (above RINGREDUCE_FULL_MESH_MAX ranks) heartbeats its overlay only.
// A rank that waits for another peer (a lazy connection, its data, a p2p rendezvous) asks
// it for heartbeats (want()): its datagrams to that peer carry `ask`, and a rank asked
// answers the asker for a few periods after each ask. Both stop a few periods after the
// wait ends, so liveness traffic follows the waits, not the world size.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/socket.h"

namespace rr::transport {

struct PeerStatus {
  int64_t ageMs = -1;  // since the last datagram (-1: never heard)
  // Since the last datagram of this communicator, which the fields below come from (ageMs
  // counts any communicator's from that process): a busy peer's state may be older.
  int64_t reportAgeMs = -1;
  uint32_t pid = 0;
  uint64_t seq = 0;   // collective sequence number the peer is at
  uint8_t kind = 0;   // CollectiveKind it is in (0: idle)
  uint64_t bytesDone = 0;
  int waitingFor = -1;  // the rank it was blocked on (-1: none)
  int root = -1;        // root of collective `seq` (broadcast/reduce/gather/scatter; else 0),
                        // -1: not known for this seq
  int algo = -1;        // Algorithm collective `seq` runs (its header's), -1: not known
  bool left = false;    // its last datagram said it stopped (destroy()): silence is no failure
};

constexpr size_t kSiteBytes = 48;  // call site carried in a heartbeat ("train.py:57")

// The clock peers' silence is measured on: steady time, less the time this process's
// heartbeat thread could not run when it was due (the process stopped -- SIGSTOP, a
// debugger, a suspended job or VM -- or starved of CPU). Datagrams that arrived meanwhile
// were not read, so that time is no evidence against anyone: a job paused for longer than
// the heartbeat timeout blamed a healthy rank on resuming (found by a helper). Nanoseconds.
int64_t livenessNs();
// How late the heartbeat thread may run and still have that time counted (a scheduling
// delay); beyond it, the rest is a pause. Python's deadlines use the same (_C.LATE_S).
constexpr int64_t kLateNs = 250000000;
inline int64_t livenessMs() { return livenessNs() / 1000000; }

// The heartbeat MAC key of one init: HMAC(job secret, "rr-heartbeat/" + session), where
// session is a random value rank 0 draws per init. Sender counters restart with every init,
// so keying by the secret alone would let a datagram recorded in an earlier init of the
// same job (same secret) pass as fresh; under a per-init key it fails authentication.
// An empty session keys by the secret itself.
std::string heartbeatKey(const std::string& secret, const std::string& session);

class Heartbeat {
 public:
  // Binds a UDP socket on `host` (the same interface as the TCP listener), port 0.
  explicit Heartbeat(const std::string& host);
  ~Heartbeat();
  int port() const { return port_; }

  // Start sending to peers ("host:port" per rank; empty for this rank): to every one, or
  // (`always` not empty: one flag per rank) to those flagged only -- the others only while
  // this rank wants them or they want it. `key` signs and checks every datagram:
  // heartbeatKey(secret, session) in a communicator.
  void start(int rank, const std::vector<std::string>& peerAddrs, const std::string& key,
             double intervalSec, const std::vector<uint8_t>& always = {});
  void stop();

  // What this rank is doing, published in its heartbeats. Executor thread.
  // kind and seq share one atomic word so a datagram never pairs one collective's kind
  // with another's sequence number (peers compare them to detect mismatches).
  void setState(uint8_t kind, uint64_t seq, uint64_t bytesDone) {
    state_.store((static_cast<uint64_t>(kind) << 56) | (seq & ((uint64_t{1} << 56) - 1)),
                 std::memory_order_release);
    bytes_.store(bytesDone, std::memory_order_relaxed);
    waiting_.store(-1, std::memory_order_relaxed);
  }
  // The root of collective `seq` (its header's root), published before setState(kind, seq):
  // peers in the same rooted collective compare it, since ranks that disagree on the root
  // of a tree may all wait to receive. Stored with seq's low bits, so a datagram never
  // pairs one collective's root with another's number.
  void setRoot(uint64_t seq, int root) {
    root_.store((static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32) | (seq & 0xffffffffu),
                std::memory_order_release);
  }
  // The algorithm collective `seq` runs (its header's), published with it as setRoot's root:
  // ranks that run one collective with different algorithms (algo= per call: a tree on one,
  // shared memory on another) exchange no frame to compare, and wait for each other.
  void setAlgo(uint64_t seq, uint8_t algo) {
    algo_.store((static_cast<uint64_t>(algo) + 1) << 56 | (seq & ((uint64_t{1} << 56) - 1)),
                std::memory_order_release);
  }
  // The rank this one is blocked on inside the current collective (-1: none), so peers can
  // follow the chain of waits to the rank that holds everyone up.
  void setWaiting(int peer) { waiting_.store(peer, std::memory_order_relaxed); }
  // Where this rank's current (or last) collective was issued; sent with every heartbeat.
  // Truncated to kSiteBytes - 1 (the tail is kept). Any thread.
  void setSite(const std::string& site);
  // The communicator's name ("world", "group3"), before start(). Every heartbeat of this
  // process also says which collective the process runs on its *other* communicators
  // ("allreduce #5 on world"), so a peer waiting for this rank on one group learns that it
  // is blocked on another (ranks that called collectives on groups in different orders).
  // p2p: a point-to-point channel, whose transfers run as 2-rank broadcasts: named "send" /
  // "recv" by their root, as the channel's own messages name them.
  void setName(std::string name, bool p2p = false) {
    name_ = std::move(name);
    p2p_ = p2p;
  }
  // The world's heartbeat (before start()): carries this process's liveness (see above).
  void setCarrier(bool on) { carrier_ = on; }
  // Rounds an idle heartbeat with nothing new may skip peers the carrier reaches.
  static constexpr int kRefreshRounds = 16;
  // `ageMs`: since the last datagram from the peer's process on any communicator (once this
  // one has heard from it).
  PeerStatus status(int peer) const;
  // Ask `peer` (not an `always` target) for heartbeats for the next leaseNs() and send it
  // ours (at once when this starts a new run of asks). Returns the ms since this rank began
  // asking (the current run of calls, each within the lease of the last): its silence
  // counts from then. The thread that drives the communicator's waits.
  int64_t want(int peer);
  // Whether this rank heartbeats `peer` now (an `always` target, or wanted). Any thread.
  bool reaches(int peer) const;
  // How long an ask lasts, for the asker and for the rank asked: 4 periods, at least 1 s
  // (the waits that ask do so at least every 250 ms).
  int64_t leaseNs() const;
  // The call site peer `peer` last reported ("" if none). Takes a lock: for reports only.
  std::string site(int peer) const;
  // What peer `peer`'s process last said it runs on another communicator ("" if nothing).
  std::string elsewhere(int peer) const;
  bool running() const { return running_.load(std::memory_order_acquire); }
  // Peers this rank sends heartbeats to, and datagrams sent so far (link_stats). Any thread.
  int targets() const { return targets_; }
  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }
  // Datagrams not sent since the carrier spoke for this heartbeat (link_stats). Any thread.
  uint64_t skipped() const { return skipped_.load(std::memory_order_relaxed); }

 private:
  friend class HeartbeatHub;
  // A round to every target, or (`only` >= 0) one datagram to that peer (a new run of
  // asks, or a new asker's answer: a round to all would make asks cost O(targets)).
  void sendAll(bool bye = false, int only = -1);
  void receiveOne();

  struct Slot {
    std::atomic<int64_t> lastNs{0};
    std::atomic<uint32_t> pid{0};
    std::atomic<uint64_t> state{0};  // kind << 56 | seq, as sent
    std::atomic<uint64_t> bytes{0};
    std::atomic<int> waiting{-1};
    std::atomic<uint64_t> root{0};  // root << 32 | seq's low 32 bits, as setRoot; 0: none
    std::atomic<uint64_t> algo{0};  // (algo + 1) << 56 | seq, as setAlgo; 0: none
    std::atomic<bool> left{false};  // its last datagram was its goodbye
    std::atomic<uint64_t> proc{0};  // its process (HeartbeatHub::self there), as last heard
    // want() (the waiting thread) writes these; the hub's thread reads wantUntil.
    std::atomic<int64_t> wantUntil{0}, wantSince{0};  // asking it until; since
    std::atomic<int64_t> askedUntil{0};  // it asked: answered until (the hub's thread only)
  };

  tcp::Fd fd_;
  int port_ = 0;
  int rank_ = 0;
  std::string key_;  // MAC key (heartbeatKey)
  double interval_ = 0.5;
  std::vector<std::vector<uint8_t>> peerSockaddr_;  // sockaddr bytes per rank
  std::vector<uint8_t> always_;                     // per rank: sent to every round
  std::unique_ptr<Slot[]> slots_;
  size_t nslots_ = 0;
  std::atomic<uint64_t> state_{0}, bytes_{0};
  std::atomic<uint64_t> root_{0};  // setRoot
  std::atomic<uint64_t> algo_{0};  // setAlgo
  std::atomic<uint64_t> sent_{0}, skipped_{0};
  int targets_ = 0;
  bool carrier_ = false;
  std::atomic<int> waiting_{-1};
  mutable std::mutex siteMu_;  // guards site_, peerSite_ and peerElsewhere_
  std::string site_;
  std::vector<std::string> peerSite_, peerElsewhere_;
  std::string name_ = "world";
  bool p2p_ = false;
  // "allreduce #5 on world": a collective in progress on another communicator of this
  // process (the first found), "" if none. Sender thread.
  std::string busyElsewhere() const;
  // The hub's thread only (under its lock):
  int64_t periodNs_ = 0, nextNs_ = 0;  // send period; when the next round is due
  uint64_t counter_ = 0;                // strictly increasing in every datagram sent
  std::vector<uint64_t> lastCounter_;   // per peer: replays (older counters) are ignored
  std::vector<uint8_t> lastSaid_;       // the last datagram sent, less counter and MAC
  uint64_t quietRounds_ = 0;            // rounds in a row with nothing new to say
  std::atomic<bool> running_{false};  // between start() and stop() (want() reads it)
};

}  // namespace rr::transport
