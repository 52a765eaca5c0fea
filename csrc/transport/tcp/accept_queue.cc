#include "transport/tcp/accept_queue.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"

namespace rr::transport::tcp {

size_t AcceptQueue::acceptWaiting(int listenFd) {
  size_t n = 0;
  if (listenFd < 0) return n;
  if (unwarned_ > 0 && steadyMs() - lastWarnMs_ >= kWarnEveryMs) {  // a burst's count
    RR_WARN(what_, " refused ", unwarned_, " more connection(s) in the last ",
            (steadyMs() - lastWarnMs_) / 1000, " s (RINGREDUCE_DEBUG=DEBUG lists each)");
    lastWarnMs_ = steadyMs();
    unwarned_ = 0;
  }
  while (true) {
    std::string from;
    Fd fd;
    try {
      fd = acceptOne(listenFd, Deadline::after(0.0), &from);
    } catch (const Error& e) {  // EMFILE, ENFILE, ENOBUFS: free a slot, try again later
      warnRefused("an unknown address", detail::concat("could not accept it (", e.what(), ")",
                                      pending_.empty() ? "" : "; dropped the oldest one "
                                                              "still authenticating"));
      if (!pending_.empty()) pending_.erase(pending_.begin());
      return n;
    }
    if (!fd.valid()) return n;
    if (pending_.size() >= kMaxPending) {
      // The oldest that has sent nothing, long enough after its hello to have answered (a
      // peer's answer may be half read, or waiting unread: the caller reads answers before
      // accepting more); none: this newcomer goes, unanswered.
      const int64_t now = steadyMs();
      auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& q) {
        if (q.got != 0 || now - q.helloMs < kYoungMs) return false;
        pollfd pf{q.fd.get(), POLLIN, 0};
        return ::poll(&pf, 1, 0) == 0;  // nothing readable: silent so far
      });
      if (it == pending_.end()) {
        warnRefused(from, detail::concat("closed unanswered: ", kMaxPending, " connections "
                                         "waited to authenticate (a flood of connections?)"));
        continue;
      }
      warnRefused(it->from, detail::concat("no answer while ", kMaxPending,
                                           " connections waited to authenticate (a flood of "
                                           "connections?)"));
      pending_.erase(it);
    }
    Pending p;
    p.fd = std::move(fd);
    p.from = std::move(from);
    p.due = Deadline::after(kAnswerSec);
    p.helloMs = steadyMs();
    std::string why;
    if (!sendHello(p.fd.get(), me_, &p.st, &why)) {
      warnRefused(p.from, why);
      continue;
    }
    pending_.push_back(std::move(p));
    ++n;
  }
}

void AcceptQueue::awaitAnswer(Deadline d) const {
  std::vector<pollfd> pfds;
  for (const auto& p : pending_) pfds.push_back({p.fd.get(), POLLIN, 0});
  if (!pfds.empty()) ::poll(pfds.data(), pfds.size(), d.pollMs());
}

bool AcceptQueue::readAnswer(Pending& p, std::string* why) {
  if (readSome(p.fd.get(), p.auth, kAuthBytes, &p.got, why)) return true;
  if (!why->empty()) *why = "reading authentication: " + *why;
  return false;
}

std::vector<AcceptQueue::Accepted> AcceptQueue::progress(bool (*wanted)(void*, int), void* ctx) {
  std::vector<Accepted> out;
  // The caller's `wanted` sees its connections, not this batch's: two connections claiming
  // one rank in a batch must not both be accepted.
  struct Both {
    bool (*wanted)(void*, int);
    void* ctx;
    const std::vector<Accepted>* out;
  } both{wanted, ctx, &out};
  auto fresh = [](void* c, int r) {
    auto* b = static_cast<Both*>(c);
    for (const auto& a : *b->out)
      if (a.rank == r) return false;
    return b->wanted(b->ctx, r);
  };
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    std::string why;
    bool done = readAnswer(p, &why);
    int rank = -1;
    if (done) {
      rank = finishAccept(p.fd.get(), me_, p.st, p.auth, fresh, &both, &why);
    } else if (why.empty() && p.due.expired()) {
      why = detail::concat("reading authentication: no answer within ", kAnswerSec, " s");
    } else if (why.empty()) {
      ++i;  // still waiting for its answer
      continue;
    }
    if (rank >= 0) out.push_back({rank, std::move(p.from), std::move(p.fd)});
    else warnRefused(p.from, why);
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return out;
}

void AcceptQueue::warnRefused(const std::string& from, const std::string& why) {
  const int64_t now = steadyMs();
  if (now - lastWarnMs_ < kWarnEveryMs) {
    ++unwarned_;
    RR_DEBUG(what_, " refused a connection from ", from, ": ", why);
    return;
  }
  RR_WARN(what_, " refused a connection from ", from, ": ", why,
          unwarned_ ? detail::concat(" (and ", unwarned_, " more in the last ",
                                     (now - lastWarnMs_) / 1000, " s; RINGREDUCE_DEBUG=DEBUG "
                                     "lists each)")
                    : std::string());
  lastWarnMs_ = now;
  unwarned_ = 0;
}

bool AcceptQueue::empty() const { return pending_.empty(); }

std::vector<int> AcceptQueue::fds() const {
  std::vector<int> out;
  out.reserve(pending_.size());
  for (const auto& p : pending_) out.push_back(p.fd.get());
  return out;
}

int AcceptQueue::nextDueMs() const {
  int ms = -1;
  for (const auto& p : pending_) ms = ms < 0 ? p.due.pollMs() : std::min(ms, p.due.pollMs());
  return ms;
}

}  // namespace rr::transport::tcp
