// What links and their pump share (link.h's implementation; included by link.cc and
// link_pump.cc only): the sub-frame header, a stream's state, a link's state, the pump.
#pragma once

#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/byte_ring.h"
#include "transport/tcp/link.h"

namespace rr::transport::tcp {

constexpr uint32_t kLinkMagic = 0x534c5252;  // "RRLS"
// kSubOpen: its sender opened the stream; `len` is the credit beyond kUnopenedCredit that
// this grants (the rest of its window). Sent once, before the stream's fin.
enum SubKind : uint32_t { kSubData = 1, kSubCredit = 2, kSubFin = 3, kSubOpen = 4 };
struct SubHeader {
  uint32_t magic = kLinkMagic;
  uint32_t kind = 0;
  uint64_t stream = 0;
  uint64_t len = 0;
};
static_assert(sizeof(SubHeader) == 24, "SubHeader must stay 24 bytes");
constexpr size_t kMaxSub = 256 << 10;    // payload of one data sub-frame
constexpr int kBatch = 16;               // sub-frames a stream's user sends in one call
constexpr size_t kPumpBudget = 4 << 20;  // bytes per link per direction per round
constexpr size_t kInlineBudget = 1 << 20;  // the same for a stream's user sending others' bytes
// A bulk write plans its batch by the socket's room only when that is at least kMinRoom
// (else as before: what the socket does not take goes on from the outbox), and starts no
// further sub-frame for less than kMinPiece of it.
constexpr size_t kMinRoom = 64 << 10;
constexpr size_t kMinPiece = 4 << 10;
// Streams the peer may write to before this process opens them, and the credit each
// direction of a stream starts with until its receiver opens it (kSubOpen grants the rest
// of the window): what a peer can park here is at most 1024 x 256 KiB = 256 MiB, not 1024
// windows (16 GiB).
constexpr size_t kMaxUnopened = 1024;
constexpr size_t kUnopenedCredit = kMaxSub;
inline size_t startCredit(size_t window) { return std::min(window, kUnopenedCredit); }
// Bytes read past a sub-frame's header in the same call: a small sub-frame (an 8-byte
// all-reduce's, a credit) takes one call, header and payload; a large one's first bytes
// are copied once more.
constexpr size_t kSpill = 512;
// How long the pump leaves a readable socket to a stream's user that reads it itself (and
// after that user's last read). Each wait's end wakes the pump: with 2 ms, that wake-up every
// 2 ms while a group ran 8-byte all-reduces made their median 1.56-2.04x a group's own
// connections (alternated in one job, ad hoc); with 20 ms, 1.07-1.08x.
constexpr std::chrono::milliseconds kDeferRead{20};

// A stream's state, shared by its Stream (the user) and its link (the pump). Guarded by the
// link's lock.
struct StreamState {
  explicit StreamState(uint64_t i, size_t window)
      : id(i), inbox(window), outbox(window), credit(startCredit(window)) {}
  uint64_t id;
  ByteRing inbox, outbox;
  size_t credit;        // bytes this end may still send (room the peer's inbox promised)
  size_t unacked = 0;   // bytes taken from the inbox since the last credit went back
  bool opened = false;  // a Stream was made for it
  bool closed = false;  // its Stream closed: arrivals are dropped (and credited back)
  bool shutWr = false;  // no more writes: a fin follows the outbox
  bool finSent = false;
  bool peerFin = false;
  unsigned want = 0;
  // Its user polls the link's socket and reads it itself (readFd, from then on): the pump
  // leaves this stream's sub-frames in the socket for a moment (kDeferRead).
  bool direct = false;
  bool pollsRead = false;  // ... in its current wait (readFd since the last arm)
  // Its user polls the link's socket for room and writes it itself (writeFd); then kRoom is
  // the peer's credit (writeFd saw none) or nothing (the socket's POLLOUT stands for it).
  enum class WriteWait { kPump, kCredit, kSocket } writeWait = WriteWait::kPump;
  bool signalled = false;
  Fd efd;  // eventfd, from open() on
};

struct Link::Impl {
  Impl(Fd f, size_t w) : fd(std::move(f)), window(w) {}
  mutable std::mutex mu;
  std::condition_variable flushed;  // close() waits for the outboxes to drain
  Fd fd;
  size_t window;
  std::map<uint64_t, std::shared_ptr<StreamState>> streams;
  std::deque<SubHeader> control;  // credits and fins waiting to go
  size_t unopened = 0;  // streams the peer wrote to that this process has not opened
  int err = -1;                   // -1 up, 0 closed, else errno
  // Receiving: who reads the socket now (the pump, or a stream's user in readv: one at a
  // time; rxIdle tells the others when it stops), the header being read, then the payload
  // left and where it goes.
  bool rxBusy = false;
  std::condition_variable rxIdle;
  // The pump leaves the socket to streams' users until deferUntil: one was reading it, or
  // the next sub-frame is for a stream whose user reads it itself (direct). defer() starts
  // such a wait if none runs; a user's read (drain) extends it: one that read a moment ago
  // comes back for more, and the pump need not wake for every burst that arrives meanwhile.
  bool deferred = false;
  std::chrono::steady_clock::time_point deferUntil{};
  void defer(std::chrono::steady_clock::time_point now) {
    if (deferred) return;
    deferred = true;
    deferUntil = now + kDeferRead;
  }
  // Whether the pump leaves the socket alone now (locked): not while a writer waits for
  // credit, which may be on its way in with nobody else reading.
  bool leftToUsers(std::chrono::steady_clock::time_point now) const {
    return deferred && now < deferUntil && !creditWaited();
  }
  SubHeader rxHdr;
  size_t rxHdrGot = 0;
  // What the last header read took past the header, not parsed yet: whoever read it parses
  // it all before it gives up rxBusy (nobody waits on the socket for bytes already read).
  char spill[kSpill];
  size_t spillAt = 0, spillLen = 0;
  uint64_t rxLeft = 0;
  std::shared_ptr<StreamState> rxTo;
  bool rxDrop = false;
  // Sending: whether a thread is writing (txBusy), the sub-frame being written (txFrom
  // null: a control frame).
  bool txBusy = false;
  bool txActive = false;
  SubHeader txHdr;
  size_t txHdrDone = 0;
  uint64_t txLeft = 0;
  std::shared_ptr<StreamState> txFrom;
  uint64_t rrAfter = 0;  // round robin: the stream served last

