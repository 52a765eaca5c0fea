#include "transport/heartbeat.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <unordered_map>

#include "core/deadline.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/types.h"

namespace rr::transport {
namespace {

constexpr uint32_t kMagic = 0x31424852;  // "RHB1"

struct Datagram {
  uint32_t magic;
  int32_t rank;
  uint32_t pid;
  int32_t waiting;  // the rank the sender is blocked on (-1: none)
  uint8_t kind, hasRoot, bye;  // bye: the sender's last datagram (it stopped)
  uint8_t ask;                 // the sender wants this rank's heartbeats (Heartbeat::want)
  uint8_t algo;                // Algorithm of collective `seq` + 1 (0: not known)
  uint8_t pad[7];              // explicit: every byte is covered by the MAC
  int32_t root;  // root of collective `seq` when hasRoot
  uint64_t seq;
  uint64_t bytes;
  uint64_t counter;      // strictly increasing per sender: replays are ignored
  uint64_t proc;         // the sender's process, drawn at random (HeartbeatHub::self)
  char site[kSiteBytes];  // NUL-terminated call site of the sender's collective
  char elsewhere[kSiteBytes];  // NUL-terminated: its process's collective on another comm
  uint8_t mac[16];       // truncated HMAC-SHA256 over everything above
};

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// livenessNs()'s state: when the hub's thread is due to run (it wakes by then, or the time
// past it, beyond kLateNs, is left out) and the time left out so far.
class LivenessClock {
 public:
  int64_t now() {
    std::lock_guard<std::mutex> g(mu_);
    const int64_t n = nowNs();
    return std::min(n, dueNs_ + kLateNs) - pausedNs_;
  }
  // The hub's thread: it runs now (the time it was late by, beyond kLateNs, is left out).
  void running() {
    std::lock_guard<std::mutex> g(mu_);
    const int64_t n = nowNs();
    if (dueNs_ != kNever && n > dueNs_ + kLateNs) pausedNs_ += n - (dueNs_ + kLateNs);
    dueNs_ = n;
  }
  // It sleeps until `due` (a datagram may wake it earlier); kNever: it stops.
  void sleeping(int64_t due) {
    std::lock_guard<std::mutex> g(mu_);
    dueNs_ = due;
  }
  static constexpr int64_t kNever = INT64_MAX / 2;

 private:
  std::mutex mu_;
  int64_t dueNs_ = kNever;
  int64_t pausedNs_ = 0;
};

LivenessClock*& livenessClockPtr() {
  static LivenessClock* c = nullptr;
  return c;
}

LivenessClock& livenessClock() {
  static const bool made = [] {
    // Never destroyed (any thread reads it); a forked child, which has no hub thread and
    // whose lock a parent thread may have held at the fork, starts a fresh one.
    ::pthread_atfork(nullptr, nullptr, [] { livenessClockPtr() = new LivenessClock(); });
    livenessClockPtr() = new LivenessClock();
    return true;
  }();
  (void)made;
  return *livenessClockPtr();
}

void sign(const std::string& key, Datagram* d) {
  auto m = crypto::hmacSha256(key.data(), key.size(), d, offsetof(Datagram, mac));
  std::memcpy(d->mac, m.data(), sizeof(d->mac));
}

// Every running heartbeat of this process (Heartbeat::busyElsewhere reads the others').
struct Registry {
  std::mutex mu;
  std::vector<const Heartbeat*> all;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: heartbeats may outlive statics
  return *r;
}

}  // namespace

// The one thread of a process that sends and receives every Heartbeat's datagrams: a
// thread per communicator would cost each group and each p2p channel a thread of its own.
// It runs while at least one Heartbeat does (the last stop() joins it: nothing stays after
// destroy) and services a Heartbeat only under mu_, so once remove() returns it never
// touches that one again.
class HeartbeatHub {
 public:
  static HeartbeatHub& get() {
    static HeartbeatHub* hub = [] {
      // A forked child has none of the parent's threads: it starts afresh (leaking the
      // parent's hub, whose lock a parent thread may have held at the fork).
      ::pthread_atfork(nullptr, nullptr, [] { instance() = new HeartbeatHub(); });
      return instance() = new HeartbeatHub();
    }();
    (void)hub;
    return *instance();
  }

