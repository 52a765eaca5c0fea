// Standalone check of transport/tcp/link.h: streams multiplexed over one connection, with
// per-stream credits, ends, early data and link failure -- over a Unix socket pair and over
// loopback TCP, both ends served by this process's one pump thread.
// Build: g++ -std=c++17 -pthread -I csrc csrc/core/interrupt.cc csrc/core/log.cc
//        csrc/transport/tcp/socket.cc csrc/transport/tcp/link.cc
//        csrc/transport/tcp/link_pump.cc tests/cpp/link_check.cc
// Prints "link_check: N passed, M failed"; exits non-zero when M > 0.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/byte_ring.h"
#include "core/error.h"
#include "transport/tcp/link.h"
#include "transport/tcp/link_state.h"  // SubHeader: a peer that writes the wire by hand

namespace {

using Clock = std::chrono::steady_clock;
using namespace rr::transport::tcp;
constexpr size_t kWindow = 1 << 20;

std::atomic<int> passed{0};
std::atomic<int> failed{0};

void check(bool ok, const std::string& what) {
  ok ? ++passed : ++failed;
  if (!ok) std::printf("FAIL: %s\n", what.c_str());
}

uint8_t pattern(uint64_t stream, int dir, size_t i) {
  const size_t d = static_cast<size_t>(dir);
  return static_cast<uint8_t>((i * 131 + (i >> 13) * 7 + stream * 29 + d * 97) & 0xff);
}

// Wait (up to `ms`) until the stream's fd says what `want` asks for -- or, waiting for
// data, until the link's socket is readable (the reader then reads it itself).
bool waitFor(Stream& s, unsigned want, int ms) {
  s.arm(want);
  pollfd p[2] = {{s.fd(), POLLIN, 0}, {(want & Stream::kData) ? s.readFd() : -1, POLLIN, 0}};
  return ::poll(p, 2, ms) >= 1;
}

// Wait for room as a paced writer does: the eventfd (credit) and the link's socket (room).
bool waitPaced(Stream& s, int ms) {
  s.arm(Stream::kRoom);
  pollfd p[2] = {{s.fd(), POLLIN, 0}, {s.writeFd(), POLLOUT, 0}};
  return ::poll(p, 2, ms) >= 1;
}

// Write all of buf (blocking through waitFor, or waitPaced); false on EPIPE or after 20 s.
bool writeAll(Stream& s, const uint8_t* buf, size_t n, Stream::Mode mode = Stream::kQueue) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  for (size_t done = 0; done < n;) {
    iovec v{const_cast<uint8_t*>(buf + done), n - done};
    int err = 0;
    const ssize_t r = s.write(&v, 1, &err, mode);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (err != EAGAIN || Clock::now() > until) return false;
    mode == Stream::kPaced ? waitPaced(s, 100) : waitFor(s, Stream::kRoom, 100);
  }
  return true;
}

// Read exactly n bytes; returns how many arrived before the end, an error or 20 s.
size_t readAll(Stream& s, uint8_t* buf, size_t n) {
  const auto until = Clock::now() + std::chrono::seconds(20);
  size_t done = 0;
  while (done < n && Clock::now() < until) {
    int err = 0;
    const ssize_t r = s.read(buf + done, n - done, &err);
    if (r > 0) done += static_cast<size_t>(r);
    else if (r == 0 || err != EAGAIN) break;
    else waitFor(s, Stream::kData, 100);
  }
  return done;
}

// The read after everything: 0 (the end) within 5 s.
bool readsEnd(Stream& s) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until) {
    char c;
    int err = 0;
    const ssize_t r = s.read(&c, 1, &err);
    if (r == 0) return true;
    if (r > 0 || err != EAGAIN) return false;
    waitFor(s, Stream::kData, 100);
  }
  return false;
}

std::vector<uint8_t> make(uint64_t stream, int dir, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = pattern(stream, dir, i);
  return v;
}

bool same(const std::vector<uint8_t>& got, uint64_t stream, int dir) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != pattern(stream, dir, i)) return false;
  return true;
}

struct Pair {
  std::shared_ptr<Link> a, b;
  int rawA = -1;  // a dup of a's socket (to break the link from outside)
  ~Pair() {
    if (a) a->close(1);
    if (b) b->close(1);
    if (rawA >= 0) ::close(rawA);
  }
};

