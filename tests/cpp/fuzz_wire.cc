// Wire-protocol fuzzer (issue #7 item 7): random and mutated frames, handshakes and
// heartbeat datagrams fed to the real receive paths of csrc/transport, for a bounded time.
// No libFuzzer here (g++ only): a seeded PRNG drives generators and mutators, and every
// case is checked against a small independent model of what the receiver must do:
//
//   frames      TcpConnection::progressRecv / checkIdle over a socketpair or loopback TCP,
//               the writer interleaved with the reader (1-byte writes, random splits, whole
//               frames), then close or stay silent. A valid frame must arrive byte-exact;
//               anything else must raise the predicted rr::Error subclass -- or, for a half
//               frame from a silent writer, leave the reader waiting on its poll deadline.
//               describeMismatch is also checked directly ("" iff the fields agree).
//   handshakes  acceptHandshake (the listener side) and connectHandshake against a scripted
//               peer that knows the job secret: valid, bit-flipped, random, replayed,
//               wrong-secret, re-signed-with-bad-fields, truncated, stalled, trailing bytes.
//               Accepted only when the model says so (an unsigned mutation never is), and
//               every refusal carries the predicted status code.
//   heartbeats  a live Heartbeat receives random, flipped, replayed, wrong-secret and
//               out-of-range datagrams; a fresh authenticated datagram from another rank is
//               the fence showing that all of them were processed, after which the victim's
//               PeerStatus must equal the model (unchanged unless authenticated and fresh).
//
// Every blocking call is timed, a watchdog ends a hung run, and operator new refuses any
// single allocation above 64 MiB (the bound an attacker-chosen length must never beat).
//
//   fuzz_wire [--seconds S] [--seed N]   run; last line "fuzz_wire: OK iterations=..."
//   fuzz_wire --self-test                fixed cases proving the checks can fail
//   fuzz_wire --inject-bug ...           corrupt every received payload: must FAIL
//
// Files: this one (harness, allocation bound, main), fuzz_wire.h, fuzz_wire_frames.cc,
// fuzz_wire_handshake.cc, fuzz_wire_heartbeat.cc. Build (tests/test_fuzz.py does):
//   g++ -std=c++17 -O1 -g -fsanitize=address,undefined -pthread -I csrc
//     tests/cpp/fuzz_wire*.cc csrc/core/{crc32c,log,sha256,types}.cc csrc/transport/frame.cc
//     csrc/transport/heartbeat.cc csrc/transport/tcp/{socket,handshake,tcp_connection}.cc
#include "fuzz_wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"
#include "transport/tcp/socket.h"

using namespace rr;  // NOLINT
namespace tcp = rr::transport::tcp;

// ------------------------------------------------------------------ allocation bound

// The replacements below pair malloc with free, which GCC's inliner cannot see through.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
constexpr size_t kAllocLimit = size_t{64} << 20;
std::atomic<size_t> gMaxAlloc{0};
void noteAlloc(size_t n) {
  size_t m = gMaxAlloc.load(std::memory_order_relaxed);
  while (n > m && !gMaxAlloc.compare_exchange_weak(m, n, std::memory_order_relaxed)) {
  }
  if (n > kAllocLimit) {
    std::fprintf(stderr, "fuzz_wire: FAILURE: allocation of %zu bytes (limit %zu)\n", n,
                 kAllocLimit);
    std::_Exit(1);
  }
}
}  // namespace