  bool down() const { return err >= 0; }
  // What a read or peek that found nothing says (locked): 0 at the end (the peer's fin, or
  // the link closed), else -1 with *e = the link's error or EAGAIN.
  ssize_t nothing(const StreamState& s, int* e) const {
    if (s.peerFin || err == 0) return 0;
    *e = down() ? err : EAGAIN;
    return -1;
  }
  bool ended(const StreamState& s) const { return s.peerFin || down(); }
  // A stream's user waits for the peer's credit, and not for the socket to be readable as
  // well (then it reads the credit itself) (locked).
  bool creditWaited() const {
    for (auto& [id, s] : streams)
      if ((s->want & Stream::kRoom) && s->writeWait == StreamState::WriteWait::kCredit &&
          !s->pollsRead)
        return true;
    return false;
  }

  // Whether a write may take bytes now, as far as the eventfd tells (locked).
  static bool room(const StreamState& s) {
    switch (s.writeWait) {
      case StreamState::WriteWait::kCredit: return s.credit > 0;
      case StreamState::WriteWait::kSocket: return false;
      default: return s.outbox.room() > 0;
    }
  }

  // The eventfd follows arm()'s condition (locked).
  void update(StreamState& s) {
    if (!s.efd.valid()) return;
    const bool on = ((s.want & Stream::kData) && (!s.inbox.empty() || ended(s))) ||
                    ((s.want & Stream::kEnd) && ended(s)) ||
                    ((s.want & Stream::kRoom) && (room(s) || s.shutWr || down()));
    if (on == s.signalled) return;
    uint64_t v = 1;
    if (on) {
      while (::write(s.efd.get(), &v, sizeof v) < 0 && errno == EINTR) {}
    } else {
      while (::read(s.efd.get(), &v, sizeof v) < 0 && errno == EINTR) {}
    }
    s.signalled = on;
  }

  // `n` inbox bytes were taken (read or dropped): return credit in quarters of the window,
  // so that small messages send no credit frames of their own (locked). True: a credit
  // frame is queued.
  bool credited(StreamState& s, size_t n) {
    s.unacked += n;
    if (s.unacked < window / 4 || down()) return false;
    SubHeader h;
    h.kind = kSubCredit;
    h.stream = s.id;
    h.len = s.unacked;
    s.unacked = 0;
    control.push_back(h);
    return true;
  }

  // This end opened `s`: the peer may fill its whole window now (locked).
  void grantWindow(const StreamState& s) {
    if (down()) return;
    SubHeader h;
    h.kind = kSubOpen;
    h.stream = s.id;
    h.len = window - startCredit(window);
    control.push_back(h);
  }

  // Forget a stream both sides are done with (locked).
  void maybeForget(const std::shared_ptr<StreamState>& s) {
    if (!s->closed || !(down() || (s->finSent && s->peerFin)) || rxTo == s || txFrom == s)
      return;
    const uint64_t id = s->id;  // `s` may be the map's own pointer, gone with the erase
    streams.erase(id);
  }