std::unique_ptr<Pair> makePair(bool tcp, size_t window = kWindow) {
  int fds[2];
  if (tcp) {
    int port = 0;
    Fd l = listenOn("127.0.0.1", 0, &port);
    Fd c = connectTo(Endpoint{"127.0.0.1", port}, rr::Deadline::after(5), "link_check");
    std::string from;
    Fd s = acceptOne(l.get(), rr::Deadline::after(5), &from);
    fds[0] = c.release();
    fds[1] = s.release();
  } else if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::perror("socketpair");
    std::exit(2);
  }
  auto p = std::make_unique<Pair>();
  p->rawA = ::dup(fds[0]);
  p->a = Link::start(Fd(fds[0]), "B", window);
  p->b = Link::start(Fd(fds[1]), "A", window);
  return p;
}

// A link whose peer is this process writing the wire by hand on `*raw`.
std::shared_ptr<Link> rawLink(Fd* raw) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::exit(2);
  *raw = Fd(fds[0]);
  return Link::start(Fd(fds[1]), "raw", kWindow);
}

// A data sub-frame as the wire carries it: header, then payload.
std::string dataSub(uint64_t stream, const std::vector<uint8_t>& payload) {
  SubHeader h;
  h.kind = kSubData;
  h.stream = stream;
  h.len = payload.size();
  std::string wire(reinterpret_cast<const char*>(&h), sizeof h);
  wire.append(payload.begin(), payload.end());
  return wire;
}

// Two streams, both directions at once, 16 MiB each way: every byte in order. Stream 2's
// writers are paced (they wait for the socket themselves), stream 1's queue.
void checkTransfer(bool tcp) {
  auto p = makePair(tcp);
  constexpr size_t n = 16 << 20;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  const auto t0 = Clock::now();
  for (uint64_t id : {1, 2}) {
    for (int side = 0; side < 2; ++side) {
      ts.emplace_back([&, id, side] {
        std::unique_ptr<Stream> s = (side == 0 ? p->a : p->b)->open(id);
        const auto out = make(id, side, n);
        std::vector<uint8_t> in(n);
        const auto mode = id == 2 ? Stream::kPaced : Stream::kQueue;
        std::thread w([&] { ok += writeAll(*s, out.data(), n, mode); });
        const size_t got = readAll(*s, in.data(), n);
        w.join();
        s->shutdownWrite();
        ok += got == n && same(in, id, 1 - side) && readsEnd(*s);
      });
    }
  }
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  check(ok == 8, std::string(tcp ? "tcp" : "unix") + ": 2 streams x 2 directions x 16 MiB arrive "
                 "in order, then the end (" + std::to_string(ok.load()) + "/8)");
  std::printf("  %s: 64 MiB moved in %.2f s\n", tcp ? "tcp" : "unix", s);
}

// Small sub-frames (1-300 bytes, one write each) on five streams both ways, read in pieces
// of 1-700 bytes: a read that takes a header with the bytes after it (the spill) parses
// them into the right streams, in order, with the credits among them. Two streams' readers
// come late: the pump fills their inboxes meanwhile, more than a round's budget in all.
void checkSmallFrames(bool tcp) {
  auto p = makePair(tcp);
  constexpr size_t n = 2 << 20;
  std::vector<std::thread> ts;
  std::atomic<int> ok{0};
  for (uint64_t id : {21, 22, 23, 24, 25}) {
    for (int side = 0; side < 2; ++side) {
      ts.emplace_back([&, id, side] {
        std::unique_ptr<Stream> s = (side == 0 ? p->a : p->b)->open(id);
        const auto out = make(id, side, n);
        std::vector<uint8_t> in(n);
        std::thread w([&] {
          bool wrote = true;
          for (size_t done = 0, i = 0; done < n && wrote; ++i) {
            const size_t len = std::min(n - done, (i * 37) % 300 + 1);
            wrote = writeAll(*s, out.data() + done, len, id == 22 ? Stream::kPaced
                                                                   : Stream::kQueue);
            done += len;
          }
          ok += wrote;
        });
        if (id >= 24) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        size_t got = 0;
        for (size_t i = 0; got < n; ++i) {
          const size_t len = std::min(n - got, (i * 53) % 700 + 1);
          const size_t r = readAll(*s, in.data() + got, len);
          got += r;
          if (r < len) break;
        }
        w.join();
        ok += got == n && same(in, id, 1 - side);
      });
    }
  }
  for (auto& t : ts) t.join();
  check(ok == 20, std::string(tcp ? "tcp" : "unix") + ": 5 streams x 2 directions of small "
                  "sub-frames arrive in order (" + std::to_string(ok.load()) + "/20)");
}

