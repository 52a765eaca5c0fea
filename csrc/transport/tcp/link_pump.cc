// The pump of links (link.h): one thread per process moves every link's sub-frames between
// its socket and its streams' buffers, non-blocking, a bounded amount per link per round.
#include <errno.h>
#include <linux/sock_diag.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "transport/tcp/link_state.h"

namespace rr::transport::tcp {

namespace {
// The spans of iov[0..n) from byte `off` on, at most `len` bytes, into out (room for `max`).
int slice(const iovec* iov, int n, size_t off, size_t len, iovec* out, int max) {
  int k = 0;
  for (int i = 0; i < n && len > 0 && k < max; ++i) {
    if (off >= iov[i].iov_len) {
      off -= iov[i].iov_len;
      continue;
    }
    const size_t take = std::min(iov[i].iov_len - off, len);
    out[k++] = {static_cast<char*>(iov[i].iov_base) + off, take};
    len -= take;
    off = 0;
  }
  return k;
}

// A socket call made with the link's lock released (the caller holds rxBusy or txBusy,
// which keeps other threads off that direction of the socket); errno is the call's.
template <class Call>
ssize_t unlocked(std::unique_lock<std::mutex>& g, Call call) {
  g.unlock();
  const ssize_t r = call();
  const int e = errno;
  g.lock();
  errno = e;
  return r;
}
}  // namespace

Hub& Hub::get() {
  // Never destroyed: no thread may outlive a static's destructor. A forked child has none of
  // the parent's threads and starts afresh (leaking the parent's hub, whose links it never
  // serves): with the parent's, a child's own world waited in remove() for a pump round
  // that never came -- destroy() hung (a helper's fork hunt).
  static Hub** h = [] {
    static Hub* cur = new Hub;
    ::pthread_atfork(nullptr, nullptr, [] { cur = new Hub; });
    return &cur;
  }();
  return **h;
}

Hub::Hub() : wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!wake_.valid()) RR_THROW(Error, "eventfd failed: ", std::strerror(errno));
}

void Hub::add(const std::shared_ptr<Link>& l) {
  std::lock_guard<std::mutex> life(life_);
  {
    std::lock_guard<std::mutex> g(mu_);
    links_.push_back(l);
    stop_ = false;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  wake();
}

void Hub::remove(const Link* l) {
  std::lock_guard<std::mutex> life(life_);
  bool last;
  {
    std::unique_lock<std::mutex> g(mu_);
    auto it = std::find_if(links_.begin(), links_.end(), [l](auto& p) { return p.get() == l; });
    if (it == links_.end()) return;
    links_.erase(it);
    last = links_.empty();
    if (last) stop_ = true;
    const uint64_t target = rounds_ + 1;  // the round that may hold it ends
    wake();
    if (!last) roundDone_.wait(g, [&] { return rounds_ >= target; });
  }
  if (last && thread_.joinable()) thread_.join();
}

void Hub::wake() {
  uint64_t v = 1;
  while (::write(wake_.get(), &v, sizeof v) < 0 && errno == EINTR) {}
}

bool Hub::running() {
  std::lock_guard<std::mutex> life(life_);
  return thread_.joinable();
}

void Hub::loop() {
  // Signals go to the threads that run Python's handlers, not to the pump.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  pthread_setname_np(pthread_self(), "rr-link-pump");
  std::vector<std::shared_ptr<Link>> snap;
  std::vector<pollfd> pfds;
  while (true) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return;
      snap = links_;
    }
    pfds.assign(1, {wake_.get(), POLLIN, 0});
    // The wake eventfd covers every change a stream makes; the timeout is a safety net, or
    // the end of a wait for a direct reader.
    int ms = 1000;
    const auto now = std::chrono::steady_clock::now();
    for (auto& l : snap) {
      Link::Impl& k = *l->impl_;
      std::lock_guard<std::mutex> g(k.mu);
      const bool leave = k.leftToUsers(now);  // not even POLLHUP: no spin
      if (leave)
        ms = std::min<int>(ms, 1 + static_cast<int>(std::chrono::duration_cast<
                                   std::chrono::milliseconds>(k.deferUntil - now).count()));
      // Another thread writing (txBusy) sends what there is, and wakes the pump for what
      // it leaves: polling for room meanwhile would spin.
      const bool out = !k.txBusy && k.wantsOut();
      const short ev = static_cast<short>((leave ? 0 : POLLIN) | (out ? POLLOUT : 0));
      pfds.push_back({k.down() || (leave && !out) ? -1 : k.fd.get(), ev, 0});
    }
    if (::poll(pfds.data(), pfds.size(), ms) < 0 && errno != EINTR)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // cannot happen; no spin
    uint64_t v;
    (void)!::read(wake_.get(), &v, sizeof v);
    for (size_t i = 0; i < snap.size(); ++i) {
      Link::Impl& k = *snap[i]->impl_;
      bool due;
      {
        std::lock_guard<std::mutex> g(k.mu);
        due = k.deferred && std::chrono::steady_clock::now() >= k.deferUntil;
      }
      if (due || (pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) k.pumpRead(snap[i]->peer_);
      k.pumpWrite();
    }
    snap.clear();
    std::lock_guard<std::mutex> g(mu_);
    ++rounds_;
    roundDone_.notify_all();
  }
}

