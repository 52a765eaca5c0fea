// ShmDomain: the shared-memory state of one communicator whose ranks share a host.
//
// Every rank owns one segment (segment.h) and maps every peer's:
//
//   [ Control: doorbell, sleeping flag, progress counters, each in its own cache line ]
//   [ Line 0 | Line 1 ]  header (seq + collective descriptor + <= 40 payload bytes in the
//                        same cache line) followed by up to smallMax payload bytes
//   [ Slot 0 | ... | Slot K-1 ]  chunk buffers for pipelined large collectives
//
// A slot's first copyBytes are allocated with the segment; the rest only when the first
// large all-reduce grows the slots (chunkBytesNow), so /dev/shm holds what is used.
//
// Lines are used by parity of a round counter (every line round of every collective, the
// same on all local ranks); a rank rewrites a line only after every peer reported
// (lineDone) that it finished reading the previous use, so no trailing barrier is needed. Slot k holds global chunk g with g % K == k; counters
// pub/red/fin (global chunk index + 1) say how far a rank has published, reduced and
// consumed, and are never reset, so collectives chain without extra synchronisation.
//
// Waiting spins briefly, then yields, then sleeps on the rank's own futex doorbell that
// peers ring after updating a counter; every wait calls `check` every few milliseconds,
// which enforces the deadline and notices dead peers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "transport/frame.h"
#include "transport/shm/segment.h"

namespace rr::transport::shm {

struct alignas(64) Word32 {
  std::atomic<uint32_t> v{0};
};
struct alignas(64) Word64 {
  std::atomic<uint64_t> v{0};
};

struct Control {
  Word32 bell;      // futex doorbell of the owner
  Word32 sleeping;  // 1 while the owner sleeps on its bell
  Word32 pub;       // chunks published into slots (global index + 1)
  Word32 red;       // chunks whose owner slice is reduced
  Word32 fin;       // chunks fully consumed by the owner
  Word64 lineDone;  // last seq whose peer lines the owner has finished reading
  Word64 pid;       // the owner's process and its probe word (cma.h), set at creation
  Word64 probeAddr;
  Word64 probeValue;
  Word64 startTime;  // the owner's start time (liveness.h: verifies pid before a pidfd)
  // What the owner's connections would say (liveness.h): its failure -- an AbortCode + 1,
  // written last (release), after the reason -- and that it left on purpose.
  Word32 abortCode;
  Word32 abortCulprit;  // with abortCode kPeer: the rank it lost + 1 (0: none), and how
  Word32 abortCause;
  Word32 left;
  Word64 leftAfter;  // with left: the last collective the owner began (written before left)
  char abortReason[1024];  // NUL-terminated, truncated
};

struct alignas(64) LineHeader {
  std::atomic<uint64_t> round;  // written last (release): the line is complete
  uint64_t seq;                 // collective sequence number, checked like a frame header
  uint8_t kind, dtype, op, algo;
  int32_t root;
  uint64_t count;
  uint8_t inlineData[32];  // first payload bytes share the cache line with the flag
};
static_assert(sizeof(LineHeader) == 64, "line header is one cache line");

struct ShmConfig {
  size_t smallMax = 16 * 1024;    // largest payload of the one-round small path
  // Slot size: the large all-reduce's (and reduce's) chunk, n slices of it per chunk
  // (collectives/planner.cc sizes it from the local ranks).
  size_t chunkBytes = 512 * 1024;
  // Pipelining unit of the collectives that only copy (all-to-all, all-gather,
  // reduce-scatter, broadcast, gather, scatter): <= chunkBytes, a slot's first copyBytes.
  size_t copyBytes = 512 * 1024;
  int slots = 4;                  // chunks in flight
  // A point-to-point channel (Options::p2pChannel): a rank's slots are allocated when it
  // first writes them (its first message larger than a line) and mapped by its peer when
  // it first reads them, so a receiver never holds slots and a channel of small messages
  // holds only its control blocks and lines (~40 KiB per rank instead of ~2 MiB).
  bool lazySlots = false;
  // A group (not the world): no slots until its first collective that needs them, which
  // allocates them on every member at once (collectives/shm_common.h ensureSlots) -- an
  // idle group, or one of small messages only, holds ~40 KiB per rank.
  bool slotsLater = false;
  // Spin this long before yielding (0 when ranks outnumber cores). Longer than a futex
  // wake-up on a busy VM (~100-150 us), or two ranks fall into waking each other up on
  // every message instead of catching each other while spinning.
  double spinUs = 1000.0;
  // Ranks outnumber cores (spinUs 0): a synchronous caller yields its core this long before
  // sleeping instead -- the peers it waits for need that core, and a futex sleep + wake per
  // message costs more than the message (4 ranks on 2 cores: 8 B all-reduce 1.3x -> 0.9x
  // Open MPI's, which yields without ever sleeping).
  double yieldUs = 1000.0;
  int yieldIters = 50;  // then (and on the worker thread, which must leave its core to the
                        // caller's computation) this many yields before sleeping
};

class ShmDomain {
 public:
  // Creates this rank's segment "<prefix>-<global rank>-<pid>-<random>" (segment.h).
  // `members` are the global ranks sharing this host, ascending; this rank is members[rank].
  ShmDomain(int rank, std::vector<int> members, const std::string& prefix, const ShmConfig& cfg);
  // The name peers must pass to attach(); only its creator knows it until told.
  const std::string& ownName() const { return own_.name(); }
  // Map every peer's segment; names[r] is local rank r's ownName() (ours is ignored).
  void attach(const std::vector<std::string>& names);
  // Remove our name from /dev/shm (after every peer attached).
  void unlinkOwn() { own_.unlink(); }