// A paced writer to a stream nobody reads yet: it takes at most the window (nothing more is
// copied to wait in the outbox), its wait then sleeps (no readiness while nothing changes),
// and once the reader comes everything arrives.
void checkPacedStall() {
  auto p = makePair(true);
  auto w = p->a->open(9), r = p->b->open(9);
  constexpr size_t n = 3 * kWindow;
  const auto out = make(9, 0, n);
  size_t taken = 0;
  for (int i = 0; i < 200; ++i) {
    iovec v{const_cast<uint8_t*>(out.data() + taken), n - taken};
    int err = 0;
    const ssize_t got = w->write(&v, 1, &err, Stream::kPaced);
    if (got > 0) taken += static_cast<size_t>(got);
    else if (!waitPaced(*w, 20)) break;  // nothing to wait for any more
  }
  check(taken > 0 && taken <= kWindow, "a paced writer nobody reads takes at most the window (" +
                                           std::to_string(taken) + " bytes)");
  check(!waitPaced(*w, 100), "a stalled paced writer's wait sleeps (no spin)");
  std::vector<uint8_t> in(n);
  std::thread rt([&] { in.resize(readAll(*r, in.data(), n)); });
  const bool wrote = writeAll(*w, out.data() + taken, n - taken, Stream::kPaced);
  rt.join();
  check(wrote && in.size() == n && same(in, 9, 0), "the paced writer then finishes: all intact");
}