void Link::Impl::pumpRead(const std::string& peer) {
  std::unique_lock<std::mutex> g(mu);
  const auto now = std::chrono::steady_clock::now();
  const bool due = deferred && now >= deferUntil;
  // A stream's user reading the socket itself (Stream::readv) drains what is there: look
  // again later (poll() would keep calling the socket readable meanwhile).
  if (rxBusy) {
    deferred = false;
    defer(now);
    return;
  }
  rxBusy = true;
  drain(g, peer, nullptr, nullptr, 0, !due);
  rxBusy = false;
  rxIdle.notify_all();
}

size_t Link::Impl::drain(std::unique_lock<std::mutex>& g, const std::string& peer,
                         StreamState* own, const iovec* iov, int n, bool leave) {
  size_t budget = kPumpBudget, got = 0;
  if (own) {  // a user reading: it comes back for more (see deferUntil)
    deferred = true;
    deferUntil = std::chrono::steady_clock::now() + kDeferRead;
  }
  // Until the socket has nothing more, a round's budget is spent or own's bytes came --
  // and in any case the spill is empty.
  while (spillLen > 0 || (!down() && budget > 0 && got == 0)) {
    // Its user reads it in a moment -- unless a writer waits for credit that may be
    // behind it (its user may be waiting for that too, to send before it reads).
    if (leave && spillLen == 0 && rxHdrGot == sizeof rxHdr && rxTo->direct && !rxDrop &&
        !creditWaited()) {
      defer(std::chrono::steady_clock::now());
      break;
    }
    ssize_t r;
    if (rxHdrGot < sizeof rxHdr) {
      // A small sub-frame's payload (and a credit after it) comes in the same call.
      const iovec h[2] = {{reinterpret_cast<char*>(&rxHdr) + rxHdrGot, sizeof rxHdr - rxHdrGot},
                          {spill, kSpill}};
      r = rxRead(g, h, spillLen > 0 ? 1 : 2);  // the spill's own bytes go to the header only
      if (r > 0) {
        headerRead(static_cast<size_t>(r), peer);
        continue;
      }
    } else {
      iovec v[10];  // the reader's own bytes: straight into its buffer
      const int k = own && rxTo.get() == own && !own->closed && own->inbox.empty()
                        ? slice(iov, n, got, static_cast<size_t>(rxLeft), v, 8)
                        : 0;
      if (k > 0) {
        size_t want = 0;
        for (int i = 0; i < k; ++i) want += v[i].iov_len;
        // The sub-frame ends in this read: the next header, and the spill after it, come
        // in the same call (a bulk transfer's 256 KiB sub-frames: one call each, not two).
        int m = k;
        if (want == rxLeft && spillLen == 0) {
          v[m++] = {&rxHdr, sizeof rxHdr};
          v[m++] = {spill, kSpill};
        }
        r = rxRead(g, v, m);
        if (r > 0) {
          const size_t pay = std::min(static_cast<size_t>(r), want);
          got += pay;
          credited(*own, pay);
          payloadRead(pay, &budget);
          if (static_cast<size_t>(r) > want) headerRead(static_cast<size_t>(r) - want, peer);
          continue;
        }
      } else if (own && rxTo.get() == own && got > 0 && spillLen == 0) {
        break;  // its buffer is full: the rest stays in the socket
      } else {
        r = readPayload(g, &budget);
        if (r > 0) continue;
      }
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!own) deferred = false;  // the pump drained it: the next bytes start a new wait
      break;
    }
    if (r < 0 && errno == EINTR) continue;
    fail(r == 0 ? 0 : errno);
    // The peer closed the link (after everything it sent): shut ours, for its close
    // (Link::close) waits for that -- not for our own close, which may come much later.
    if (r == 0) ::shutdown(fd.get(), SHUT_WR);
  }
  return got;
}

