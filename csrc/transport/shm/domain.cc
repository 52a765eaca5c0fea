#include "transport/shm/domain.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/spin.h"
#include "transport/shm/cma.h"
#include "transport/shm/liveness.h"

namespace rr::transport::shm {
namespace {

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

void futexWait(std::atomic<uint32_t>* addr, uint32_t expected, long ns) {
  timespec ts{0, ns};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWake(std::atomic<uint32_t>* addr) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, 1 << 30, nullptr, nullptr, 0);
}

}  // namespace

ShmDomain::ShmDomain(int rank, std::vector<int> members, const std::string& prefix,
                     const ShmConfig& cfg)
    : rank_(rank), world_(static_cast<int>(members.size())), members_(std::move(members)),
      cfg_(cfg) {
  RR_CHECK(rank_ >= 0 && rank_ < world_, "local rank ", rank_, " of ", world_);
  RR_CHECK(cfg_.slots >= 2 && cfg_.chunkBytes >= 4096 && cfg_.chunkBytes % 64 == 0 &&
               cfg_.copyBytes >= 4096 && cfg_.copyBytes % 64 == 0 &&
               cfg_.copyBytes <= cfg_.chunkBytes,
           "bad shm config");
  // A point-to-point channel only copies: one size of slot, never grown (see lazySlots).
  if (cfg_.lazySlots) cfg_.chunkBytes = cfg_.copyBytes;
  lineOff_ = roundUp(sizeof(Control), 4096);
  lineBytes_ = roundUp(sizeof(LineHeader) + cfg_.smallMax, 64);
  slotOff_ = roundUp(lineOff_ + 2 * lineBytes_, 4096);
  total_ = slotOff_ + static_cast<size_t>(cfg_.slots) * cfg_.chunkBytes;
  grown_ = cfg_.chunkBytes == cfg_.copyBytes || cfg_.copyBytes % 4096 || cfg_.chunkBytes % 4096;
  slotsMapped_.assign(static_cast<size_t>(world_), 0);
  own_ = Segment::create(prefix + "-" + std::to_string(globalRank(rank_)), total_, ranges(true));
  Control* ctl = new (own_.data()) Control();
  ctl->pid.v.store(static_cast<uint64_t>(::getpid()), std::memory_order_relaxed);
  ctl->probeAddr.v.store(probeAddress(), std::memory_order_relaxed);
  ctl->startTime.v.store(processStartTime(), std::memory_order_relaxed);
  ctl->probeValue.v.store(probeValue(), std::memory_order_release);
  for (int i = 0; i < 2; ++i)
    new (own_.data() + lineOff_ + static_cast<size_t>(i) * lineBytes_) LineHeader();
  peers_.resize(static_cast<size_t>(world_));
  base_.assign(static_cast<size_t>(world_), nullptr);
  base_[static_cast<size_t>(rank_)] = own_.data();
}

std::vector<Segment::Range> ShmDomain::ranges(bool first) const {
  std::vector<Segment::Range> out;
  if (first) out.push_back({0, slotOff_});  // control and lines
  // lazySlots: later, one rank at a time (mapSlots); slotsLater: all at once (finishSlots)
  if (cfg_.lazySlots || (first && cfg_.slotsLater)) return out;
  for (const Segment::Range& x : slotRanges(first)) out.push_back(x);
  return out;
}

std::vector<Segment::Range> ShmDomain::slotRanges(bool first) const {
  std::vector<Segment::Range> out;
  if (grown_) {  // one size of slot: all of it at once
    if (first) out.push_back({slotOff_, total_ - slotOff_});
    return out;
  }
  for (size_t k = 0; k < static_cast<size_t>(cfg_.slots); ++k) {
    const size_t at = slotOff_ + k * cfg_.chunkBytes;
    if (first)
      out.push_back({at, cfg_.copyBytes});
    else
      out.push_back({at + cfg_.copyBytes, cfg_.chunkBytes - cfg_.copyBytes});
  }
  return out;
}

