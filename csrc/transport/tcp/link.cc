// Links and streams (link.h): opening, closing, and a stream's calls on its buffers. The
// pump (link_pump.cc) moves the bytes.
#include "transport/tcp/link.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "transport/tcp/link_state.h"

namespace rr::transport::tcp {

// ---- Link ----

Link::Link(Fd fd, std::string peerName, size_t window)
    : impl_(std::make_unique<Impl>(std::move(fd), window)), peer_(std::move(peerName)) {}

Link::~Link() = default;

std::shared_ptr<Link> Link::start(Fd fd, std::string peerName, size_t window) {
  if (window < 4 * 1024) RR_THROW(InvalidArgument, "link window ", window, " is below 4 KiB");
  setNonBlocking(fd.get());
  std::shared_ptr<Link> l(new Link(std::move(fd), std::move(peerName), window));
  Hub::get().add(l);
  return l;
}

std::unique_ptr<Stream> Link::open(uint64_t id) {
  Impl& k = *impl_;
  std::shared_ptr<StreamState> s;
  {
    std::lock_guard<std::mutex> g(k.mu);
    auto it = k.streams.find(id);
    if (it != k.streams.end() && (it->second->opened || it->second->closed))
      RR_THROW(InvalidArgument, "stream ", id, " is already open on the link to ", peer_,
               " (two groups derived one id, or a group was created twice)");
    if (it == k.streams.end())
      it = k.streams.emplace(id, std::make_shared<StreamState>(id, k.window)).first;
    else
      --k.unopened;  // the peer's bytes came first
    s = it->second;
    s->opened = true;
    s->efd = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!s->efd.valid()) {
      s->closed = true;
      k.maybeForget(s);
      RR_THROW(Error, "eventfd failed: ", std::strerror(errno));
    }
    k.grantWindow(*s);
  }
  Hub::get().wake();  // the pump sends the grant
  // Not make_unique: the constructor is private.
  return std::unique_ptr<Stream>(new Stream(shared_from_this(), s, id));
}

int Link::error() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->err;
}

size_t Link::streamCount() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->streams.size();
}

void Link::close(double seconds) {
  Impl& k = *impl_;
  const Deadline d = Deadline::after(seconds);
  {
    std::unique_lock<std::mutex> g(k.mu);
    if (!k.fd.valid()) return;
    Hub::get().wake();
    while (!k.drained() && !d.expired())
      k.flushed.wait_for(g, std::chrono::milliseconds(std::min(d.pollMs(), 50)));
  }
  Hub::get().remove(this);  // the pump no longer touches the socket
  std::unique_lock<std::mutex> g(k.mu);
  k.fail(0);  // no stream's user starts a read or write on it either
  for (int i = 0; i < 1000 && (k.rxBusy || k.txBusy); ++i)  // those under way end at once
    k.rxIdle.wait_for(g, std::chrono::milliseconds(1));
  // The last sub-frames reach the peer, and what it sends while it reads them (credits)
  // until it reads our FIN and shuts its side (pumpRead) meets no closed socket: that would
  // answer with a reset, which discards what the peer has not read yet.
  closeAfterDrain(k.fd, std::max(d.pollMs(), 0));
}

bool linkPumpRunning() { return Hub::get().running(); }

// ---- Stream ----

Stream::Stream(std::shared_ptr<Link> link, std::shared_ptr<StreamState> st, uint64_t id)
    : link_(std::move(link)), st_(std::move(st)), id_(id) {}

Stream::~Stream() { close(); }

int Stream::fd() const { return st_->efd.get(); }

int Stream::readFd() {
  std::lock_guard<std::mutex> g(link_->impl_->mu);
  st_->direct = st_->pollsRead = true;
  return link_->impl_->down() ? -1 : link_->impl_->fd.get();
}

int Stream::writeFd() {
  Link::Impl& k = *link_->impl_;
  std::lock_guard<std::mutex> g(k.mu);
  StreamState& s = *st_;
  const bool sock = !k.down() && s.credit > 0;
  s.writeWait = sock ? StreamState::WriteWait::kSocket : StreamState::WriteWait::kCredit;
  k.update(s);
  // The credit comes on the socket: the pump watches it again if it left it to a reader.
  if (!sock && !s.pollsRead && k.deferred && !k.down()) Hub::get().wake();
  return sock ? k.fd.get() : -1;
}

void Stream::arm(unsigned want) {
  Link::Impl& k = *link_->impl_;
  std::lock_guard<std::mutex> g(k.mu);
  st_->want = want;
  st_->writeWait = StreamState::WriteWait::kPump;  // until writeFd() does
  st_->pollsRead = false;                          // until readFd() does
  k.update(*st_);
}

