// Heartbeats: a live Heartbeat (rank 0 of 3) receives random, flipped, replayed,
// wrong-secret, out-of-range and truncated datagrams claiming to be a victim rank. A fresh
// authenticated datagram from the other rank then fences the batch (one socket, one
// thread: everything before it has been processed once it shows), after which the
// victim's PeerStatus must equal the model: changed only by authenticated, fresh ones.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"
#include "core/sha256.h"
#include "fuzz_wire.h"
#include "transport/heartbeat.h"

using namespace rr;             // NOLINT
using namespace rr::transport;  // NOLINT

namespace fuzz {
namespace {

// ------------------------------------------------------------------ heartbeats

// The datagram layout is private to heartbeat.cc and still growing, so it is learned from
// real datagrams rather than mirrored: magic, rank and pid lead; the MAC is the last 16
// bytes, an HMAC-SHA256 of everything before it; seq, bytes, counter and kind are found
// by sending known values (and two consecutive datagrams for the counter).
constexpr uint32_t kHbMagic = 0x31424852;
constexpr uint64_t kSeqMask = (uint64_t{1} << 56) - 1;
constexpr size_t kMacBytes = 16;

struct Layout {
  size_t size = 0, seq = 0, bytes = 0, counter = 0, kind = 0;
  Bytes tmpl;  // a real datagram: the fields we do not set keep its values
} gLay;

template <typename T>
T getAt(const Bytes& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof(T));
  return v;
}
template <typename T>
void putAt(Bytes& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

void signDatagram(const std::string& secret, Bytes& d) {
  auto m = crypto::hmacSha256(secret.data(), secret.size(), d.data(), d.size() - kMacBytes);
  std::memcpy(d.data() + d.size() - kMacBytes, m.data(), kMacBytes);
}

struct Dg {  // the fields of a datagram this fuzzer sets
  int32_t rank = 0;
  uint32_t pid = 0;
  uint8_t kind = 0;
  uint64_t seq = 0, bytes = 0, counter = 0;
};

Bytes makeDatagram(const std::string& secret, const Dg& f) {
  Bytes d = gLay.tmpl;
  putAt<int32_t>(d, 4, f.rank);
  putAt<uint32_t>(d, 8, f.pid);
  d[gLay.kind] = f.kind;
  putAt<uint64_t>(d, gLay.seq, f.seq);
  putAt<uint64_t>(d, gLay.bytes, f.bytes);
  putAt<uint64_t>(d, gLay.counter, f.counter);
  signDatagram(secret, d);
  return d;
}

struct Model {  // what Heartbeat::status(rank) must say
  bool heard = false;
  Dg last;
};

struct HbRig {
  std::string secret;
  std::unique_ptr<Heartbeat> hb;  // rank 0 of 3, the target
  int tx = -1, sink = -1;         // our sender; where the target's own heartbeats go
  sockaddr_in to{};
  Model model[3];
  uint64_t fenceSeq = 1;
};
HbRig* gHb = nullptr;

int udpSocket(int* port) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) fail("udp bind");
  socklen_t l = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l);
  *port = ntohs(a.sin_port);
  return fd;
}

void sendDatagram(const Bytes& b) {
  HbRig& r = *gHb;
  ::sendto(r.tx, b.data(), b.size(), 0, reinterpret_cast<const sockaddr*>(&r.to), sizeof(r.to));
  ++gStats.datagrams;
}

bool matches(const PeerStatus& s, const Model& m) {
  if (!m.heard) return s.ageMs == -1 && s.pid == 0 && s.seq == 0 && s.kind == 0 && s.bytesDone == 0;
  return s.ageMs >= 0 && s.pid == m.last.pid && s.seq == (m.last.seq & kSeqMask) &&
         s.kind == m.last.kind && s.bytesDone == m.last.bytes;
}

void accepted(Model& m, const Dg& d) {
  m.heard = true;
  m.last = d;
}