size_t ShmDomain::firstSlotBytes() const {
  size_t bytes = 0;
  for (const Segment::Range& x : slotRanges(true)) bytes += x.len;
  return bytes;
}

bool ShmDomain::allocOwn(const std::vector<Segment::Range>& rs) {
  for (const Segment::Range& x : rs)
    if (!own_.populate(x, true)) {
      for (const Segment::Range& y : rs) own_.release(y);
      return false;
    }
  return true;
}

void ShmDomain::mapPeer(int r, const std::vector<Segment::Range>& rs) {
  for (const Segment::Range& x : rs)
    if (!peers_[static_cast<size_t>(r)].populate(x, false))
      RR_THROW(Error, "cannot map the slots of local rank ", r, "'s shared memory segment");
}

bool ShmDomain::allocOwnSlots() { return allocOwn(slotRanges(true)); }

void ShmDomain::finishSlots(bool everyone) {
  if (!everyone) {
    for (const Segment::Range& x : slotRanges(true)) own_.release(x);
    return;  // still pending: the next collective that needs them tries again
  }
  for (int r = 0; r < world_; ++r)
    if (r != rank_) mapPeer(r, slotRanges(true));
  slotsReady_ = true;
}

void ShmDomain::mapSlots(int r) {
  if (r != rank_) {
    mapPeer(r, slotRanges(true));
  } else if (!allocOwnSlots()) {
    RR_THROW(Error, "cannot allocate ", firstSlotBytes() >> 10, " KiB of shared memory for the slots of ",
             own_.name(), ": /dev/shm is full or too small (free it, destroy groups no longer "
             "used, enlarge it (docker --shm-size), or set RINGREDUCE_TRANSPORT=tcp)");
  }
  slotsMapped_[static_cast<size_t>(r)] = 1;
}

void ShmDomain::attach(const std::vector<std::string>& names) {
  RR_CHECK_EQ(names.size(), static_cast<size_t>(world_), "segment names, one per local rank");
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    Segment& s = peers_[static_cast<size_t>(r)];
    s = Segment::open(names[static_cast<size_t>(r)], total_);
    for (const Segment::Range& x : ranges(true))
      if (!s.populate(x, false))
        RR_THROW(Error, "cannot map the shared memory segment ", s.name(), " of local rank ", r);
    base_[static_cast<size_t>(r)] = s.data();
  }
}

void ShmDomain::publishAbort(uint8_t code, const std::string& reason, Culprit who) {
  Control& c = ctl(rank_);
  if (c.abortCode.v.load(std::memory_order_relaxed)) return;
  const size_t n = std::min(reason.size(), sizeof(c.abortReason) - 1);
  std::memcpy(c.abortReason, reason.data(), n);
  c.abortReason[n] = '\0';
  c.abortCulprit.v.store(encodeCulprit(who), std::memory_order_relaxed);
  c.abortCause.v.store(static_cast<uint32_t>(who.cause), std::memory_order_relaxed);
  c.abortCode.v.store(static_cast<uint32_t>(code) + 1, std::memory_order_release);
  notify();
}

void ShmDomain::publishLeft(const std::string& why, uint64_t lastSeq, Culprit who) {
  Control& c = ctl(rank_);
  if (!c.abortCode.v.load(std::memory_order_relaxed)) {  // the reason slot is free
    const size_t n = std::min(why.size(), sizeof(c.abortReason) - 1);
    std::memcpy(c.abortReason, why.data(), n);
    c.abortReason[n] = '\0';
    c.abortCulprit.v.store(encodeCulprit(who), std::memory_order_relaxed);
    c.abortCause.v.store(static_cast<uint32_t>(who.cause), std::memory_order_relaxed);
  }
  c.leftAfter.v.store(lastSeq, std::memory_order_relaxed);
  c.left.v.store(1, std::memory_order_release);  // after the reason: readers see both
  notify();
}

std::string ShmDomain::leftWhy(int r) {
  Control& c = ctl(r);
  if (!leftOf(r) || c.abortCode.v.load(std::memory_order_acquire)) return "";
  return std::string(c.abortReason, strnlen(c.abortReason, sizeof(c.abortReason)));
}