  int rank() const { return rank_; }    // index among the local ranks
  int world() const { return world_; }  // number of local ranks
  int globalRank(int local) const { return members_[static_cast<size_t>(local)]; }
  // The local index of communicator rank `global`, or -1 if it is not on this host.
  int localIndex(int global) const {
    for (size_t i = 0; i < members_.size(); ++i)
      if (members_[i] == global) return static_cast<int>(i);
    return -1;
  }
  const ShmConfig& config() const { return cfg_; }

  Control& ctl(int r) { return *reinterpret_cast<Control*>(base_[static_cast<size_t>(r)]); }
  LineHeader& line(int r, uint64_t round) {
    return *reinterpret_cast<LineHeader*>(base_[static_cast<size_t>(r)] + lineOff_ +
                                          (round & 1) * lineBytes_);
  }
  // Payload of a line: starts in the header's inline bytes and continues after it.
  char* linePayload(int r, uint64_t round) {
    return reinterpret_cast<char*>(line(r, round).inlineData);
  }
  // Start the next line round (same numbering on every local rank).
  uint64_t nextRound() { return ++round_; }
  // Local rank `r` has written its line of the round this rank runs next (it started a
  // collective this rank has not): a probe for point-to-point receives from any source.
  bool lineAhead(int r) {
    const uint64_t next = round_ + 1;
    return line(r, next).round.load(std::memory_order_acquire) == next;
  }
  // Chunk size of the large all-reduce (and reduce) now: cfg.chunkBytes once the slots
  // have grown to it, cfg.copyBytes until then (and for good when /dev/shm had no room).
  // A segment starts with only each slot's first copyBytes allocated, so a communicator
  // that never runs a large all-reduce (most groups) holds a quarter or less of its slots.
  size_t chunkBytesNow() const { return grown_ ? cfg_.chunkBytes : cfg_.copyBytes; }
  // The first large all-reduce grows the slots, in three steps every local rank takes in
  // the same collective: growOwn() allocates the rest of this rank's slots (false: no room
  // in /dev/shm), the ranks tell each other the outcome (a line round), and
  // finishGrow(every rank succeeded) maps the peers' new pages -- or gives back whatever
  // this rank allocated and stays at copyBytes chunks.
  bool growPending() const { return !grown_ && !growFailed_; }
  bool growOwn();
  void finishGrow(bool everyone);
  // slotsLater: the slots are not allocated yet. The first collective that needs them
  // takes three steps on every local rank: allocOwnSlots() (false: no room in /dev/shm),
  // a line round telling the others the outcome, finishSlots(every rank succeeded), which
  // maps the peers' slots -- or gives back this rank's and leaves them pending.
  bool slotsPending() const { return cfg_.slotsLater && !slotsReady_; }
  bool allocOwnSlots();
  void finishSlots(bool everyone);
  // Bytes of slots a rank allocates then (each slot's first copyBytes).
  size_t firstSlotBytes() const;
  // Before the first use of local rank `r`'s slots on a lazySlots domain: allocate ours
  // (throws rr::Error saying what to do when /dev/shm has no room) or map the peer's (which
  // it allocated before publishing anything in them). A no-op otherwise and after the first.
  void needSlots(int r) {
    if (cfg_.lazySlots && !slotsMapped_[static_cast<size_t>(r)]) mapSlots(r);
  }
  char* slot(int r, uint32_t g) {
    return base_[static_cast<size_t>(r)] + slotOff_ + (g % static_cast<uint32_t>(cfg_.slots)) * cfg_.chunkBytes;
  }