// A stream nobody reads fills its window and stops; another stream on the link goes on.
void checkStalledStream(bool tcp) {
  auto p = makePair(tcp);
  auto sa = p->a->open(10), sb = p->b->open(10);
  std::vector<uint8_t> chunk(64 << 10);
  size_t written = 0;
  for (int idle = 0; idle < 20;) {  // until 20 x 10 ms without room
    iovec v{chunk.data(), chunk.size()};
    int err = 0;
    const ssize_t r = sa->write(&v, 1, &err);
    if (r > 0) {
      written += static_cast<size_t>(r);
      idle = 0;
    } else {
      ++idle;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  check(written >= kWindow && written <= 2 * kWindow,
        "a stream whose reader waits takes at most two windows (took " +
            std::to_string(written) + ")");
  check(sb->available() <= kWindow, "its inbox holds at most a window (" +
                                        std::to_string(sb->available()) + ")");
  auto oa = p->a->open(11), ob = p->b->open(11);
  constexpr size_t n = 8 << 20;
  const auto out = make(11, 0, n);
  std::vector<uint8_t> in(n);
  std::thread w([&] { writeAll(*oa, out.data(), n); });
  const size_t got = readAll(*ob, in.data(), n);
  w.join();
  check(got == n && same(in, 11, 0), "another stream moves 8 MiB past the stalled one");
  std::vector<uint8_t> rest(written);
  check(readAll(*sb, rest.data(), written) == written, "the stalled stream's bytes all arrive");
  bool ok = true;
  for (size_t i = 0; i < written; ++i) ok &= rest[i] == 0;
  check(ok, "... unchanged");
}

void checkEnds() {
  auto p = makePair(false);
  {  // fin after data
    auto sa = p->a->open(20), sb = p->b->open(20);
    const auto out = make(20, 0, 1000);
    check(writeAll(*sa, out.data(), out.size()), "write 1000 bytes");
    sa->shutdownWrite();
    int err = 0;
    iovec v{const_cast<uint8_t*>(out.data()), 1};
    check(sa->write(&v, 1, &err) == -1 && err == EPIPE, "a write after shutdownWrite: EPIPE");
    check(waitFor(*sb, Stream::kEnd, 2000), "kEnd wakes at the fin");
    std::vector<uint8_t> in(1000);
    check(readAll(*sb, in.data(), in.size()) == 1000 && same(in, 20, 0), "the data before the fin");
    check(readsEnd(*sb), "then the end");
  }
  {  // kEnd does not wake for data
    auto sa = p->a->open(21), sb = p->b->open(21);
    sb->arm(Stream::kEnd);
    const auto out = make(21, 0, 10);
    writeAll(*sa, out.data(), out.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pollfd q{sb->fd(), POLLIN, 0};
    check(::poll(&q, 1, 0) == 0 && sb->available() == 10, "kEnd ignores data");
    check(waitFor(*sb, Stream::kData, 1000), "kData wakes for it");
    sa->close();
    check(waitFor(*sb, Stream::kEnd, 2000), "kEnd wakes once the writer closed");
  }
  {  // bytes sent before the receiver opens the stream wait for it
    auto sa = p->a->open(22);
    const auto out = make(22, 0, 5000);
    writeAll(*sa, out.data(), out.size());
    sa->close();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto sb = p->b->open(22);
    std::vector<uint8_t> in(5000);
    check(readAll(*sb, in.data(), in.size()) == 5000 && same(in, 22, 0) && readsEnd(*sb),
          "a stream opened after the peer wrote and closed reads it all, then the end");
  }
  {  // one write of many pieces (more than a direct send gathers at once)
    auto sa = p->a->open(24), sb = p->b->open(24);
    const auto out = make(24, 0, 12 * 1000);
    iovec v[12];
    for (int i = 0; i < 12; ++i) v[i] = {const_cast<uint8_t*>(out.data()) + i * 1000, 1000};
    int err = 0;
    check(sa->write(v, 12, &err) == 12000, "a write of 12 pieces is taken whole");
    std::vector<uint8_t> in(out.size());
    check(readAll(*sb, in.data(), in.size()) == in.size() && same(in, 24, 0), "... in order");
  }
  {  // a stream in use cannot be opened twice
    auto sa = p->a->open(23), sb = p->b->open(23);
    bool threw = false;
    try {
      p->a->open(23);
    } catch (const rr::InvalidArgument&) {
      threw = true;
    }
    check(threw, "opening an open stream id throws InvalidArgument");
  }
  // Closed on both sides: the links forget them.
  const auto until = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < until && (p->a->streamCount() || p->b->streamCount()))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  check(p->a->streamCount() == 0 && p->b->streamCount() == 0,
        "streams closed on both ends are forgotten (" + std::to_string(p->a->streamCount()) +
            ", " + std::to_string(p->b->streamCount()) + " left)");
}

// The connection breaks: every stream on both ends reads the end and cannot write.
void checkLinkFailure(bool tcp) {
  auto p = makePair(tcp);
  auto sa = p->a->open(30), sb = p->b->open(30), tb = p->b->open(31);
  // A byte each way first: the opens' sub-frames went before it (control frames go first),
  // so no write is under way when the link breaks (one would fail with EPIPE, not read the end).
  uint8_t x = 1, y = 0;
  check(writeAll(*sa, &x, 1) && readAll(*sb, &y, 1) == 1 && writeAll(*sb, &x, 1) &&
            readAll(*sa, &y, 1) == 1,
        "a byte each way before the link breaks");
  ::shutdown(p->rawA, SHUT_RDWR);
  check(waitFor(*sb, Stream::kEnd, 2000) && waitFor(*tb, Stream::kEnd, 2000) &&
            waitFor(*sa, Stream::kEnd, 2000),
        std::string(tcp ? "tcp" : "unix") + ": a broken link ends every stream");
  check(readsEnd(*sb) && readsEnd(*sa), "they read the end");
  uint8_t c = 0;
  iovec v{&c, 1};
  int err = 0;
  check(sb->write(&v, 1, &err) == -1 && err == EPIPE, "and writes get EPIPE");
  check(p->b->error() == 0,
        "the link says it closed (error " + std::to_string(p->b->error()) + ")");
  auto late = p->b->open(32);
  check(readsEnd(*late), "a stream opened on a link that is down reads the end");
}

// A peer writing to more streams than this end may hold unopened breaks the link (each
// could hold a window of memory).
void checkUnopenedBound() {
  auto p = makePair(false);
  std::vector<std::unique_ptr<Stream>> many;
  uint8_t c = 7;
  iovec v{&c, 1};
  for (uint64_t id = 1000; id < 1000 + 1100; ++id) {
    many.push_back(p->a->open(id));
    int err = 0;
    many.back()->write(&v, 1, &err);
  }
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until && p->b->error() < 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  check(p->b->error() == EPROTO, "1100 unopened streams close the link with EPROTO (error " +
                                     std::to_string(p->b->error()) + ")");
}

// A peer writing the wire by hand, cut 10 bytes into the second sub-frame's header: the
// reader, its buffer exactly the first sub-frame, reads that part of the next header with
// it (readAhead); the rest, and a third sub-frame for another stream, land where they belong.
void checkReadAheadSplits() {
  Fd raw;
  auto b = rawLink(&raw);
  auto s5 = b->open(5), s6 = b->open(6);
  s5->readFd();  // its user reads the socket itself: the pump leaves its payload there
  const std::string wire =
      dataSub(5, make(5, 0, 1000)) + dataSub(5, make(5, 1, 300)) + dataSub(6, make(6, 0, 700));
  const size_t cut = sizeof(SubHeader) + 1000 + 10;
  check(::write(raw.get(), wire.data(), cut) == static_cast<ssize_t>(cut), "raw write 1");
  std::vector<uint8_t> a(1000), c(300), d(700);
  check(readAll(*s5, a.data(), a.size()) == a.size() && same(a, 5, 0),
        "a sub-frame read with part of the next header");
  const ssize_t rest = static_cast<ssize_t>(wire.size() - cut);
  check(::write(raw.get(), wire.data() + cut, wire.size() - cut) == rest, "raw write 2");
  check(readAll(*s5, c.data(), c.size()) == c.size() && same(c, 5, 1),
        "the sub-frame whose header came in two reads");
  check(readAll(*s6, d.data(), d.size()) == d.size() && same(d, 6, 0),
        "another stream's sub-frame after it");
  check(b->error() < 0, "the link stays up (error " + std::to_string(b->error()) + ")");
  s5.reset();
  s6.reset();
  raw.reset();
  b->close(1);
}

// A window of bytes written and closed at once still goes before link.close() closes.
// (Opened on both ends: before the peer opens it, a stream may send only kUnopenedCredit.)
void checkCloseFlushes() {
  auto p = makePair(true);
  auto sa = p->a->open(40), sb = p->b->open(40);
  const auto out = make(40, 0, kWindow);
  check(writeAll(*sa, out.data(), out.size()), "a window is taken at once");
  sa->close();
  p->a->close(5);
  std::vector<uint8_t> in(kWindow);
  check(readAll(*sb, in.data(), in.size()) == kWindow && same(in, 40, 0) && readsEnd(*sb),
        "close() sends what was written first; the peer reads it all, then the end");
}

// Before the receiver opens a stream, its writer may send kUnopenedCredit (what a peer can
// park in a stream nobody opened); the receiver's open() grants the rest of the window. A
// peer sending more than that to an unopened stream breaks the link.
void checkUnopenedCredit() {
  auto p = makePair(true);
  auto sa = p->a->open(50);
  const size_t n = 3 * kWindow;
  const auto out = make(50, 0, n);
  size_t taken = 0;  // non-blocking writes for 300 ms: what goes out, and what its outbox holds
  for (const auto until = Clock::now() + std::chrono::milliseconds(300); Clock::now() < until;) {
    iovec v{const_cast<uint8_t*>(out.data()) + taken, n - taken};
    int err = 0;
    const ssize_t r = sa->write(&v, 1, &err);
    if (r > 0) taken += static_cast<size_t>(r);
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  check(taken == kUnopenedCredit + kWindow,
        "a writer to a stream the peer has not opened sends kUnopenedCredit, then fills its "
        "outbox (took " + std::to_string(taken) + ")");
  auto sb = p->b->open(50);
  std::atomic<bool> wrote{false};
  std::thread w([&] { wrote = writeAll(*sa, out.data() + taken, n - taken); });
  std::vector<uint8_t> in(n);
  check(readAll(*sb, in.data(), n) == n && same(in, 50, 0), "once opened, it reads it all");
  w.join();
  check(wrote, "and the writer finishes");

  Fd raw;
  auto b = rawLink(&raw);
  auto sub = [&](uint64_t stream, size_t len) {
    const std::string wire = dataSub(stream, std::vector<uint8_t>(len, 0x5a));
    return ::write(raw.get(), wire.data(), wire.size()) == static_cast<ssize_t>(wire.size());
  };
  check(sub(7, kUnopenedCredit - 1) && sub(7, 1), "raw: kUnopenedCredit to an unopened stream");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  check(b->error() < 0, "is held (error " + std::to_string(b->error()) + ")");
  check(sub(7, 1), "raw: one byte more");
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until && b->error() < 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  check(b->error() == EPROTO, "breaks the link with EPROTO (error " +
                                  std::to_string(b->error()) + ")");
  raw.reset();
  b->close(1);
}

// The peer still reads (and sends credits back) when this end closes the link, with more
// in flight than the peer's socket buffer holds (the default window): the close waits for
// the peer to read the FIN instead of answering the credits with a reset, which would
// discard what this end's socket had not sent yet.
void checkCloseWhileThePeerReads() {
  auto p = makePair(true, Link::kDefaultWindow);
  auto sa = p->a->open(41), sb = p->b->open(41);
  constexpr size_t n = 2 * Link::kDefaultWindow;
  const auto out = make(41, 0, n);
  std::vector<uint8_t> in(n);
  size_t got = 0;
  std::thread r([&] {
    for (size_t piece = 64 << 10; got < n;) {  // slowly: credits keep going back
      const size_t c = readAll(*sb, in.data() + got, std::min(piece, n - got));
      got += c;
      if (c == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const bool wrote = writeAll(*sa, out.data(), n, Stream::kPaced);
  sa->close();
  p->a->close(5);
  r.join();
  check(wrote && got == n && same(in, 41, 0) && readsEnd(*sb),
        "a link closed while the peer still reads: it reads everything, then the end (" +
            std::to_string(got) + " of " + std::to_string(n) + ")");
}

// One thread, eight streams each way, driven only through the non-blocking calls.
void checkManyStreams() {
  auto p = makePair(true);
  constexpr int k = 8;
  constexpr size_t n = 2 << 20;
  std::vector<std::unique_ptr<Stream>> src, dst;
  std::vector<std::vector<uint8_t>> in(k, std::vector<uint8_t>(n)), out;
  std::vector<size_t> sent(k), got(k);
  for (int i = 0; i < k; ++i) {
    src.push_back(p->a->open(100 + i));
    dst.push_back(p->b->open(100 + i));
    out.push_back(make(100 + i, 0, n));
  }
  const auto until = Clock::now() + std::chrono::seconds(20);
  size_t total = 0;
  while (total < k * n && Clock::now() < until) {
    bool moved = false;
    for (int i = 0; i < k; ++i) {
      int err = 0;
      if (sent[i] < n) {
        iovec v{out[i].data() + sent[i], std::min<size_t>(n - sent[i], 100000)};
        const ssize_t r = src[i]->write(&v, 1, &err);
        if (r > 0) sent[i] += static_cast<size_t>(r), moved = true;
      }
      const ssize_t r = dst[i]->read(in[i].data() + got[i], n - got[i], &err);
      if (r > 0) got[i] += static_cast<size_t>(r), total += static_cast<size_t>(r), moved = true;
    }
    if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  bool ok = total == k * n;
  for (int i = 0; i < k && ok; ++i) ok = same(in[i], 100 + i, 0);
  check(ok, "8 streams x 2 MiB through one thread's non-blocking calls arrive intact");
}

// A stream's buffer grows only as reserve() asks, never past its capacity, and keeps its
// bytes (in order, across the ring's wrap) when it grows.
void checkByteRing() {
  rr::ByteRing r(1 << 20);
  check(r.writable() == 0 && r.room() == (1 << 20), "a ring allocates nothing before use");
  r.reserve(100);
  const size_t first = r.writable();
  check(first >= 100 && first < (1 << 20), "reserve allocates a part (" +
                                               std::to_string(first) + " bytes)");
  std::vector<uint8_t> src(3 << 20), dst(3 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(1, 0, i);
  size_t in = 0, out = 0;
  bool ok = true;
  for (size_t step = 1000; in < src.size(); step = step * 3 / 2 + 777) {  // wraps, then grows
    r.reserve(step);
    in += r.copyIn(src.data() + in, std::min(step, src.size() - in));
    const size_t c = r.copyOut(dst.data() + out, step / 2);
    r.consume(c);
    out += c;
    ok &= r.size() == in - out && r.size() <= r.capacity();
  }
  while (!r.empty()) {
    const size_t c = r.copyOut(dst.data() + out, 4096);
    r.consume(c);
    out += c;
  }
  check(ok && out == src.size() && dst == src, "a growing ring keeps its bytes in order");
  r.reserve(8 << 20);
  check(r.writable() == r.capacity(), "reserve stops at the capacity");
}

}  // namespace

int main() {
  checkByteRing();
  for (bool tcp : {false, true}) {
    checkTransfer(tcp);
    checkSmallFrames(tcp);
    checkStalledStream(tcp);
    checkLinkFailure(tcp);
  }
  checkEnds();
  checkPacedStall();
  checkCloseFlushes();
  checkCloseWhileThePeerReads();
  checkUnopenedBound();
  checkUnopenedCredit();
  checkReadAheadSplits();
  checkManyStreams();
  check(!linkPumpRunning(), "the pump thread stops once every link is closed");
  std::printf("link_check: %d passed, %d failed\n", passed.load(), failed.load());
  return failed == 0 ? 0 : 1;
}