ssize_t Link::Impl::rxRead(std::unique_lock<std::mutex>& g, const iovec* v, int k) {
  if (spillLen > 0) {
    size_t done = 0;
    for (int i = 0; i < k && spillLen > 0; ++i) {
      const size_t c = std::min(v[i].iov_len, spillLen);
      std::memcpy(v[i].iov_base, spill + spillAt, c);
      spillAt += c;
      spillLen -= c;
      done += c;
    }
    return static_cast<ssize_t>(done);
  }
  return unlocked(g, [&] { return ::readv(fd.get(), v, k); });
}

void Link::Impl::headerRead(size_t n, const std::string& peer) {
  const size_t h = std::min(n, sizeof rxHdr - rxHdrGot);
  rxHdrGot += h;
  if (n > h) {
    spillAt = 0;
    spillLen = n - h;
  }
  if (rxHdrGot == sizeof rxHdr) onHeader(peer);
}

void Link::Impl::onHeader(const std::string& peer) {
  if (rxHdr.magic != kLinkMagic || rxHdr.kind < kSubData || rxHdr.kind > kSubOpen) {
    RR_WARN("link to ", peer, ": protocol error (magic ", rxHdr.magic, ", kind ", rxHdr.kind,
            "): closing it");
    fail(EPROTO);
    return;
  }
  rxHdrGot = 0;
  auto it = streams.find(rxHdr.stream);
  if (rxHdr.kind == kSubCredit) {  // none for a stream this end forgot (closed both ways)
    if (it != streams.end()) {
      it->second->credit += rxHdr.len;
      update(*it->second);
    }
    return;
  }
  if (it == streams.end()) {  // the peer opened it first: its bytes wait for open()
    if (++unopened > kMaxUnopened) {  // each may hold a window: bound how many
      RR_WARN("link to ", peer, ": more than ", kMaxUnopened, " streams the peer wrote to "
              "are not open here: closing the link");
      fail(EPROTO);
      return;
    }
    it = streams.emplace(rxHdr.stream, std::make_shared<StreamState>(rxHdr.stream, window)).first;
  }
  const std::shared_ptr<StreamState>& s = it->second;
  if (rxHdr.kind == kSubOpen) {  // (before its fin: this end cannot have forgotten it)
    s->credit += rxHdr.len;
    update(*s);
    return;
  }
  if (rxHdr.kind == kSubFin) {
    s->peerFin = true;
    update(*s);
    maybeForget(s);
    return;
  }
  // Unopened, it holds what the credit it starts with allows; open, its window.
  const size_t held = s->inbox.size(), start = startCredit(window);
  const size_t room = s->opened ? s->inbox.room() : held < start ? start - held : 0;
  if (!s->closed && rxHdr.len > room) {
    RR_WARN("link to ", peer, ": stream ", s->id, " got ", rxHdr.len, " bytes beyond its credit (",
            room, " free", s->opened ? "" : " before it is opened here", "): closing the link");
    fail(EPROTO);
    return;
  }
  if (rxHdr.len == 0) return;
  rxHdrGot = sizeof rxHdr;  // the payload follows
  rxTo = s;
  rxLeft = rxHdr.len;
  rxDrop = s->closed;
}

ssize_t Link::Impl::readPayload(std::unique_lock<std::mutex>& g, size_t* budget) {
  static thread_local std::vector<char> sink(64 << 10);
  iovec v[2];
  int k = 1;
  StreamState& s = *rxTo;
  // The budget bounds socket reads; what the spill holds is parsed in any case.
  const size_t want =
      static_cast<size_t>(std::min<uint64_t>(rxLeft, spillLen > 0 ? spillLen : *budget));
  const bool toSink = rxDrop || s.closed;
  if (toSink) v[0] = {sink.data(), std::min(want, sink.size())};
  else k = (s.inbox.reserve(want), s.inbox.free(v, want));  // this thread alone fills it
  const ssize_t r = rxRead(g, v, k);
  if (r <= 0) return r;
  const size_t n = static_cast<size_t>(r);
  if (!toSink) s.inbox.commit(n);
  if (toSink || s.closed) {  // closed meanwhile: dropped, as close() dropped the rest
    if (!toSink) s.inbox.consume(n);
    credited(s, n);
  } else {
    update(s);
  }
  payloadRead(n, budget);
  return r;
}

void Link::Impl::payloadRead(size_t n, size_t* budget) {
  rxLeft -= n;
  *budget -= std::min(*budget, n);
  if (rxLeft > 0) return;
  rxHdrGot = 0;  // the sub-frame is through: a header comes next
  auto done = std::move(rxTo);
  maybeForget(done);
}