  // Where the next chunked collective's chunks start (identical on every rank).
  uint32_t chunkBase() const { return chunkBase_; }
  void advanceChunks(uint32_t n) { chunkBase_ += n; }
  // Previous round that used line (round & 1), 0 if none.
  uint64_t& linePrevRound(uint64_t round) { return linePrev_[round & 1]; }

  // Spin, yield, then sleep until ready() holds; `check` runs every few ms while sleeping
  // and throws to give up (deadline, dead peer).
  // spin=false skips the spin phase (see Communicator::spinAllowed).
  void waitUntil(const std::function<bool()>& ready, const std::function<void()>& check,
                 bool spin = true);
  // Wake peers sleeping on their doorbell after this rank updated its counters/lines.
  void notify();
  // This rank failed (`code`: an AbortCode) / leaves on purpose: tell the local peers
  // through its control block (liveness.h), then wake them.
  void publishAbort(uint8_t code, const std::string& reason, Culprit who);
  // `why`: "" or the failure (on another communicator of its process) it leaves after.
  void publishLeft(const std::string& why, uint64_t lastSeq, Culprit who = {});
  // Local rank `r`'s failure: its AbortCode + 1, *reason and *who (the rank it lost, if
  // any), or 0 (none).
  uint32_t abortOf(int r, std::string* reason, Culprit* who = nullptr);
  bool leftOf(int r) { return ctl(r).left.v.load(std::memory_order_acquire) != 0; }
  // publishLeft's `why` of local rank `r` ("" if none, or it has not left).
  std::string leftWhy(int r);
  // publishLeft's `lastSeq` of local rank `r` (once leftOf(r)).
  uint64_t leftAfter(int r) { return ctl(r).leftAfter.v.load(std::memory_order_relaxed); }
  // publishLeft's `who` of local rank `r` (rank -1: none, or it has not left).
  Culprit leftCulprit(int r);
  // Whether this rank can read every local peer's memory with process_vm_readv (cma.h):
  // probed once, on first use (after attach).
  bool cmaReadable();
  // Bytes this rank read from peers with process_vm_readv so far (tests, benchmarks).
  void addCmaBytes(size_t n) { cmaBytes_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t cmaBytes() const { return cmaBytes_.load(std::memory_order_relaxed); }

 private:
  int rank_, world_;
  std::vector<int> members_;
  ShmConfig cfg_;
  size_t lineOff_ = 0, lineBytes_ = 0, slotOff_ = 0, total_ = 0;
  Segment own_;
  std::vector<Segment> peers_;
  std::vector<char*> base_;
  uint32_t chunkBase_ = 0;
  bool grown_ = true, growFailed_ = false;
  // first: what a new segment allocates (control, lines, each slot's copy part); else the
  // rest of the slots (empty when there is one size of slot).
  std::vector<Segment::Range> ranges(bool first) const;
  std::vector<Segment::Range> slotRanges(bool first) const;  // ranges' slot parts
  std::vector<uint8_t> slotsMapped_;  // lazySlots: local rank r's slots are mapped here
  bool slotsReady_ = false;           // slotsLater: finishSlots(true) ran
  void mapSlots(int r);
  // Allocate our pages of `rs` (false, with none of them kept: no room in /dev/shm) / map
  // local rank r's (throws: a peer's pages it allocated should always map).
  bool allocOwn(const std::vector<Segment::Range>& rs);
  void mapPeer(int r, const std::vector<Segment::Range>& rs);
  uint64_t linePrev_[2] = {0, 0};
  std::atomic<int> cma_{-1};  // cmaReadable: -1 not probed yet, 0 no, 1 yes (any thread)
  std::atomic<uint64_t> cmaBytes_{0};
  uint64_t round_ = 0;
};

// Wrap-around aware "a >= b" for the u32 counters.
inline bool reached(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

}  // namespace rr::transport::shm
