#include "transport/tcp/handshake.h"

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/sha256.h"
#include "transport/tcp/socket.h"

namespace rr::transport::tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x31485252;  // "RRH1"
constexpr uint32_t kVersion = 4;  // 2: heartbeats carry call site and wait target; 3: the
                                  // root, and the process's collective on other comms; 4:
                                  // a link's stream starts with 256 KiB of credit (kSubOpen)

enum Status : uint32_t {
  kOk = 0,
  kBadMagic = 1,
  kWrongWorld = 2,
  kBadRank = 3,
  kDuplicate = 4,
  kBadAuth = 5,
};

const char* statusText(uint32_t s) {
  switch (s) {
    case kOk: return "ok";
    case kBadMagic: return "not a ringreduce peer or incompatible version";
    case kWrongWorld: return "world size differs (check WORLD_SIZE on every rank)";
    case kBadRank: return "rank out of range or not expected to connect here";
    case kDuplicate: return "another process already connected with this rank (duplicate RANK?)";
    case kBadAuth: return "authentication failed: wrong job secret (RINGREDUCE_SECRET differs, "
                          "or this is another job's process)";
    default: return "unknown refusal";
  }
}

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

crypto::Digest mac(const std::string& secret, char tag, const uint8_t* n1, const uint8_t* n2,
                   int32_t a, int32_t b, int32_t c) {
  uint8_t msg[1 + 16 + 16 + 12];
  msg[0] = static_cast<uint8_t>(tag);
  std::memcpy(msg + 1, n1, 16);
  std::memcpy(msg + 17, n2, 16);
  std::memcpy(msg + 33, &a, 4);
  std::memcpy(msg + 37, &b, 4);
  std::memcpy(msg + 41, &c, 4);
  return crypto::hmacSha256(secret.data(), secret.size(), msg, sizeof(msg));
}

}  // namespace

bool sendHello(int fd, const Identity& me, AcceptState* st, std::string* reason) {
  std::string err;
  Hello hello{kHelloMagic, kVersion, me.rank, me.world, {}};
  crypto::randomBytes(hello.nonce, sizeof(hello.nonce));
  std::memcpy(st->nonce, hello.nonce, sizeof(st->nonce));
  // A fresh socket's buffer takes it at once; the short deadline only bounds a broken one.
  if (!writeFull(fd, &hello, sizeof(hello), Deadline::after(1.0), &err)) {
    *reason = "sending hello: " + err;
    return false;
  }
  return true;
}

int finishAccept(int fd, const Identity& me, const AcceptState& st, const uint8_t* authBytes,
                 bool (*isExpected)(void*, int), void* ctx, std::string* reason) {
  static_assert(sizeof(Auth) == kAuthBytes, "kAuthBytes is the size of Auth");
  const Deadline d = Deadline::after(1.0);  // an ack fits the socket's buffer
  Auth auth{};
  std::memcpy(&auth, authBytes, sizeof(auth));
  std::string err;
  auto refuse = [&](uint32_t status, const std::string& detail) {
    Ack ack{kHelloMagic, status, {}};
    std::string e;
    writeFull(fd, &ack, sizeof(ack), d, &e);
    *reason = std::string(statusText(status)) + detail;
    return -1;
  };
  // `pad` is outside the MAC: anything but the zero a real peer sends is a forgery or noise.
  if (auth.magic != kHelloMagic || auth.version != kVersion || auth.pad != 0)
    return refuse(kBadMagic, "");
  crypto::Digest want = mac(me.secret, 'C', st.nonce, auth.nonce, auth.rank, auth.world, auth.target);
  crypto::Digest got;
  std::memcpy(got.data(), auth.mac, 32);
  if (!crypto::digestEqual(want, got)) return refuse(kBadAuth, "");
  if (auth.world != me.world)
    return refuse(kWrongWorld, detail::concat(": peer says ", auth.world, ", this rank has ", me.world));
  if (auth.target != me.rank || auth.rank <= me.rank || auth.rank >= me.world)
    return refuse(kBadRank, detail::concat(": peer claims rank ", auth.rank, " targeting ", auth.target));
  if (!isExpected(ctx, auth.rank))
    return refuse(kDuplicate, detail::concat(": rank ", auth.rank));
  Ack ack{kHelloMagic, kOk, {}};
  crypto::Digest am = mac(me.secret, 'A', auth.nonce, st.nonce, me.rank, auth.rank, me.world);
  std::memcpy(ack.mac, am.data(), 32);
  if (!writeFull(fd, &ack, sizeof(ack), d, &err)) {
    *reason = "sending ack: " + err;
    return -1;
  }
  return auth.rank;
}