  void fail(int e) {  // locked
    if (down()) return;
    err = e;
    spillLen = 0;
    control.clear();
    std::vector<std::shared_ptr<StreamState>> all;
    for (auto& [id, s] : streams) all.push_back(s);
    for (auto& s : all) {  // copies: erasing from the map leaves them valid
      update(*s);
      if (s->closed) streams.erase(s->id);
    }
    flushed.notify_all();
  }

  bool wantsOut() const {  // locked
    if (down()) return false;
    if (txActive || !control.empty()) return true;
    for (auto& [id, s] : streams)
      if ((!s->outbox.empty() && s->credit > 0) || (s->shutWr && !s->finSent && s->outbox.empty()))
        return true;
    return false;
  }

  bool drained() const {  // locked: everything written has gone (or cannot any more)
    if (down()) return true;
    if (txActive || !control.empty()) return false;
    for (auto& [id, s] : streams)
      if (!s->outbox.empty() || (s->shutWr && !s->finSent)) return false;
    return true;
  }

  // A stream's write (locked, not around the calls): sub-frames of iov sent on the socket at
  // once, up to kBatch per call, while the link has nothing half-sent and nobody else writes
  // (txBusy, held meanwhile) and the stream has credit; a sub-frame the socket took in part
  // is finished from the outbox. Returns the bytes of iov taken.
  size_t sendDirect(std::unique_lock<std::mutex>& g, const std::shared_ptr<StreamState>& s,
                    const iovec* iov, int n, size_t total);
  // Payload bytes the socket takes now, about (SO_MEMINFO): 0 when poll() would not call it
  // writable, SIZE_MAX when unknown or too little to plan by. A bulk batch is cut to end
  // where that room does, on a sub-frame's end, instead of leaving a sub-frame in part for
  // the outbox (a copy of up to 256 KiB, then another call). Locked (one getsockopt).
  size_t socketRoom();
  // Copy iov's bytes from `skip` on into the stream's outbox, as many as fit (locked).
  size_t queue(StreamState& s, const iovec* iov, int n, size_t skip);
  // The pump's read: the socket's bytes into their streams' inboxes, unless a stream's
  // user reads them (then it defers).
  void pumpRead(const std::string& peer);
  // Read the socket (locked on entry and exit, not around the calls) until it has nothing
  // more, a round's budget is spent, -- `own` given, its inbox empty -- some of own's bytes
  // landed in iov, straight from the socket, or -- `leave` -- the next payload is for a
  // direct stream (deferred). Other streams' bytes go to their inboxes. Returns own's bytes
  // read. The caller holds rxBusy.
  size_t drain(std::unique_lock<std::mutex>& g, const std::string& peer, StreamState* own,
               const iovec* iov, int n, bool leave = false);
  void onHeader(const std::string& peer);  // locked: a whole header is in rxHdr
  // `n` bytes landed in the header (rxHdr from rxHdrGot on) and past it in the spill, which
  // was empty unless they came from it (then only the header took them) (locked). Both a
  // header's read and a payload read that finished its sub-frame (and took what followed
  // it) end here.
  void headerRead(size_t n, const std::string& peer);
  // The socket's next bytes into v: the spill's first (locked), else from the socket (not
  // locked around the call). As readv(). The caller holds rxBusy.
  ssize_t rxRead(std::unique_lock<std::mutex>& g, const iovec* v, int k);
  ssize_t readPayload(std::unique_lock<std::mutex>& g, size_t* budget);  // as readv()
  // `n` payload bytes of the current sub-frame were read, of a round's `budget` (locked).
  void payloadRead(size_t n, size_t* budget);
  void pumpWrite();
  // Send what waits (control frames, sub-frames of the streams' outboxes), at most `budget`
  // bytes, until the socket takes no more (locked; not around the calls). Whoever calls it
  // first writes (txBusy): the pump, or a stream's user that would otherwise wait for it.
  void writeSome(std::unique_lock<std::mutex>& g, size_t budget);
  // After a stream's user read: the credit frames it queued, and outboxes whose credit it
  // read, sent from its thread (writeSome wakes the pump for what it leaves).
  void writePending(std::unique_lock<std::mutex>& g);
  bool pickNext();  // locked: start the next sub-frame; false when there is none
};

// The pump: one thread per process, running while any link is open (link_pump.cc).
class Hub {
 public:
  static Hub& get();
  void add(const std::shared_ptr<Link>& l);
  // Stop serving `l`; returns once the pump no longer touches it. Not from the pump.
  void remove(const Link* l);
  void wake();
  bool running();

 private:
  Hub();
  void loop();

  std::mutex life_;  // add/remove, thread start and join
  std::mutex mu_;
  std::condition_variable roundDone_;
  std::vector<std::shared_ptr<Link>> links_;
  std::thread thread_;
  bool stop_ = false;
  uint64_t rounds_ = 0;
  Fd wake_;
};

}  // namespace rr::transport::tcp