  void add(Heartbeat* h) {
    std::lock_guard<std::mutex> g(mu_);
    beats_.push_back(h);
    if (!thread_.joinable()) {
      stop_ = std::make_shared<std::atomic<bool>>(false);
      if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
        beats_.pop_back();
        RR_THROW(Error, "heartbeat: pipe failed: ", std::strerror(errno));
      }
      thread_ = std::thread([this, stop = stop_, w = wake_[0]] {
        livenessClock().running();
        loop(*stop, w);
        livenessClock().sleeping(LivenessClock::kNever);  // no thread: nothing is due
      });
    } else {
      wake();  // its period may be due before the thread's next wake-up
    }
  }

  // Send `h`'s datagram to `peer` now (a peer it begins to want).
  void sendNow(Heartbeat* h, int peer) {
    std::lock_guard<std::mutex> g(mu_);
    if (std::find(beats_.begin(), beats_.end(), h) != beats_.end()) h->sendAll(false, peer);
  }

  void remove(Heartbeat* h) {
    std::thread last;
    int pipe[2] = {-1, -1};
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = std::find(beats_.begin(), beats_.end(), h);
      if (it == beats_.end()) return;
      h->sendAll(/*bye=*/true);  // peers stop expecting it: its silence is no failure
      beats_.erase(it);
      if (beats_.empty()) {  // the thread stops with the last heartbeat
        stop_->store(true);
        wake();
        last = std::move(thread_);
        std::copy(wake_, wake_ + 2, pipe);
        wake_[0] = wake_[1] = -1;
      }
    }
    if (last.joinable()) last.join();
    for (int f : pipe)
      if (f >= 0) ::close(f);
  }

 private:
  static HeartbeatHub*& instance() {
    static HeartbeatHub* p = nullptr;
    return p;
  }

  void wake() {
    char c = 1;
    ssize_t w = ::write(wake_[1], &c, 1);
    (void)w;
  }

  void loop(const std::atomic<bool>& stop, int wakeFd) {
    std::vector<pollfd> fds;
    std::vector<Heartbeat*> polled;
    while (true) {
      int64_t due = nowNs() + 1000000000;  // at least once a second: re-read the set
      {
        std::lock_guard<std::mutex> g(mu_);
        if (stop) return;
        const int64_t now = nowNs();
        prune(now);
        for (Heartbeat* h : beats_) {
          // A round due within 1/8 period goes out with this one: the rounds of all the
          // process's communicators fall into step, one wake-up serving them all.
          if (now + h->periodNs_ / 8 >= h->nextNs_) {
            h->sendAll();
            h->nextNs_ = now + h->periodNs_;
          }
          due = std::min(due, h->nextNs_);
        }
        polled = beats_;
        // Read each descriptor under the lock: once it is released, a stop() on another
        // thread may free a Heartbeat in `polled` (ThreadSanitizer found the read after it).
        fds.assign(1, pollfd{wakeFd, POLLIN, 0});
        for (Heartbeat* h : polled) fds.push_back(pollfd{h->fd_.get(), POLLIN, 0});
      }
      const int ms = static_cast<int>(std::max<int64_t>(0, due - nowNs()) / 1000000) + 1;
      livenessClock().sleeping(due + 1000000);
      const int rc = ::poll(fds.data(), fds.size(), ms);
      livenessClock().running();  // before the datagrams that came meanwhile are stamped
      if (rc < 0 && errno != EINTR) return;
      std::lock_guard<std::mutex> g(mu_);
      if (stop) return;
      if (fds[0].revents) {
        char buf[64];
        while (::read(wakeFd, buf, sizeof(buf)) > 0) {
        }
      }
      for (size_t i = 0; i < polled.size(); ++i) {
        if (!fds[i + 1].revents) continue;
        // Still registered (a stop() meanwhile: the object may be gone).
        if (std::find(beats_.begin(), beats_.end(), polled[i]) == beats_.end()) continue;
        for (int k = 0; k < 64; ++k) polled[i]->receiveOne();
      }
    }
  }

 public:
  // This process, to its peers: liveness is shared per process (heartbeat.h). Drawn at
  // random (not address + pid: ranks in containers share both, and a group may bind
  // another address than the world).
  uint64_t self() const { return self_; }
  // When any of this process's communicators last heard from process `proc` (read by
  // status(), any thread).
  void noteHeard(uint64_t proc, int64_t now) {
    std::lock_guard<std::mutex> g(heardMu_);
    heard_[proc] = now;
  }
  int64_t heardNs(uint64_t proc) {
    std::lock_guard<std::mutex> g(heardMu_);
    auto it = heard_.find(proc);
    return it == heard_.end() ? 0 : it->second;
  }
  // When the carrier last sent to process `proc` while hearing from it. Under mu_.
  void noteCarried(uint64_t proc, int64_t now) { carried_[proc] = now; }
  bool carriedSince(uint64_t proc, int64_t since) const {
    auto it = carried_.find(proc);
    return it != carried_.end() && it->second >= since;
  }

 private:
  // Forget processes not heard from or carried to for a minute (re-inits, ended peers).
  // Under mu_.
  void prune(int64_t now) {
    if (now < nextPruneNs_) return;
    nextPruneNs_ = now + 10 * kSecNs;
    dropOlder(carried_, now - 60 * kSecNs);
    const int64_t heardOld = livenessNs() - 60 * kSecNs;  // heard_ is on livenessNs()
    std::lock_guard<std::mutex> g(heardMu_);
    dropOlder(heard_, heardOld);
  }
  static void dropOlder(std::unordered_map<uint64_t, int64_t>& m, int64_t old) {
    for (auto it = m.begin(); it != m.end();) it = it->second < old ? m.erase(it) : std::next(it);
  }
  static uint64_t draw() {
    std::random_device rd;
    return ((uint64_t{rd()} << 32) ^ rd()) | 1;
  }
  static constexpr int64_t kSecNs = 1000000000;
  const uint64_t self_ = draw();  // a child after fork gets a new hub, so a new one
  std::unordered_map<uint64_t, int64_t> carried_;
  int64_t nextPruneNs_ = 0;
  std::mutex heardMu_;  // guards heard_ (after mu_ where both are taken)
  std::unordered_map<uint64_t, int64_t> heard_;

  std::mutex mu_;  // guards everything here, and every registered Heartbeat's hub fields
  std::vector<Heartbeat*> beats_;
  std::thread thread_;
  std::shared_ptr<std::atomic<bool>> stop_;  // the running thread's own stop flag
  int wake_[2] = {-1, -1};                    // the running thread's wake pipe
};

