// Shared harness of the wire-protocol fuzzer (tests/cpp/fuzz_wire*.cc): the seeded PRNG,
// failure reporting with the seed to reproduce, outcome classes, socket pairs, counters,
// and the entry point of each target. Test code only; see fuzz_wire.cc for the overview.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/error.h"
#include "transport/tcp/link.h"
#include "transport/tcp/pipe.h"

namespace fuzz {

using Bytes = std::vector<uint8_t>;

struct Rng {  // xoshiro256**, seeded through splitmix64
  uint64_t s[4];
  explicit Rng(uint64_t seed) {
    for (auto& x : s) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      x = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3], s[2] ^= t, s[3] = rotl(s[3], 45);
    return r;
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  void fill(void* p, size_t n) {
    auto* b = static_cast<uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(next());
  }
  Bytes bytes(size_t n) {
    Bytes v(n);
    fill(v.data(), n);
    return v;
  }
  // Flip `flips` random bits of p[0, n) (the same bit twice undoes itself).
  void flipBits(uint8_t* p, size_t n, int flips) {
    for (int i = 0; i < flips; ++i) p[below(n)] ^= static_cast<uint8_t>(1u << below(8));
  }
};

// Run state, for failure reports (main thread writes; read by whoever fails).
extern uint64_t gSeed;
extern uint64_t gIter;
extern const char* gTarget;
extern bool gInjectBug;  // --inject-bug: corrupt every delivered payload before checking it

struct Stats {
  uint64_t frames = 0, idle = 0, handshakes = 0, datagrams = 0, mismatchChecks = 0;
  uint64_t outcomes[7] = {};  // indexed by Out
};
extern Stats gStats;

inline int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
inline double since(int64_t t0) { return static_cast<double>(nowNs() - t0) * 1e-9; }

// Print the failure with the seed and iteration that reproduce it, and exit 1 (from any
// thread: _Exit skips destructors of objects other threads still use).
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::string msg = rr::detail::concat(args...);
  std::fprintf(stderr, "fuzz_wire: FAILURE seed=%llu iteration=%llu target=%s: %s\n",
               static_cast<unsigned long long>(gSeed), static_cast<unsigned long long>(gIter),
               gTarget, msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}
#define FZ_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) ::fuzz::fail("check failed: " #cond ": ", __VA_ARGS__); \
  } while (0)

// What a receive ended with. kBlock: no complete frame and no error; the reader is parked
// on its poll deadline (the communicator turns that into a TimeoutError naming the peer).
enum class Out { kOk, kPeer, kMismatch, kTimeout, kOtherRr, kBlock, kGoodbye };
const char* name(Out o);
// The class of a caught exception; fails the run on anything but an rr::Error.
Out classify(std::exception_ptr e, std::string* what);

// A connected, non-blocking byte pipe: an AF_UNIX socketpair, loopback TCP through the real
// listenOn/connectTo/acceptOne, or a stream on a link (transport/tcp/link.h, over a
// socketpair): reader() for the connection under test, the writer's calls for the rest.
enum class Via { kUnix, kTcp, kLink };
const char* name(Via v);
Via randomVia(Rng& rng);  // mostly kUnix (fast); kTcp and kLink now and then
struct Pair {
  int r = -1, w = -1;  // sockets (kUnix, kTcp); -1 for a link's
  std::shared_ptr<rr::transport::tcp::Link> lr, lw;
  std::unique_ptr<rr::transport::tcp::Stream> sr, sw;
  Pair() = default;
  Pair(Pair&&) = default;
  ~Pair();
  // The reader's end as a pipe (once): what a TcpConnection under test reads through.
  std::unique_ptr<rr::transport::tcp::Pipe> reader();
  ssize_t send(const void* buf, size_t n);  // the writer's non-blocking send
  bool writeAll(const void* buf, size_t n, rr::Deadline d, std::string* err);
  void closeWriter();
};
Pair makePair(Via via);
void closeFd(int* fd);

template <typename T>
Bytes asBytes(const T& v) {
  Bytes b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

// Job secrets of awkward lengths: empty, short, one block, longer than a block (hashed).
inline std::string randomSecret(Rng& rng) {
  static const size_t lens[] = {0, 1, 16, 32, 64, 65, 100};
  Bytes b = rng.bytes(lens[rng.below(7)]);
  return std::string(b.begin(), b.end());
}

// Targets: one iteration each (fuzz_wire_frames.cc, _handshake.cc, _heartbeat.cc).
void frameIteration(Rng& rng);     // progressRecv on a generated stream
void idleIteration(Rng& rng);      // checkIdle on a generated stream
void mismatchIteration(Rng& rng);  // describeMismatch, and progressSend's bytes
void selfTestFrames(Rng& rng);     // fixed frame cases, each printed
void acceptIteration(Rng& rng);    // acceptHandshake against a scripted connector
void connectIteration(Rng& rng);   // connectHandshake against a scripted listener
void realHandshakeCheck(Rng& rng);  // real connector <-> real acceptor, recorded
void heartbeatSetup(Rng& rng);     // a live target Heartbeat; learns the datagram layout
void heartbeatIteration(Rng& rng);
void heartbeatTeardown();
// Self-test: a datagram signed for one init (heartbeatKey(secret, session 1)) is refused by
// a Heartbeat of the next init of the same job (session 2); the same fields signed for
// session 2 are accepted.
void heartbeatReplayAcrossInits();

}  // namespace fuzz