ssize_t Stream::write(const iovec* iov, int n, int* err, Mode mode) {
  Link::Impl& k = *link_->impl_;
  std::unique_lock<std::mutex> g(k.mu);
  StreamState& s = *st_;
  s.want &= ~static_cast<unsigned>(kRoom);  // writing, not waiting (see fd())
  if (k.down() || s.shutWr) {
    *err = EPIPE;
    return -1;
  }
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  // What waits to go first (this stream's outbox, credits, a half-sent sub-frame), sent
  // from here rather than by the pump, then this write straight onto the socket while
  // nothing of this stream waits before it: no copy, no hop through the pump, which takes
  // over a sub-frame the socket took in part.
  if (!s.outbox.empty() || k.txActive || !k.control.empty()) k.writeSome(g, kInlineBudget);
  size_t taken = s.outbox.empty() ? k.sendDirect(g, st_, iov, n, total) : 0;
  if (k.down() && taken == 0) {
    *err = k.err > 0 ? k.err : EPIPE;
    return -1;
  }
  // A paced write leaves in the caller's buffer what the socket cannot take now (the caller
  // polls writeFd) -- unless another thread is writing: that one sends the outbox.
  if (mode == kQueue || k.txBusy) taken += k.queue(s, iov, n, taken);
  if (taken == 0 && total > 0) {
    *err = EAGAIN;
    return -1;
  }
  k.update(s);
  if (!s.outbox.empty() && !k.txBusy) Hub::get().wake();  // the pump sends the rest
  return static_cast<ssize_t>(taken);
}

ssize_t Stream::readv(const iovec* iov, int n, int* err) {
  Link::Impl& k = *link_->impl_;
  std::unique_lock<std::mutex> g(k.mu);
  StreamState& s = *st_;
  s.want &= ~static_cast<unsigned>(kData);  // reading, not waiting (see fd())
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  if (total == 0) return 0;
  for (bool direct = true;; direct = false) {
    size_t got = 0;
    for (int i = 0; i < n && !s.inbox.empty(); ++i) {
      const size_t c = s.inbox.copyOut(iov[i].iov_base, iov[i].iov_len);
      s.inbox.consume(c);
      got += c;
    }
    if (got > 0) {
      if (k.credited(s, got)) k.writePending(g);
      k.update(s);
      return static_cast<ssize_t>(got);
    }
    if (!direct || s.peerFin || k.down()) break;
    // Read the socket here rather than wait for the pump to fill the inbox (a thread hop
    // and a copy): this stream's bytes go straight into iov, others' to their inboxes.
    // Someone reading it already drains it soon: wait for that (bounded), then look again
    // (what it read of ours is in the inbox).
    if (k.rxBusy) k.rxIdle.wait_for(g, std::chrono::milliseconds(2), [&] { return !k.rxBusy; });
    if (k.rxBusy || k.down()) continue;
    k.rxBusy = true;
    got = k.drain(g, link_->peer_, &s, iov, n);
    k.rxBusy = false;
    k.rxIdle.notify_all();
    k.writePending(g);  // credits it queued; outboxes whose credit it read
    if (got > 0) {
      k.update(s);
      return static_cast<ssize_t>(got);
    }
  }
  return k.nothing(s, err);
}

ssize_t Stream::read(void* buf, size_t n, int* err) {
  const iovec v{buf, n};
  return readv(&v, 1, err);
}

ssize_t Stream::peek(void* buf, size_t n, size_t off, int* err) const {
  Link::Impl& k = *link_->impl_;
  std::lock_guard<std::mutex> g(k.mu);
  const size_t c = st_->inbox.copyOut(buf, n, off);
  if (c > 0 || n == 0) return static_cast<ssize_t>(c);
  return k.nothing(*st_, err);
}

size_t Stream::available() const {
  std::lock_guard<std::mutex> g(link_->impl_->mu);
  return st_->inbox.size();
}

void Stream::shutdownWrite() {
  Link::Impl& k = *link_->impl_;
  std::lock_guard<std::mutex> g(k.mu);
  if (st_->shutWr) return;
  st_->shutWr = true;
  k.update(*st_);
  if (!k.down()) Hub::get().wake();
}

void Stream::close() {
  Link::Impl& k = *link_->impl_;
  {
    std::lock_guard<std::mutex> g(k.mu);
    StreamState& s = *st_;
    if (s.closed) return;
    s.shutWr = true;
    s.closed = true;
    const size_t dropped = s.inbox.size();
    s.inbox.consume(dropped);
    k.credited(s, dropped);
    s.want = 0;
    k.update(s);
    k.maybeForget(st_);
  }
  Hub::get().wake();
}

}  // namespace rr::transport::tcp