void* operator new(size_t n) {
  noteAlloc(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }


// ------------------------------------------------------------------ harness

namespace fuzz {

uint64_t gSeed = 0;
uint64_t gIter = 0;
const char* gTarget = "setup";
bool gInjectBug = false;
Stats gStats;

namespace {
std::atomic<int64_t> gLastProgressNs{0};
int gListenFd = -1;  // the loopback listener makePair connects to
int gListenPort = 0;

// A run that stops making progress is a hang: report it rather than let CI time out.
void watchdog(std::atomic<bool>* stop) {
  while (!stop->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (nowNs() - gLastProgressNs.load() > 20'000'000'000LL) fail("hang: no progress for 20 s");
  }
}

}  // namespace

const char* name(Out o) {
  static const char* n[] = {"ok", "PeerError", "MismatchError", "TimeoutError",
                            "rr::Error(base)", "blocked-until-deadline", "goodbye"};
  return n[static_cast<int>(o)];
}

Out classify(std::exception_ptr e, std::string* what) {
  try {
    std::rethrow_exception(e);
  } catch (const MismatchError& x) {
    *what = x.what();
    return Out::kMismatch;
  } catch (const TimeoutError& x) {
    *what = x.what();
    return Out::kTimeout;
  } catch (const PeerError& x) {
    *what = x.what();
    if (x.peer() != 1) fail("PeerError names peer ", x.peer(), ", expected 1: ", x.what());
    return Out::kPeer;
  } catch (const Error& x) {
    *what = x.what();
    return Out::kOtherRr;
  } catch (const std::exception& x) {
    fail("a non-ringreduce exception escaped: ", x.what());
  } catch (...) {
    fail("a non-std exception escaped");
  }
  return Out::kOtherRr;
}

const char* name(Via v) { return v == Via::kUnix ? "unix" : v == Via::kTcp ? "tcp" : "link"; }

Via randomVia(Rng& rng) {
  const size_t r = rng.below(100);
  return r < 8 ? Via::kTcp : r < 14 ? Via::kLink : Via::kUnix;
}

Pair::~Pair() {
  closeWriter();
  closeFd(&r);
  sr.reset();
  if (lw) lw->close(0.2);
  if (lr) lr->close(0.2);
}

std::unique_ptr<tcp::Pipe> Pair::reader() {
  if (sr) return tcp::streamPipe(std::move(sr));
  const int fd = r;
  r = -1;
  return tcp::socketPipe(tcp::Fd(fd));
}

ssize_t Pair::send(const void* buf, size_t n) {
  if (!sw) return ::send(w, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  const iovec v{const_cast<void*>(buf), n};
  int err = 0;
  const ssize_t k = sw->write(&v, 1, &err);
  if (k < 0) errno = err;
  return k;
}

bool Pair::writeAll(const void* buf, size_t n, Deadline d, std::string* err) {
  if (!sw) return tcp::writeFull(w, buf, n, d, err);
  for (size_t put = 0; put < n;) {
    const ssize_t k = send(static_cast<const char*>(buf) + put, n - put);
    if (k > 0) {
      put += static_cast<size_t>(k);
      continue;
    }
    if (errno != EAGAIN) {
      *err = std::strerror(errno);
      return false;
    }
    sw->arm(tcp::Stream::kRoom);
    pollfd pf{sw->fd(), POLLIN, 0};
    if (::poll(&pf, 1, d.pollMs()) == 0 && d.expired()) {
      *err = "timed out";
      return false;
    }
  }
  return true;
}

void Pair::closeWriter() {
  closeFd(&w);
  if (sw) sw->close();
  sw.reset();
}

Pair makePair(Via via) {
  Pair p;
  if (via == Via::kLink) {
    static uint64_t nextId = 1;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair failed");
    p.lr = tcp::Link::start(tcp::Fd(sv[0]), "fuzzpeer");
    p.lw = tcp::Link::start(tcp::Fd(sv[1]), "fuzzreader");
    const uint64_t id = nextId++;
    p.sr = p.lr->open(id);
    p.sw = p.lw->open(id);
    return p;
  }
  if (via == Via::kUnix) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair failed");
    tcp::setNonBlocking(sv[0]);
    tcp::setNonBlocking(sv[1]);
    p.r = sv[0];
    p.w = sv[1];
    return p;
  }
  tcp::Fd w = tcp::connectTo(tcp::Endpoint{"127.0.0.1", gListenPort}, Deadline::after(5), "fuzz");
  tcp::Fd r = tcp::acceptOne(gListenFd, Deadline::after(5), nullptr);
  if (!r.valid()) fail("loopback accept timed out");
  p.r = r.release();
  p.w = w.release();
  return p;
}

void closeFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

namespace {

// Fixed cases through the same checks as the fuzz loop, each printed, so a green loop
// cannot mean that nothing was checked.
int selfTest(Rng& rng) {
  selfTestFrames(rng);
  for (int i = 0; i < 20; ++i) acceptIteration(rng);  // random modes, each checked
  for (int i = 0; i < 20; ++i) connectIteration(rng);
  realHandshakeCheck(rng);
  std::printf("self-test: real handshake captured and mirrored\n");
  for (int i = 0; i < 20; ++i) heartbeatIteration(rng);
  std::printf("self-test: forged heartbeats left PeerStatus unchanged\n");
  heartbeatReplayAcrossInits();
  std::printf("self-test: a heartbeat of an earlier init is refused by the next\n");
  std::printf("fuzz_wire: self-test OK\n");
  return 0;
}

}  // namespace

}  // namespace fuzz

int main(int argc, char** argv) {
  using namespace fuzz;  // NOLINT
  double seconds = 10;
  bool self = false;
  gSeed = static_cast<uint64_t>(nowNs());
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) gSeed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--self-test") self = true;
    else if (a == "--inject-bug") gInjectBug = true;
    else {
      std::fprintf(stderr,
                   "usage: fuzz_wire [--seconds S] [--seed N] [--self-test] [--inject-bug]\n");
      return 2;
    }
  }
  std::printf("fuzz_wire: seed=%llu seconds=%g\n", static_cast<unsigned long long>(gSeed), seconds);
  std::fflush(stdout);
  Rng rng(gSeed);
  gLastProgressNs = nowNs();
  std::atomic<bool> stopDog{false};
  std::thread dog(watchdog, &stopDog);
  tcp::Fd listener = tcp::listenOn("127.0.0.1", 0, &gListenPort);
  gListenFd = listener.get();
  heartbeatSetup(rng);
  realHandshakeCheck(rng);
  mismatchIteration(rng);
  int rc = 0;
  static const char* kTargets[] = {"frame", "checkIdle", "describeMismatch", "acceptHandshake",
                                   "connectHandshake", "heartbeat"};
  double spent[6] = {};
  int64_t t0 = nowNs();
  if (self) {
    gTarget = "self-test";
    rc = selfTest(rng);
  } else {
    while (since(t0) < seconds) {
      ++gIter;
      gLastProgressNs = nowNs();
      const int64_t c0 = nowNs();
      const size_t r = rng.below(100);
      size_t t;
      if (r < 55) {
        gTarget = kTargets[t = 0];
        frameIteration(rng);
      } else if (r < 65) {
        gTarget = kTargets[t = 1];
        idleIteration(rng);
      } else if (r < 70) {
        gTarget = kTargets[t = 2];
        mismatchIteration(rng);
      } else if (r < 80) {
        gTarget = kTargets[t = 3];
        acceptIteration(rng);
      } else if (r < 85) {
        gTarget = kTargets[t = 4];
        if (gIter % 16 == 0) realHandshakeCheck(rng);
        connectIteration(rng);
      } else {
        gTarget = kTargets[t = 5];
        heartbeatIteration(rng);
      }
      spent[t] += since(c0);
    }
  }
  double el = since(t0);
  heartbeatTeardown();
  stopDog = true;
  dog.join();
  if (rc != 0) return rc;
  if (self) return 0;
  std::printf("outcomes:");
  for (int i = 0; i < 7; ++i)
    std::printf(" %s=%llu", name(static_cast<Out>(i)),
                static_cast<unsigned long long>(gStats.outcomes[i]));
  std::printf("\nseconds per target:");
  for (int i = 0; i < 6; ++i) std::printf(" %s=%.2f", kTargets[i], spent[i]);
  std::printf("\nfuzz_wire: OK iterations=%llu frames=%llu idle=%llu handshakes=%llu "
              "datagrams=%llu mismatch_checks=%llu per_s=%.0f max_alloc=%zu\n",
              static_cast<unsigned long long>(gIter),
              static_cast<unsigned long long>(gStats.frames),
              static_cast<unsigned long long>(gStats.idle),
              static_cast<unsigned long long>(gStats.handshakes),
              static_cast<unsigned long long>(gStats.datagrams),
              static_cast<unsigned long long>(gStats.mismatchChecks),
              static_cast<double>(gIter) / el, gMaxAlloc.load());
  return 0;
}