int64_t livenessNs() { return livenessClock().now(); }

std::string heartbeatKey(const std::string& secret, const std::string& session) {
  if (session.empty()) return secret;
  std::string msg = "rr-heartbeat/" + session;
  crypto::Digest k = crypto::hmacSha256(secret.data(), secret.size(), msg.data(), msg.size());
  return std::string(reinterpret_cast<const char*>(k.data()), k.size());
}

Heartbeat::Heartbeat(const std::string& host) {
  auto addrs = tcp::resolve(host, 0, SOCK_DGRAM, true, Deadline::after(tcp::kResolveTimeoutSec));
  if (addrs.empty()) RR_THROW(Error, "heartbeat: cannot resolve ", host);
  const auto* sa = reinterpret_cast<const sockaddr*>(addrs[0].data());
  fd_ = tcp::Fd(::socket(sa->sa_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd_.valid() || ::bind(fd_.get(), sa, static_cast<socklen_t>(addrs[0].size())) != 0)
    RR_THROW(Error, "heartbeat: cannot bind a UDP socket on ", host, ": ", std::strerror(errno));
  sockaddr_storage ss{};
  socklen_t sl = sizeof(ss);
  ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &sl);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

Heartbeat::~Heartbeat() { stop(); }

void Heartbeat::start(int rank, const std::vector<std::string>& peerAddrs,
                      const std::string& key, double intervalSec,
                      const std::vector<uint8_t>& always) {
  rank_ = rank;
  key_ = key;
  interval_ = intervalSec;
  nslots_ = peerAddrs.size();
  slots_.reset(new Slot[nslots_]);
  peerSockaddr_.assign(nslots_, {});
  always_.assign(nslots_, 0);
  {
    std::lock_guard<std::mutex> g(siteMu_);
    peerSite_.assign(nslots_, std::string());
  }
  // One deadline for all peers (numeric addresses, as init passes, need no lookup).
  const Deadline resolveBy = Deadline::after(tcp::kResolveTimeoutSec);
  for (size_t r = 0; r < nslots_; ++r) {
    if (static_cast<int>(r) == rank || peerAddrs[r].empty()) continue;
    tcp::Endpoint ep = tcp::parseEndpoint(peerAddrs[r]);
    auto addrs = tcp::resolve(ep.host, ep.port, SOCK_DGRAM, false, resolveBy);
    if (addrs.empty()) RR_THROW(Error, "heartbeat: cannot resolve peer ", peerAddrs[r]);
    peerSockaddr_[r] = std::move(addrs[0]);
    always_[r] = always.empty() || always[r] ? 1 : 0;
    targets_ += always_[r];
  }
  {
    std::lock_guard<std::mutex> g(siteMu_);
    peerElsewhere_.assign(nslots_, std::string());
  }
  lastCounter_.assign(nslots_, 0);
  lastSaid_.clear();
  quietRounds_ = 0;
  periodNs_ = static_cast<int64_t>(clampSeconds(interval_) * 1e9);
  nextNs_ = 0;  // the first round goes out at once
  {
    std::lock_guard<std::mutex> g(registry().mu);
    registry().all.push_back(this);
  }
  running_.store(true, std::memory_order_release);
  try {
    HeartbeatHub::get().add(this);
  } catch (...) {
    stop();
    throw;
  }
}

void Heartbeat::stop() {
  {
    std::lock_guard<std::mutex> g(registry().mu);
    auto& v = registry().all;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  if (running()) HeartbeatHub::get().remove(this);
  running_.store(false, std::memory_order_release);
}

PeerStatus Heartbeat::status(int peer) const {
  PeerStatus s;
  if (peer < 0 || static_cast<size_t>(peer) >= nslots_) return s;
  const Slot& sl = slots_[static_cast<size_t>(peer)];
  int64_t last = sl.lastNs.load(std::memory_order_acquire);
  const int64_t now = livenessNs();  // what lastNs and heardNs are stamped with
  s.reportAgeMs = last == 0 ? -1 : std::max<int64_t>(0, now - last) / 1000000;
  // Heard on this communicator: any communicator's word from that process counts since.
  const uint64_t proc = sl.proc.load(std::memory_order_relaxed);
  if (last != 0 && proc != 0) last = std::max(last, HeartbeatHub::get().heardNs(proc));
  s.ageMs = last == 0 ? -1 : std::max<int64_t>(0, now - last) / 1000000;
  s.pid = sl.pid.load(std::memory_order_relaxed);
  uint64_t st = sl.state.load(std::memory_order_relaxed);
  s.seq = st & ((uint64_t{1} << 56) - 1);
  s.kind = static_cast<uint8_t>(st >> 56);
  s.bytesDone = sl.bytes.load(std::memory_order_relaxed);
  s.waitingFor = sl.waiting.load(std::memory_order_relaxed);
  s.left = sl.left.load(std::memory_order_relaxed);
  const uint64_t rw = sl.root.load(std::memory_order_relaxed);
  // Only when it was sent with this very seq (the two words may come from two datagrams).
  if ((rw >> 63) && (rw & 0xffffffffu) == (s.seq & 0xffffffffu))
    s.root = static_cast<int>((rw >> 32) & 0x7fffffffu);
  const uint64_t aw = sl.algo.load(std::memory_order_relaxed);
  if ((aw >> 56) != 0 && (aw & ((uint64_t{1} << 56) - 1)) == s.seq)
    s.algo = static_cast<int>(aw >> 56) - 1;
  return s;
}

int64_t Heartbeat::leaseNs() const {
  return std::max<int64_t>(4 * static_cast<int64_t>(clampSeconds(interval_) * 1e9), 1000000000);
}

int64_t Heartbeat::want(int peer) {
  if (peer < 0 || static_cast<size_t>(peer) >= nslots_ || !running()) return 0;
  Slot& s = slots_[static_cast<size_t>(peer)];
  const int64_t now = nowNs(), live = livenessNs();  // the lease; the silence (wantSince)
  const bool fresh = s.wantUntil.load(std::memory_order_relaxed) <= now;
  if (fresh) s.wantSince.store(live, std::memory_order_relaxed);
  s.wantUntil.store(now + leaseNs(), std::memory_order_relaxed);
  if (fresh && !always_[static_cast<size_t>(peer)]) HeartbeatHub::get().sendNow(this, peer);
  return std::max<int64_t>(0, live - s.wantSince.load(std::memory_order_relaxed)) / 1000000;
}

bool Heartbeat::reaches(int peer) const {
  if (peer < 0 || static_cast<size_t>(peer) >= nslots_) return false;
  return always_[static_cast<size_t>(peer)] ||
         slots_[static_cast<size_t>(peer)].wantUntil.load(std::memory_order_relaxed) > nowNs();
}

void Heartbeat::setSite(const std::string& site) {
  std::lock_guard<std::mutex> g(siteMu_);
  site_ = site.size() < kSiteBytes ? site : site.substr(site.size() - (kSiteBytes - 1));
}

std::string Heartbeat::site(int peer) const {
  std::lock_guard<std::mutex> g(siteMu_);
  return peer >= 0 && static_cast<size_t>(peer) < peerSite_.size() ? peerSite_[peer] : "";
}

std::string Heartbeat::elsewhere(int peer) const {
  std::lock_guard<std::mutex> g(siteMu_);
  return peer >= 0 && static_cast<size_t>(peer) < peerElsewhere_.size() ? peerElsewhere_[peer] : "";
}

std::string Heartbeat::busyElsewhere() const {
  std::lock_guard<std::mutex> g(registry().mu);
  for (const Heartbeat* h : registry().all) {
    if (h == this) continue;
    const uint64_t st = h->state_.load(std::memory_order_acquire);
    const auto kind = static_cast<uint8_t>(st >> 56);
    if (kind == 0) continue;
    const uint64_t seq = st & ((uint64_t{1} << 56) - 1);
    const uint64_t rw = h->root_.load(std::memory_order_acquire);  // setRoot's, if seq's
    const int root = (rw & 0xffffffffu) == (seq & 0xffffffffu) ? static_cast<int>(rw >> 32) : -1;
    std::string s = detail::concat(kindName(static_cast<CollectiveKind>(kind), h->p2p_, root,
                                            h->rank_), " #", seq, " on ", h->name_);
    return s.substr(0, kSiteBytes - 1);
  }
  return "";
}

void Heartbeat::sendAll(bool bye, int only) {
  Datagram d{};
  d.magic = kMagic;
  d.bye = bye ? 1 : 0;
  d.rank = rank_;
  d.pid = static_cast<uint32_t>(::getpid());
  uint64_t st = state_.load(std::memory_order_acquire);
  const uint64_t rw = root_.load(std::memory_order_acquire);
  d.kind = static_cast<uint8_t>(st >> 56);
  d.seq = st & ((uint64_t{1} << 56) - 1);
  if ((rw & 0xffffffffu) == (d.seq & 0xffffffffu) &&  // else setRoot is for another seq
      static_cast<int32_t>(rw >> 32) >= 0) {
    d.hasRoot = 1;
    d.root = static_cast<int32_t>(rw >> 32);
  }
  const uint64_t aw = algo_.load(std::memory_order_acquire);
  if ((aw & ((uint64_t{1} << 56) - 1)) == d.seq) d.algo = static_cast<uint8_t>(aw >> 56);
  d.bytes = bytes_.load(std::memory_order_relaxed);
  d.waiting = waiting_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> g(siteMu_);
    std::memcpy(d.site, site_.data(), site_.size());  // < kSiteBytes; the rest stays 0
  }
  const std::string other = busyElsewhere();  // < kSiteBytes
  std::memcpy(d.elsewhere, other.data(), other.size());
  // Idle with nothing new to say (a bye, a collective, a change of site or of what the
  // process runs elsewhere go out at once): peers the carrier reaches are skipped.
  HeartbeatHub& hub = HeartbeatHub::get();
  d.proc = hub.self();
  const auto* said = reinterpret_cast<const uint8_t*>(&d);
  const bool same = d.kind == 0 && !bye && lastSaid_.size() == sizeof(d) &&
                    std::memcmp(lastSaid_.data(), said, sizeof(d)) == 0;
  // Something new goes out in two rounds in a row (one may be lost); then every
  // kRefreshRounds-th round in full.
  bool quiet = false;
  if (only < 0) {  // a round (a single datagram changes nothing of the rounds' rhythm)
    quietRounds_ = same ? quietRounds_ + 1 : 0;
    quiet = !carrier_ && quietRounds_ >= 2 && quietRounds_ % kRefreshRounds != 0;
    lastSaid_.assign(said, said + sizeof(d));  // counter and MAC are still 0 here
  }
  d.counter = ++counter_;
  const int64_t now = nowNs(), heardBy = livenessNs();  // (lastNs is on livenessNs())
  Datagram asking = d;  // the same, asking for heartbeats back (to peers this rank wants)
  asking.ask = 1;
  bool signed_ = false, signedAsk = false;
  const size_t first = only < 0 ? 0 : static_cast<size_t>(only);
  const size_t last = only < 0 ? nslots_ : std::min(first + 1, nslots_);
  for (size_t r = first; r < last; ++r) {
    if (peerSockaddr_[r].empty()) continue;
    const Slot& s = slots_[r];
    const bool want = s.wantUntil.load(std::memory_order_relaxed) > now;
    // Not an overlay peer: only while one of the two waits for the other (want()).
    const bool lease = want || s.askedUntil.load(std::memory_order_relaxed) > now;
    if (!always_[r] && !lease) continue;
    const uint64_t proc = s.proc.load(std::memory_order_relaxed);  // 0: not heard from yet
    if (quiet && !lease && proc && hub.carriedSince(proc, now - 2 * periodNs_)) {
      skipped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (want && !signedAsk) sign(key_, &asking);
    if (!want && !signed_) sign(key_, &d);
    signedAsk = signedAsk || want;
    signed_ = signed_ || !want;
    if (::sendto(fd_.get(), want ? &asking : &d, sizeof(d), MSG_DONTWAIT,
                 reinterpret_cast<const sockaddr*>(peerSockaddr_[r].data()),
                 static_cast<socklen_t>(peerSockaddr_[r].size())) <= 0)
      continue;
    sent_.fetch_add(1, std::memory_order_relaxed);
    // Carried only where the path is live both ways: the peer's own world heartbeat reached
    // this rank lately (so its socket is open) and it has not left.
    if (carrier_ && proc && !s.left.load(std::memory_order_relaxed) &&
        heardBy - s.lastNs.load(std::memory_order_relaxed) < 3 * periodNs_)
      hub.noteCarried(proc, now);
  }
}

void Heartbeat::receiveOne() {
  Datagram d;
  ssize_t n = ::recv(fd_.get(), &d, sizeof(d), MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(sizeof(d)) || d.magic != kMagic) return;  // noise: ignore
  if (d.rank < 0 || static_cast<size_t>(d.rank) >= nslots_ || d.rank == rank_) return;
  uint8_t mac[16];
  std::memcpy(mac, d.mac, sizeof(mac));
  sign(key_, &d);
  // Not from this init of this job (other secret, or an earlier init's session).
  if (!crypto::constantTimeEqual(mac, d.mac, sizeof(mac))) return;
  Slot& s = slots_[static_cast<size_t>(d.rank)];
  // A replayed (older) datagram changes nothing. Only the hub's thread touches lastCounter_.
  if (d.counter <= lastCounter_[static_cast<size_t>(d.rank)]) return;
  lastCounter_[static_cast<size_t>(d.rank)] = d.counter;
  s.pid.store(d.pid, std::memory_order_relaxed);
  s.state.store((static_cast<uint64_t>(d.kind) << 56) | (d.seq & ((uint64_t{1} << 56) - 1)),
                std::memory_order_relaxed);
  s.bytes.store(d.bytes, std::memory_order_relaxed);
  s.waiting.store(d.waiting, std::memory_order_relaxed);
  s.left.store(d.bye != 0, std::memory_order_relaxed);
  s.algo.store(d.algo ? static_cast<uint64_t>(d.algo) << 56 | (d.seq & ((uint64_t{1} << 56) - 1))
                      : 0,
               std::memory_order_relaxed);
  s.root.store(d.hasRoot ? (static_cast<uint64_t>(static_cast<uint32_t>(d.root)) << 32) |
                               (d.seq & 0xffffffffu) | (uint64_t{1} << 63)
                         : 0,
               std::memory_order_relaxed);
  d.site[kSiteBytes - 1] = 0;
  d.elsewhere[kSiteBytes - 1] = 0;
  {
    std::lock_guard<std::mutex> g(siteMu_);
    peerSite_[static_cast<size_t>(d.rank)].assign(d.site);
    peerElsewhere_[static_cast<size_t>(d.rank)].assign(d.elsewhere);
  }
  const int64_t now = nowNs();
  if (d.ask && !always_[static_cast<size_t>(d.rank)] && !d.bye) {
    // Answered for a lease (the asker asks every period while it waits); a new asker at
    // once, with one datagram, so its wait hears from this rank within one round trip.
    const bool fresh = s.askedUntil.load(std::memory_order_relaxed) <= now;
    s.askedUntil.store(now + leaseNs(), std::memory_order_relaxed);
    if (fresh) sendAll(false, d.rank);
  }
  const int64_t heard = livenessNs();
  s.proc.store(d.proc, std::memory_order_relaxed);
  if (d.proc) HeartbeatHub::get().noteHeard(d.proc, heard);
  s.lastNs.store(heard, std::memory_order_release);
}

}  // namespace rr::transport