size_t Link::Impl::queue(StreamState& s, const iovec* iov, int n, size_t skip) {
  iovec parts[8];
  size_t done = 0, total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  // Its memory may move only while no thread sends from it (txBusy on this stream's
  // sub-frame): then this takes what fits in what it has.
  if (!txBusy || txFrom.get() != &s) s.outbox.reserve(total - std::min(total, skip));
  for (bool more = true; more && s.outbox.writable() > 0;) {
    const int k = slice(iov, n, skip + done, s.outbox.writable(), parts, 8);
    more = k == 8;
    if (k == 0) break;
    for (int i = 0; i < k; ++i) done += s.outbox.copyIn(parts[i].iov_base, parts[i].iov_len);
  }
  return done;
}

size_t Link::Impl::sendDirect(std::unique_lock<std::mutex>& g,
                              const std::shared_ptr<StreamState>& sp, const iovec* iov, int n,
                              size_t total) {
  StreamState& s = *sp;
  size_t done = 0;
  bool sent = false;
  while (done < total && !down() && !txBusy && !txActive && control.empty() && s.credit > 0) {
    // Up to kBatch sub-frames in one call (one push of the socket for them all), for bulk
    // no more than the socket has room for.
    SubHeader hs[kBatch];
    size_t lens[kBatch];
    iovec v[kBatch * 9];
    int nf = 0, nv = 0;
    const size_t room0 = total - done > kMaxSub ? socketRoom() : SIZE_MAX;
    if (room0 == 0) break;  // full: the caller polls writeFd() (a queued write: the outbox)
    size_t room = room0;
    for (size_t off = done, credit = s.credit; nf < kBatch && off < total && credit > 0; ++nf) {
      if (room < sizeof(SubHeader) + kMinPiece) break;  // (never the first: room >= kMinRoom)
      // At most what the outbox holds: a sub-frame the socket takes in part goes on from it.
      const size_t len =
          std::min({total - off, credit, kMaxSub, s.outbox.capacity(),
                    room == SIZE_MAX ? SIZE_MAX : room - sizeof(SubHeader)});
      hs[nf] = SubHeader{kLinkMagic, kSubData, s.id, len};
      const int k = slice(iov, n, off, len, v + nv + 1, 8);
      size_t inV = 0;
      for (int i = 0; i < k; ++i) inV += v[nv + 1 + i].iov_len;
      if (inV < len) break;  // more pieces than one call takes: the pump sends from the outbox
      v[nv] = {&hs[nf], sizeof(SubHeader)};
      nv += 1 + k;
      lens[nf] = len;
      off += len;
      credit -= len;
      if (room != SIZE_MAX) room -= std::min(room, sizeof(SubHeader) + len);
    }
    if (nf == 0) break;
    msghdr mh{};
    mh.msg_iov = v;
    mh.msg_iovlen = static_cast<size_t>(nv);
    // Others wait for the socket (txBusy), not for the lock, while the kernel copies.
    txBusy = sent = true;
    const ssize_t r =
        unlocked(g, [&] { return ::sendmsg(fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT); });
    const int e = errno;
    txBusy = false;
    if (r < 0) {
      if (e == EINTR) continue;
      if (e != EAGAIN && e != EWOULDBLOCK) fail(e);
      break;
    }
    size_t took = static_cast<size_t>(r);
    for (int f = 0; f < nf && took > 0; ++f) {
      const size_t len = lens[f];
      s.credit -= len;  // the sub-frame has begun: all of it goes
      if (took >= sizeof(SubHeader) + len) {
        took -= sizeof(SubHeader) + len;
        done += len;
        continue;
      }
      // The pump (or this stream's next write) finishes it from the outbox: the header's
      // rest, then the payload's.
      const size_t paid = took > sizeof(SubHeader) ? took - sizeof(SubHeader) : 0;
      txHdr = hs[f];
      txHdrDone = std::min(took, sizeof(SubHeader));
      iovec rest[8];
      const int m = slice(iov, n, done + paid, len - paid, rest, 8);
      s.outbox.reserve(len - paid);  // nobody sends from it: this thread held txBusy
      for (int i = 0; i < m; ++i) s.outbox.copyIn(rest[i].iov_base, rest[i].iov_len);
      txLeft = len - paid;
      txFrom = sp;
      txActive = true;
      done += len;
      took = 0;
    }
    if (txActive || done < total) break;  // the socket is full (or credit ran out)
  }
  // What others queued meanwhile (they left it to this thread): the pump sends it.
  if (sent && wantsOut()) Hub::get().wake();
  return done;
}