Culprit ShmDomain::leftCulprit(int r) {
  Control& c = ctl(r);
  if (!leftOf(r) || c.abortCode.v.load(std::memory_order_acquire)) return {};
  return decodeCulprit(c.abortCulprit.v.load(std::memory_order_relaxed),
                       c.abortCause.v.load(std::memory_order_relaxed));
}

uint32_t ShmDomain::abortOf(int r, std::string* reason, Culprit* who) {
  Control& c = ctl(r);
  const uint32_t code = c.abortCode.v.load(std::memory_order_acquire);
  if (code && reason)
    *reason = std::string(c.abortReason, strnlen(c.abortReason, sizeof(c.abortReason)));
  if (code && who) {
    const uint32_t v = c.abortCulprit.v.load(std::memory_order_relaxed);
    const uint32_t cause = c.abortCause.v.load(std::memory_order_relaxed);
    *who = decodeCulprit(v, cause <= static_cast<uint32_t>(PeerCause::kHandshake)
                                ? cause : static_cast<uint32_t>(PeerCause::kClosed));
  }
  return code;
}

bool ShmDomain::cmaReadable() {
  int known = cma_.load(std::memory_order_relaxed);
  if (known < 0) {
    // Probed into a local and published once: Python's cma_readable() may ask while the
    // executor's first large collective does (a provisional 1 seen by the other thread
    // would pick cross-memory reads that fail).
    known = 1;
    for (int r = 0; r < world_ && known; ++r) {
      if (r == rank_) continue;
      Control& p = ctl(r);
      known = canRead(static_cast<pid_t>(p.pid.v.load(std::memory_order_acquire)),
                      p.probeAddr.v.load(std::memory_order_relaxed),
                      p.probeValue.v.load(std::memory_order_relaxed));
    }
    cma_.store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

bool ShmDomain::growOwn() { return allocOwn(ranges(false)); }

void ShmDomain::finishGrow(bool everyone) {
  if (!everyone) {
    for (const Segment::Range& x : ranges(false)) own_.release(x);
    growFailed_ = true;
    return;
  }
  for (int r = 0; r < world_; ++r)
    if (r != rank_) mapPeer(r, ranges(false));
  grown_ = true;
}

void ShmDomain::waitUntil(const std::function<bool()>& ready, const std::function<void()>& check,
                          bool spin) {
  if (ready()) return;
  auto relaxed = [&ready] {
    RR_CPU_RELAX();
    return ready();
  };
  if (spin && cfg_.spinUs > 0) {
    for (int i = 0; i < 256; ++i)  // a peer about to arrive: no clock read
      if (relaxed()) return;
    if (spinFor(cfg_.spinUs, 64, relaxed)) return;
  } else if (spin && spinFor(cfg_.yieldUs, 16, [&ready] {
               ::sched_yield();
               return ready();
             })) {
    return;
  }
  for (int i = 0; i < cfg_.yieldIters; ++i) {
    ::sched_yield();
    if (ready()) return;
  }
  Control& me = ctl(rank_);
  while (true) {
    uint32_t bell = me.bell.v.load(std::memory_order_acquire);
    me.sleeping.v.store(1, std::memory_order_seq_cst);
    if (ready()) {
      me.sleeping.v.store(0, std::memory_order_relaxed);
      return;
    }
    futexWait(&me.bell.v, bell, 2'000'000);  // 2 ms: bounded so `check` runs regularly
    me.sleeping.v.store(0, std::memory_order_relaxed);
    if (ready()) return;
    check();  // may return when ready() holds after all (shm_common.h waitFor)
  }
}

void ShmDomain::notify() {
  // Pairs with the seq_cst store of `sleeping` in waitUntil: either the sleeper sees our
  // update when it re-checks, or we see it sleeping here and ring its bell.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    Control& c = ctl(r);
    if (c.sleeping.v.load(std::memory_order_relaxed)) {
      c.bell.v.fetch_add(1, std::memory_order_release);
      futexWake(&c.bell.v);
    }
  }
}

}  // namespace rr::transport::shm
