#include "transport/tcp/dialer.h"

#include <algorithm>

#include "core/error.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "transport/tcp/tcp_connection.h"

namespace rr::transport::tcp {

TcpDialer::TcpDialer(Identity me, Listener listener, std::vector<std::string> peerAddrs)
    : me_(me), listener_(std::move(listener)), addrs_(std::move(peerAddrs)),
      accepting_(me, detail::concat("rank ", rankLabel(me.labels, me.rank))) {
  RR_CHECK_EQ(static_cast<int>(addrs_.size()), me_.world, "one address per rank");
  for (const auto& a : addrs_) hosts_.push_back(a.empty() ? std::string("?") : parseEndpoint(a).host);
  pending_.resize(addrs_.size());
  answered_.resize(addrs_.size());
}

const std::string& TcpDialer::peerHost(int peer) const {
  return hosts_[static_cast<size_t>(peer)];
}

int TcpDialer::dial(int peer, double timeoutSec) {
  RR_CHECK(peer >= 0 && peer < me_.rank, "rank ", label(me_.rank), " dials only lower ranks, not ",
           label(peer));
  Endpoint ep = parseEndpoint(addrs_[static_cast<size_t>(peer)]);
  try {
    // The peer has listened since before init returned anywhere: a refusal means it is gone.
    pending_[static_cast<size_t>(peer)] =
        connectTo(ep, Deadline::after(timeoutSec),
                  detail::concat("rank ", label(me_.rank), " connecting to rank ", label(peer)),
                  Retry::kOnce);
  } catch (const Error& e) {
    throwUnreachable(peer, label(peer), ep, e);
  }
  return pending_[static_cast<size_t>(peer)].get();
}

bool TcpDialer::refuses(int peer, double timeoutSec) {
  try {
    connectTo(parseEndpoint(addrs_[static_cast<size_t>(peer)]), Deadline::after(timeoutSec),
              detail::concat("rank ", label(me_.rank), " probing rank ", label(peer)),
              Retry::kUnlessRefused);
    return false;  // closed at once: a frozen peer's accept queue drops it when it wakes
  } catch (const Refused&) {
    return true;
  } catch (const Interrupted&) {  // Ctrl-C meanwhile: that, not the probe's answer
    throw;
  } catch (const Error&) {
    return false;
  }
}

void TcpDialer::answerDial(int peer, double timeoutSec) {
  const Fd& fd = pending_[static_cast<size_t>(peer)];
  RR_CHECK(fd.valid(), "answerDial without dial for rank ", peer);
  answered_[static_cast<size_t>(peer)] = answerHello(fd.get(), me_, peer,
                                                     addrs_[static_cast<size_t>(peer)],
                                                     Deadline::after(timeoutSec));
}

std::unique_ptr<Connection> TcpDialer::finishDial(int peer, double timeoutSec) {
  Fd fd = std::move(pending_[static_cast<size_t>(peer)]);
  RR_CHECK(fd.valid(), "finishDial without dial for rank ", peer);
  const std::string& addr = addrs_[static_cast<size_t>(peer)];
  checkAck(fd.get(), me_, peer, addr, answered_[static_cast<size_t>(peer)],
           Deadline::after(timeoutSec));
  RR_DEBUG("rank ", label(me_.rank), ": connected to rank ", label(peer), " at ", addr,
           " on first use");
  return std::make_unique<TcpConnection>(peer, hosts_[static_cast<size_t>(peer)], std::move(fd));
}

std::unique_ptr<Connection> TcpDialer::acceptOne(bool (*wanted)(void*, int), void* ctx) {
  if (ready_.empty() && listener_.fd() >= 0) {
    // Never waits: an answer not here yet is read at this rank's next wait (the waits poll
    // pendingFds), however late -- the dialler waits for the ack in its own wait loop. (A
    // 1 s wait here for fresh connections' answers let a stranger connecting once a second
    // and saying nothing stall every collective for ~2 s: found by a helper.)
    ready_ = accepting_.progress(wanted, ctx);  // answers first: a flood drops the silent
    accepting_.acceptWaiting(listener_.fd());
    for (auto& a : accepting_.progress(wanted, ctx)) ready_.push_back(std::move(a));
  }
  if (ready_.empty()) return nullptr;
  AcceptQueue::Accepted a = std::move(ready_.back());
  ready_.pop_back();
  RR_DEBUG("rank ", label(me_.rank), ": accepted rank ", label(a.rank), " from ", a.from,
           " on first use");
  return std::make_unique<TcpConnection>(a.rank, a.from, std::move(a.fd));
}

void TcpDialer::close() {
  listener_.close();
  for (auto& f : pending_) f.reset();
  accepting_ = AcceptQueue(me_, "");
  ready_.clear();
}

std::vector<int> overlayPeers(int rank, int world) {
  std::vector<int> out;
  for (int d = 1; d < world; d *= 2) {
    out.push_back((rank + d) % world);
    out.push_back(((rank - d) % world + world) % world);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  out.erase(std::remove(out.begin(), out.end(), rank), out.end());
  return out;
}

}  // namespace rr::transport::tcp