size_t Link::Impl::socketRoom() {
  // The kernel's own accounting (skb truesize against the send buffer), as tcp_poll() reads
  // it: POLLOUT while the free part is at least half the queued part.
  uint32_t mem[SK_MEMINFO_VARS] = {};
  socklen_t l = sizeof mem;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_MEMINFO, mem, &l) != 0 ||
      l < sizeof(uint32_t) * (SK_MEMINFO_WMEM_QUEUED + 1))
    return SIZE_MAX;
  const size_t buf = mem[SK_MEMINFO_SNDBUF], queued = mem[SK_MEMINFO_WMEM_QUEUED];
  if (queued >= buf) return 0;
  const size_t spare = buf - queued;
  if (spare < queued / 2) return 0;  // not writable: poll() waits, so may the caller
  const size_t room = spare - spare / 16;  // payload: what the skbs' overhead leaves of it
  return room >= kMinRoom ? room : SIZE_MAX;
}

bool Link::Impl::pickNext() {
  txHdrDone = 0;
  txLeft = 0;
  txFrom.reset();
  if (!control.empty()) {
    txHdr = control.front();
    control.pop_front();
    return txActive = true;
  }
  // Data: the next stream after the one served last that has bytes and credit.
  auto pick = [&](auto from, auto to) -> std::shared_ptr<StreamState> {
    for (auto it = from; it != to; ++it)
      if (!it->second->outbox.empty() && it->second->credit > 0) return it->second;
    return nullptr;
  };
  auto after = streams.upper_bound(rrAfter);
  std::shared_ptr<StreamState> s = pick(after, streams.end());
  if (!s) s = pick(streams.begin(), after);
  if (s) {
    const size_t n = std::min({s->outbox.size(), s->credit, kMaxSub});
    s->credit -= n;
    txHdr = SubHeader{kLinkMagic, kSubData, s->id, n};
    txLeft = n;
    txFrom = s;
    rrAfter = s->id;
    return txActive = true;
  }
  for (auto& [id, st] : streams) {
    if (st->shutWr && !st->finSent && st->outbox.empty()) {
      st->finSent = true;
      txHdr = SubHeader{kLinkMagic, kSubFin, id, 0};
      return txActive = true;
    }
  }
  return false;
}

void Link::Impl::pumpWrite() {
  std::unique_lock<std::mutex> g(mu);
  writeSome(g, kPumpBudget);
}

void Link::Impl::writePending(std::unique_lock<std::mutex>& g) { writeSome(g, kInlineBudget); }

void Link::Impl::writeSome(std::unique_lock<std::mutex>& g, size_t budget) {
  if (txBusy) return;  // another thread writes: it sends what there is
  txBusy = true;
  while (!down() && budget > 0) {
    if (!txActive && !pickNext()) break;
    iovec v[3];
    int k = 0;
    if (txHdrDone < sizeof txHdr)
      v[k++] = {reinterpret_cast<char*>(&txHdr) + txHdrDone, sizeof txHdr - txHdrDone};
    if (txFrom) k += txFrom->outbox.filled(v + k, 0, static_cast<size_t>(txLeft));
    msghdr mh{};
    mh.msg_iov = v;
    mh.msg_iovlen = static_cast<size_t>(k);
    const ssize_t r =
        unlocked(g, [&] { return ::sendmsg(fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT); });
    const int e = errno;
    if (r < 0) {
      if (e == EAGAIN || e == EWOULDBLOCK) break;
      if (e == EINTR) continue;
      fail(e);
      break;
    }
    size_t n = static_cast<size_t>(r);
    const size_t h = std::min(n, sizeof txHdr - txHdrDone);
    txHdrDone += h;
    n -= h;
    budget -= std::min(budget, static_cast<size_t>(r));
    if (n > 0) {
      txFrom->outbox.consume(n);
      txLeft -= n;
      update(*txFrom);
    }
    if (txHdrDone == sizeof txHdr && txLeft == 0) {
      txActive = false;
      auto done = std::move(txFrom);
      if (txHdr.kind == kSubFin) {
        auto it = streams.find(txHdr.stream);
        if (it != streams.end()) maybeForget(it->second);
      } else if (done) {
        maybeForget(done);
      }
      flushed.notify_all();
    }
  }
  txBusy = false;
  if (drained()) flushed.notify_all();
  // Others may have queued bytes while this thread wrote (and found it busy): the pump's
  // poll must look for room again (from the pump itself: one more round).
  if (wantsOut()) Hub::get().wake();
}

}  // namespace rr::transport::tcp