int acceptHandshakeImpl(int fd, const Identity& me, Deadline d, bool (*isExpected)(void*, int),
                        void* ctx, std::string* reason) {
  AcceptState st;
  if (!sendHello(fd, me, &st, reason)) return -1;
  uint8_t auth[kAuthBytes];
  std::string err;
  if (!readFull(fd, auth, sizeof(auth), d, &err)) {
    *reason = "reading authentication: " + err;
    return -1;
  }
  return finishAccept(fd, me, st, auth, isExpected, ctx, reason);
}

namespace {
[[noreturn]] void failConnect(const Identity& me, int target, const std::string& targetAddr,
                              const std::string& why) {
  throw PeerError(target, PeerCause::kHandshake,
                  detail::concat("handshake with rank ", me.shown(target), " at ", targetAddr,
                                 " failed: ", why));
}
}  // namespace

void connectHandshake(int fd, const Identity& me, int target, const std::string& targetAddr,
                      Deadline d) {
  checkAck(fd, me, target, targetAddr, answerHello(fd, me, target, targetAddr, d), d);
}

ConnectState answerHello(int fd, const Identity& me, int target, const std::string& targetAddr,
                         Deadline d) {
  std::string err;
  auto fail = [&](const std::string& why) { failConnect(me, target, targetAddr, why); };
  Hello hello{};
  if (!readFull(fd, &hello, sizeof(hello), d, &err, true)) {
    // Closed or reset before its hello: the process that listened there is gone (it listens
    // from before its address is published until destroy) -- a dead rank, which survivors
    // told of it must name too (a handshake failure is not relayed as the culprit).
    if (!d.expired())
      throw PeerError(target, PeerCause::kClosed,
                      detail::concat("rank ", me.shown(target), " at ", targetAddr,
                                     " closed the connection before its hello (", err,
                                     "): the process exited or crashed"));
    fail("reading hello: " + err);
  }
  if (hello.magic != kHelloMagic || hello.version != kVersion)
    fail("the process listening there is not a compatible ringreduce rank");
  if (hello.rank != target)
    fail(detail::concat("expected rank ", target, " but rank ", hello.rank,
                        " answered (stale address in the store from another job?)"));
  Auth auth{kHelloMagic, kVersion, me.rank, me.world, target, 0, {}, {}};
  crypto::randomBytes(auth.nonce, sizeof(auth.nonce));
  crypto::Digest m = mac(me.secret, 'C', hello.nonce, auth.nonce, me.rank, me.world, target);
  std::memcpy(auth.mac, m.data(), 32);
  if (!writeFull(fd, &auth, sizeof(auth), d, &err)) fail("sending authentication: " + err);
  ConnectState st;
  std::memcpy(st.helloNonce, hello.nonce, sizeof(st.helloNonce));
  std::memcpy(st.authNonce, auth.nonce, sizeof(st.authNonce));
  return st;
}

void checkAck(int fd, const Identity& me, int target, const std::string& targetAddr,
              const ConnectState& st, Deadline d) {
  std::string err;
  auto fail = [&](const std::string& why) { failConnect(me, target, targetAddr, why); };
  Ack ack{};
  if (!readFull(fd, &ack, sizeof(ack), d, &err, true)) {
    // Closed or reset before its reply: the peer's process is gone -- or its listener,
    // flooded with strangers' connections, dropped this one (accept_queue.h): a dial that
    // gets this tries again (mesh.cc), and a gone peer then refuses it.
    if (!d.expired())
      throw PeerError(target, PeerCause::kClosed,
                      detail::concat("rank ", me.shown(target), " at ", targetAddr,
                                     " closed the connection before its reply (", err, ")"));
    fail("reading reply: " + err);
  }
  if (ack.magic != kHelloMagic) fail("malformed reply");
  if (ack.status != kOk) fail(std::string("refused: ") + statusText(ack.status));
  crypto::Digest want = mac(me.secret, 'A', st.authNonce, st.helloNonce, target, me.rank,
                            me.world);
  crypto::Digest got;
  std::memcpy(got.data(), ack.mac, 32);
  if (!crypto::digestEqual(want, got))
    fail("the peer could not prove it knows the job secret (impostor or secret mismatch)");
}

}  // namespace rr::transport::tcp