// Send a fresh datagram from `rank` and wait until the target shows it: everything sent
// before it has been processed by then (one socket, one thread, in order).
void fence(int rank) {
  HbRig& r = *gHb;
  Dg f{rank, 4242, 3, r.fenceSeq++, 7, r.model[rank].last.counter + 1};
  Bytes d = makeDatagram(r.secret, f);
  accepted(r.model[rank], f);
  Deadline dl = Deadline::after(5);
  for (int i = 0; !matches(r.hb->status(rank), r.model[rank]); ++i) {
    if (dl.expired()) fail("the heartbeat never showed fence datagram from rank ", rank);
    if (i % 100 == 0) sendDatagram(d);  // a lost datagram is resent (a replay if it was not)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Bytes sniff(int fd) {
  uint8_t raw[2048];
  pollfd pf{fd, POLLIN, 0};
  ssize_t n = ::poll(&pf, 1, 5000) == 1 ? ::recv(fd, raw, sizeof(raw), 0) : -1;
  if (n <= 0) fail("no heartbeat datagram from the real sender");
  return Bytes(raw, raw + n);
}

// The single offset (step-aligned, before the MAC) where pred holds; fails otherwise.
template <typename Pred>
size_t findOffset(size_t n, size_t step, size_t width, const char* what, Pred pred) {
  size_t found = SIZE_MAX;
  for (size_t o = 0; o + width <= n - kMacBytes; o += step)
    if (pred(o)) {
      if (found != SIZE_MAX) fail("heartbeat layout: ", what, " found twice");
      found = o;
    }
  if (found == SIZE_MAX) fail("heartbeat layout: ", what, " not found");
  return found;
}

void setupHeartbeat(Rng& rng) {
  gHb = new HbRig;
  HbRig& r = *gHb;
  r.secret = randomSecret(rng) + "hb";
  int sinkPort = 0, txPort = 0, snifPort = 0;
  r.sink = udpSocket(&sinkPort);
  r.tx = udpSocket(&txPort);
  std::string sinkAddr = "127.0.0.1:" + std::to_string(sinkPort);
  r.hb = std::make_unique<Heartbeat>("127.0.0.1");
  r.hb->start(0, {"", sinkAddr, sinkAddr}, r.secret, 0.05);
  r.to.sin_family = AF_INET;
  r.to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  r.to.sin_port = htons(static_cast<uint16_t>(r.hb->port()));
  // A real sender (rank 1) heartbeats to our sniffer with known values.
  const uint64_t kSeq = 0x00123456789abcdeull, kBytes = 0x0fedcba987654321ull;
  int snif = udpSocket(&snifPort);
  Heartbeat sender("127.0.0.1");
  sender.setState(0x5a, kSeq, kBytes);
  sender.start(1, {"127.0.0.1:" + std::to_string(snifPort), "", ""}, r.secret, 0.01);
  Bytes d1 = sniff(snif), d2 = sniff(snif);
  sender.setState(0xa5, kSeq, kBytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  uint8_t junk[2048];
  while (::recv(snif, junk, sizeof(junk), MSG_DONTWAIT) > 0) {
  }
  Bytes d3 = sniff(snif);
  sender.stop();
  ::close(snif);
  const size_t n = d1.size();
  FZ_CHECK(n > kMacBytes + 12 && d2.size() == n && d3.size() == n, "datagram sizes ", n);
  for (const Bytes* d : {&d1, &d2, &d3}) {
    Bytes re = *d;
    signDatagram(r.secret, re);
    FZ_CHECK(re == *d, "a real heartbeat's MAC is not HMAC(secret, all before it)");
    FZ_CHECK(getAt<uint32_t>(*d, 0) == kHbMagic && getAt<int32_t>(*d, 4) == 1 &&
                 getAt<uint32_t>(*d, 8) == static_cast<uint32_t>(::getpid()),
             "a real heartbeat does not lead with magic, rank, pid");
  }
  gLay.size = n;
  gLay.seq = findOffset(n, 8, 8, "seq", [&](size_t o) { return getAt<uint64_t>(d1, o) == kSeq; });
  gLay.bytes =
      findOffset(n, 8, 8, "bytes", [&](size_t o) { return getAt<uint64_t>(d1, o) == kBytes; });
  gLay.counter = findOffset(n, 8, 8, "counter", [&](size_t o) {
    return getAt<uint64_t>(d2, o) == getAt<uint64_t>(d1, o) + 1;
  });
  gLay.kind = findOffset(n, 1, 1, "kind", [&](size_t o) { return d1[o] == 0x5a && d3[o] == 0xa5; });
  gLay.tmpl = d1;
  // Our construction must reproduce the real datagram exactly...
  Dg f{1, static_cast<uint32_t>(::getpid()), 0x5a, kSeq, kBytes, getAt<uint64_t>(d1, gLay.counter)};
  FZ_CHECK(makeDatagram(r.secret, f) == d1, "rebuilding a real heartbeat changed it");
  // ...and the real one, forwarded, is what the target reports for rank 1.
  sendDatagram(d2);
  f.counter = getAt<uint64_t>(d2, gLay.counter);
  accepted(r.model[1], f);
  Deadline dl = Deadline::after(5);
  while (!matches(r.hb->status(1), r.model[1]))
    if (dl.expired()) fail("a real heartbeat was not accepted");
}

void teardownHeartbeat() {
  gHb->hb->stop();
  ::close(gHb->tx);
  ::close(gHb->sink);
  delete gHb;
  gHb = nullptr;
}

std::deque<Bytes> gOldDatagrams;

void runHeartbeatCase(Rng& rng) {
  HbRig& r = *gHb;
  const int v = 1 + static_cast<int>(rng.below(2)), f = 3 - v;  // victim, fence
  const size_t batch = 1 + rng.below(12);
  for (size_t i = 0; i < batch; ++i) {
    Dg fields{v, static_cast<uint32_t>(rng.next()), static_cast<uint8_t>(rng.next()), rng.next(),
              rng.next(), r.model[v].last.counter + 1 + rng.below(3)};
    const Bytes valid = makeDatagram(r.secret, fields);
    Bytes b = valid;
    bool fresh = false;  // an authenticated, new datagram: the victim's status moves
    switch (rng.below(9)) {
      case 0: b = rng.bytes(rng.below(2 * gLay.size)); break;
      case 1: {
        int flips = 1 + static_cast<int>(rng.below(3));
        rng.flipBits(b.data(), b.size(), flips);
        fresh = b == valid;
        break;
      }
      case 2:  // authenticated replay (the fresh one itself while there is no history)
        if (!gOldDatagrams.empty()) b = gOldDatagrams[rng.below(gOldDatagrams.size())];
        fresh = gOldDatagrams.empty();
        break;
      case 3: b = makeDatagram(r.secret + "?", fields); break;
      case 4: {  // authenticated, but from no valid peer or with a foreign magic
        const int32_t ranks[] = {0, 3, -1, INT_MIN, INT_MAX};
        Dg g = fields;
        g.rank = ranks[rng.below(5)];
        b = makeDatagram(r.secret, g);
        if (rng.chance(0.3)) {
          putAt<int32_t>(b, 4, v);
          putAt<uint32_t>(b, 0, kHbMagic ^ 0x100);
          signDatagram(r.secret, b);
        }
        break;
      }
      case 5: b.resize(rng.below(b.size())); break;
      case 6: {  // fresh and authenticated, with trailing bytes (recv truncates them)
        Bytes tail = rng.bytes(1 + rng.below(64));
        b.insert(b.end(), tail.begin(), tail.end());
        fresh = true;
        break;
      }
      default: fresh = true; break;
    }
    if (fresh) {
      accepted(r.model[v], fields);
      if (gOldDatagrams.size() < 64) gOldDatagrams.push_back(valid);
      else gOldDatagrams[rng.below(gOldDatagrams.size())] = valid;
    }
    sendDatagram(b);
  }
  fence(f);
  PeerStatus s = r.hb->status(v);
  const Dg& m = r.model[v].last;
  FZ_CHECK(matches(s, r.model[v]), "rank ", v, " status pid ", s.pid, " seq ", s.seq, " kind ",
           int(s.kind), " bytes ", s.bytesDone, " age ", s.ageMs, "; expected pid ", m.pid,
           " seq ", (m.seq & kSeqMask), " kind ", int(m.kind), " bytes ", m.bytes);
  FZ_CHECK(matches(r.hb->status(0), Model{}), "the target's own slot changed");
}

void replayAcrossInits() {
  HbRig& r = *gHb;
  const std::string k1 = heartbeatKey(r.secret, "session-of-init-1");
  const std::string k2 = heartbeatKey(r.secret, "session-of-init-2");
  FZ_CHECK(k1 != k2 && k1 != r.secret && heartbeatKey(r.secret, "") == r.secret,
           "heartbeat keys do not depend on the session");
  Heartbeat next("127.0.0.1");  // rank 0 of the next init of the same job
  next.start(0, {"", "127.0.0.1:9", "127.0.0.1:9"}, k2, 10.0);
  sockaddr_in to = r.to;
  to.sin_port = htons(static_cast<uint16_t>(next.port()));
  auto send = [&](const Bytes& b) {
    ::sendto(r.tx, b.data(), b.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof(to));
  };
  // Counter 1: what the first datagram of every init carries, so only the key tells them
  // apart. Then a fresh datagram of init 2 from rank 2 fences (one socket, in order).
  Dg old{1, 1111, 1, 5, 6, 1};
  send(makeDatagram(k1, old));
  Dg fenceDg{2, 2222, 2, 7, 8, 1};
  Bytes fenceBytes = makeDatagram(k2, fenceDg);
  Deadline dl = Deadline::after(5);
  for (int i = 0; next.status(2).pid != 2222; ++i) {
    if (dl.expired()) fail("the next init's Heartbeat never showed its own fence datagram");
    if (i % 100 == 0) send(fenceBytes);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  PeerStatus s = next.status(1);
  FZ_CHECK(s.ageMs == -1 && s.pid == 0, "a heartbeat recorded in an earlier init was accepted "
           "by the next init (pid ", s.pid, ")");
  // The same fields under init 2's key are accepted: the refusal was the key.
  Bytes ok = makeDatagram(k2, old);
  dl = Deadline::after(5);
  for (int i = 0; next.status(1).pid != 1111; ++i) {
    if (dl.expired()) fail("a datagram signed for this init was not accepted");
    if (i % 100 == 0) send(ok);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  next.stop();
}

}  // namespace

void heartbeatReplayAcrossInits() { replayAcrossInits(); }
void heartbeatSetup(Rng& rng) { setupHeartbeat(rng); }
void heartbeatIteration(Rng& rng) { runHeartbeatCase(rng); }
void heartbeatTeardown() { teardownHeartbeat(); }

}  // namespace fuzz
