// Handshakes: acceptHandshake (the listener side) against a scripted connector, and
// connectHandshake against a scripted listener, both knowing the job secret. The scripted
// side sends valid, flipped, random, replayed, wrong-secret, re-signed-with-bad-fields,
// truncated, stalled or trailing-byte messages; predictAccept mirrors the listener's
// checks, so every refusal must carry the predicted status, and a message the attacker
// could not have signed is accepted only when it is byte-identical to the valid one.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"
#include "core/sha256.h"
#include "fuzz_wire.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

using namespace rr;  // NOLINT
namespace tcp = rr::transport::tcp;

namespace fuzz {
namespace {

// ------------------------------------------------------------------ handshakes

// Mirrors of the handshake messages (csrc/transport/tcp/handshake.cc).
constexpr uint32_t kHelloMagic = 0x31485252;
constexpr uint32_t kWireVersion = 4;  // handshake.cc kVersion
struct Hello {
  uint32_t magic, version;
  int32_t rank, world;
  uint8_t nonce[16];
};
struct Auth {
  uint32_t magic, version;
  int32_t rank, world, target, pad;
  uint8_t nonce[16];
  uint8_t mac[32];
};
struct Ack {
  uint32_t magic, status;
  uint8_t mac[32];
};
static_assert(sizeof(Hello) == 32 && sizeof(Auth) == 72 && sizeof(Ack) == 40, "wire sizes");
enum : uint32_t {  // refusal codes, as handshake.cc numbers them
  kOk = 0,
  kBadMagic = 1,
  kWrongWorld = 2,
  kBadRank = 3,
  kDuplicate = 4,
  kBadAuth = 5
};

crypto::Digest hsMac(const std::string& secret, char tag, const uint8_t* n1, const uint8_t* n2,
                     int32_t a, int32_t b, int32_t c) {
  uint8_t msg[45];
  msg[0] = static_cast<uint8_t>(tag);
  std::memcpy(msg + 1, n1, 16);
  std::memcpy(msg + 17, n2, 16);
  std::memcpy(msg + 33, &a, 4);
  std::memcpy(msg + 37, &b, 4);
  std::memcpy(msg + 41, &c, 4);
  return crypto::hmacSha256(secret.data(), secret.size(), msg, sizeof(msg));
}

Auth signedAuth(const std::string& secret, const uint8_t* helloNonce, const uint8_t* nonce,
                int32_t rank, int32_t world, int32_t target) {
  Auth a{kHelloMagic, kWireVersion, rank, world, target, 0, {}, {}};
  std::memcpy(a.nonce, nonce, 16);
  auto m = hsMac(secret, 'C', helloNonce, a.nonce, rank, world, target);
  std::memcpy(a.mac, m.data(), 32);
  return a;
}

std::deque<Bytes> gOldAuths;  // valid Auth messages of earlier handshakes (stale nonces)

// What the acceptor must answer to the first 72 bytes `m` (kOk: accept).
uint32_t predictAccept(const Bytes& m, const Hello& hello, const tcp::Identity& me, bool expected) {
  Auth a;
  std::memcpy(&a, m.data(), sizeof(a));
  if (a.magic != kHelloMagic || a.version != kWireVersion || a.pad != 0) return kBadMagic;
  auto want = hsMac(me.secret, 'C', hello.nonce, a.nonce, a.rank, a.world, a.target);
  if (std::memcmp(want.data(), a.mac, 32) != 0) return kBadAuth;
  if (a.world != me.world) return kWrongWorld;
  if (a.target != me.rank || a.rank <= me.rank || a.rank >= me.world) return kBadRank;
  if (!expected) return kDuplicate;
  return kOk;
}

void runAcceptCase(Rng& rng) {
  tcp::Identity me;
  me.world = 2 + static_cast<int>(rng.below(8));
  me.rank = static_cast<int>(rng.below(static_cast<size_t>(me.world - 1)));
  me.secret = randomSecret(rng);
  const bool expected = rng.chance(0.9);
  enum { kValid, kFlip, kRandom, kEcho, kReplay, kWrongSecret, kResigned, kTrailing, kTruncClose,
         kTruncStall, kByteWrites, kCloseEarly, kModes };
  const int mode = static_cast<int>(rng.below(kModes));
  const bool stall = mode == kTruncStall;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair failed");
  tcp::setNonBlocking(sv[0]);
  tcp::setNonBlocking(sv[1]);
  int ret = -2;
  std::string reason;
  double took = 0;
  const double limit = stall ? 0.02 : 10.0;
  std::thread acceptor([&] {
    int64_t t0 = nowNs();
    try {
      ret = tcp::acceptHandshake(sv[0], me, Deadline::after(limit),
                                 [&](int) { return expected; }, &reason);
    } catch (...) {
      std::string w;
      classify(std::current_exception(), &w);
      fail("acceptHandshake threw instead of refusing: ", w);
    }
    took = since(t0);
  });
  int my = sv[1];
  std::string err;
  uint32_t want = kBadMagic;
  bool full = false;  // 72 bytes reach the acceptor
  Bytes valid;
  if (mode == kCloseEarly) {
    closeFd(&my);
  } else {
    Hello hello;
    if (!tcp::readFull(my, &hello, sizeof(hello), Deadline::after(10), &err)) fail("hello: ", err);
    FZ_CHECK(hello.magic == kHelloMagic && hello.version == kWireVersion && hello.rank == me.rank &&
                 hello.world == me.world,
             "the listener's hello names rank ", hello.rank, " of ", hello.world);
    const size_t higher = static_cast<size_t>(me.world - me.rank - 1);  // ranks that connect here
    int32_t claim = me.rank + 1 + static_cast<int32_t>(rng.below(higher));
    Bytes nonce = rng.bytes(16);
    valid = asBytes(signedAuth(me.secret, hello.nonce, nonce.data(), claim, me.world, me.rank));
    Bytes m = valid;
    switch (mode) {
      case kFlip: {
        int flips = 1 + static_cast<int>(rng.below(3));
        rng.flipBits(m.data(), m.size(), flips);
        break;
      }
      case kRandom: m = rng.bytes(72); break;
      case kEcho: {  // the listener's own hello, mutated, padded to an Auth
        m = asBytes(hello);
        m[rng.below(m.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
        Bytes tail = rng.bytes(40);
        m.insert(m.end(), tail.begin(), tail.end());
        break;
      }
      case kReplay:
        if (!gOldAuths.empty()) m = gOldAuths[rng.below(gOldAuths.size())];
        break;
      case kWrongSecret: {
        std::string other = me.secret + "x";
        m = asBytes(signedAuth(other, hello.nonce, nonce.data(), claim, me.world, me.rank));
        break;
      }
      case kResigned: {  // knows the secret, claims something it may not
        const int32_t odd[] = {me.rank,  me.rank - 1, me.world, me.world + 1,
                               -1,       INT_MIN,     INT_MAX,  claim};
        int32_t rank = claim, world = me.world, target = me.rank;
        switch (rng.below(3)) {
          case 0: rank = odd[rng.below(8)]; break;
          case 1: world = odd[rng.below(8)]; break;
          default: target = odd[rng.below(8)]; break;
        }
        m = asBytes(signedAuth(me.secret, hello.nonce, nonce.data(), rank, world, target));
        break;
      }
      case kTrailing: {
        Bytes tail = rng.bytes(1 + rng.below(100));
        m.insert(m.end(), tail.begin(), tail.end());
        break;
      }
      case kTruncClose:
      case kTruncStall: m.resize(rng.below(72)); break;
      default: break;
    }
    full = m.size() >= 72;
    if (full) want = predictAccept(m, hello, me, expected);
    if (mode == kByteWrites) {
      for (uint8_t b : m)
        if (!tcp::writeFull(my, &b, 1, Deadline::after(10), &err)) fail("auth: ", err);
    } else if (!m.empty() && !tcp::writeFull(my, m.data(), m.size(), Deadline::after(10), &err)) {
      fail("auth: ", err);
    }
    if (mode == kTruncClose) ::shutdown(my, SHUT_WR);
    if (full) {
      Ack ack;
      if (!tcp::readFull(my, &ack, sizeof(ack), Deadline::after(10), &err)) fail("ack: ", err);
      FZ_CHECK(ack.magic == kHelloMagic && ack.status == want, "acceptor answered status ",
               ack.status, ", expected ", want, " (mode ", mode, ")");
      if (want == kOk) {
        Auth a;
        std::memcpy(&a, m.data(), sizeof(a));
        auto am = hsMac(me.secret, 'A', a.nonce, hello.nonce, me.rank, a.rank, me.world);
        FZ_CHECK(std::memcmp(am.data(), ack.mac, 32) == 0, "acceptor's proof is wrong");
        // Unless the attacker holds the secret, only the exact valid message gets in.
        if (mode != kResigned) FZ_CHECK(std::equal(valid.begin(), valid.end(), m.begin()),
                                        "a mutated handshake was accepted (mode ", mode, ")");
      }
    }
    if (mode == kValid || mode == kTrailing || mode == kByteWrites)
      if (gOldAuths.size() < 32) gOldAuths.push_back(valid);
  }
  acceptor.join();
  FZ_CHECK(took < limit + 2.0, "acceptHandshake took ", took, " s (deadline ", limit, " s)");
  if (full && want == kOk) {
    FZ_CHECK(ret >= 0, "valid handshake refused: ", reason);
  } else {
    FZ_CHECK(ret == -1 && !reason.empty(), "acceptHandshake returned ", ret, " (mode ", mode,
             ") instead of refusing");
  }
  closeFd(&my);
  closeFd(&sv[0]);
  ++gStats.handshakes;
}

// connectHandshake against a scripted listener: accepts only a correct hello followed by
// the exact Ack a listener with the secret would send.
void runConnectCase(Rng& rng) {
  tcp::Identity me;
  me.world = 2 + static_cast<int>(rng.below(8));
  me.rank = 1 + static_cast<int>(rng.below(static_cast<size_t>(me.world - 1)));
  me.secret = randomSecret(rng);
  const int target = static_cast<int>(rng.below(static_cast<size_t>(me.rank)));
  enum { kValid, kHelloFlip, kHelloTrunc, kHelloStall, kAckFlip, kAckRandom, kAckStatus,
         kAckTrunc, kAckStall, kAckReplay, kModes };
  const int mode = static_cast<int>(rng.below(kModes));
  const bool stall = mode == kHelloStall || mode == kAckStall;
  const double limit = stall ? 0.02 : 10.0;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) fail("socketpair failed");
  tcp::setNonBlocking(sv[0]);
  tcp::setNonBlocking(sv[1]);
  Out got = Out::kBlock;
  std::string what;
  PeerCause cause = PeerCause::kHandshake;
  double took = 0;
  std::thread connector([&] {
    int64_t t0 = nowNs();
    try {
      tcp::connectHandshake(sv[0], me, target, "fuzz:1", Deadline::after(limit));
      got = Out::kOk;
    } catch (...) {
      std::exception_ptr e = std::current_exception();
      try {
        std::rethrow_exception(e);
      } catch (const PeerError& x) {
        what = x.what();
        cause = x.cause();
        got = x.peer() == target ? Out::kPeer : Out::kOtherRr;
      } catch (...) {
        got = classify(e, &what);
      }
    }
    took = since(t0);
  });
  int my = sv[1];
  std::string err;
  Hello hello{kHelloMagic, kWireVersion, target, me.world, {}};
  rng.fill(hello.nonce, 16);
  Bytes hb = asBytes(hello);
  if (mode == kHelloFlip) hb[rng.below(hb.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
  if (mode == kHelloTrunc || mode == kHelloStall) hb.resize(rng.below(hb.size()));
  std::memcpy(&hello, hb.data(), std::min(hb.size(), sizeof(hello)));
  bool helloOk = hb.size() == sizeof(Hello) && hello.magic == kHelloMagic && hello.version == kWireVersion &&
                 hello.rank == target;  // world and nonce are not the connector's to check
  if (!hb.empty() && !tcp::writeFull(my, hb.data(), hb.size(), Deadline::after(10), &err))
    fail("hello: ", err);
  if (mode == kHelloTrunc) ::shutdown(my, SHUT_WR);
  bool accept = false;
  Auth a{};
  if (helloOk) {
    if (!tcp::readFull(my, &a, sizeof(a), Deadline::after(stall ? limit + 2 : 10), &err)) {
      // Only a stalled case may fail here: on a loaded machine its short deadline can pass
      // before the connector got to send its authentication.
      FZ_CHECK(stall, "auth: ", err);
      helloOk = false;
    }
  }
  if (helloOk) {
    auto m = hsMac(me.secret, 'C', hello.nonce, a.nonce, me.rank, me.world, target);
    FZ_CHECK(a.magic == kHelloMagic && a.version == kWireVersion && a.rank == me.rank &&
                 a.world == me.world && a.target == target && a.pad == 0 &&
                 std::memcmp(m.data(), a.mac, 32) == 0,
             "the connector's authentication message is wrong");
    Ack ack{kHelloMagic, kOk, {}};
    auto am = hsMac(me.secret, 'A', a.nonce, hello.nonce, target, me.rank, me.world);
    std::memcpy(ack.mac, am.data(), 32);
    Bytes valid = asBytes(ack), out = valid;
    static std::deque<Bytes> oldAcks;
    switch (mode) {
      case kAckFlip: out[rng.below(out.size())] ^= static_cast<uint8_t>(1u << rng.below(8)); break;
      case kAckRandom: out = rng.bytes(40); break;
      case kAckStatus: {
        uint32_t st = 1 + static_cast<uint32_t>(rng.below(8));
        std::memcpy(out.data() + 4, &st, 4);
        break;
      }
      case kAckTrunc:
      case kAckStall: out.resize(rng.below(40)); break;
      case kAckReplay:
        if (!oldAcks.empty()) out = oldAcks[rng.below(oldAcks.size())];
        break;
      default: break;
    }
    if (oldAcks.size() < 16) oldAcks.push_back(valid);
    accept = out == valid;
    if (!out.empty() && !tcp::writeFull(my, out.data(), out.size(), Deadline::after(10), &err))
      fail("ack: ", err);
    if (mode == kAckTrunc) ::shutdown(my, SHUT_WR);
  }
  connector.join();
  FZ_CHECK(took < limit + 2.0, "connectHandshake took ", took, " s (deadline ", limit, " s)");
  FZ_CHECK(got == (accept ? Out::kOk : Out::kPeer), "connectHandshake (mode ", mode, ") ended ",
           name(got), " '", what, "', expected ", accept ? "success" : "PeerError");
  // Closed before a whole hello or ack: the listening process is gone (a dead rank, named
  // as one when relayed) -- or its flooded listener dropped us, and the dial tries again
  // (mesh.cc); anything else wrong is a failed handshake.
  if (!accept)
    FZ_CHECK(cause == (mode == kHelloTrunc || mode == kAckTrunc ? PeerCause::kClosed
                                                                 : PeerCause::kHandshake),
             "connectHandshake (mode ", mode, ") gave cause ", toString(cause), ": '", what, "'");
  closeFd(&my);
  closeFd(&sv[0]);
  ++gStats.handshakes;
}

// The real connector against the real acceptor through a recording relay: the mirrors
// above must reproduce every MAC in the captured bytes, and the capture feeds the replays.
void checkRealHandshake(Rng& rng) {
  tcp::Identity acc{0, 3, randomSecret(rng), {}}, con{2, 3, acc.secret, {}};
  int a[2], c[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a) != 0 ||
      ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c) != 0)
    fail("socketpair failed");
  for (int fd : {a[0], a[1], c[0], c[1]}) tcp::setNonBlocking(fd);
  int ret = -2;
  std::string reason, cerr;
  std::thread ta([&] {
    ret = tcp::acceptHandshake(a[0], acc, Deadline::after(10), [](int) { return true; }, &reason);
  });
  std::thread tc([&] {
    try {
      tcp::connectHandshake(c[0], con, 0, "relay", Deadline::after(10));
    } catch (const std::exception& e) {
      cerr = e.what();
    }
  });
  Hello h;
  Auth au;
  Ack ak;
  std::string err;
  Deadline d = Deadline::after(10);
  auto relay = [&](int from, int to, void* buf, size_t n) {
    return tcp::readFull(from, buf, n, d, &err) && tcp::writeFull(to, buf, n, d, &err);
  };
  bool ok = relay(a[1], c[1], &h, sizeof(h)) && relay(c[1], a[1], &au, sizeof(au)) &&
            relay(a[1], c[1], &ak, sizeof(ak));
  ta.join();
  tc.join();
  for (int fd : {a[0], a[1], c[0], c[1]}) ::close(fd);
  FZ_CHECK(ok && ret == 2 && cerr.empty(), "real handshake failed: relay '", err, "' acceptor ",
           ret, " '", reason, "' connector '", cerr, "'");
  Auth mine = signedAuth(acc.secret, h.nonce, au.nonce, 2, 3, 0);
  FZ_CHECK(asBytes(mine) == asBytes(au), "the mirrored Auth differs from the real one");
  auto am = hsMac(acc.secret, 'A', au.nonce, h.nonce, 0, 2, 3);
  FZ_CHECK(ak.magic == kHelloMagic && ak.status == kOk && std::memcmp(am.data(), ak.mac, 32) == 0,
           "the mirrored Ack differs from the real one");
  if (gOldAuths.size() < 32) gOldAuths.push_back(asBytes(au));
  else gOldAuths[rng.below(gOldAuths.size())] = asBytes(au);
}

}  // namespace

void acceptIteration(Rng& rng) { runAcceptCase(rng); }
void connectIteration(Rng& rng) { runConnectCase(rng); }
void realHandshakeCheck(Rng& rng) { checkRealHandshake(rng); }

}  // namespace fuzz
