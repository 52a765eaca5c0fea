#include "transport/tcp/link_table.h"

#include "core/error.h"
#include "core/log.h"
#include "transport/tcp/tcp_connection.h"

namespace rr::transport::tcp {

std::shared_ptr<Link> LinkTable::find(int r) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(r);
  return it == links_.end() ? nullptr : it->second;
}

void LinkTable::add(int r, std::shared_ptr<Link> link) {
  std::lock_guard<std::mutex> g(mu_);
  links_[r] = std::move(link);
}

size_t LinkTable::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return links_.size();
}

void LinkTable::close(double seconds) {
  std::map<int, std::shared_ptr<Link>> all;
  {
    std::lock_guard<std::mutex> g(mu_);
    all.swap(links_);
  }
  const Deadline d = Deadline::after(seconds);
  for (auto& [r, link] : all) link->close(std::max(d.pollMs(), 0) / 1000.0);
}

std::vector<std::unique_ptr<Connection>> connectOverLinks(const Identity& me, Listener& listener,
                                                          const std::vector<std::string>& addrs,
                                                          LinkTable& table, uint64_t streamId,
                                                          Deadline d, const StillWanted& check) {
  // Also on a link that is down: what the peer wrote to this stream before it left (a send
  // its destroy() completed, its goodbye) is read first, then the end or the link's error,
  // which the connection reports as it would its own socket's.
  auto stream = [&](int peer, const std::string& host,
                    const std::shared_ptr<Link>& link) -> std::unique_ptr<Connection> {
    return std::make_unique<TcpConnection>(peer, host, streamPipe(link->open(streamId)));
  };
  std::vector<int> want;  // symmetric: both processes of a pair made (or lack) its link
  for (int p = 0; p < me.world; ++p)
    if (p != me.rank && !table.find(me.shown(p))) want.push_back(p);
  auto conns = connectSubset(me, listener, addrs, want, d, check,
                             [&](int peer, const std::string& host, Fd fd) {
                               auto link = Link::start(std::move(fd), detail::concat(
                                   "rank ", me.shown(peer), " (", host, ")"));
                               table.add(me.shown(peer), link);
                               RR_DEBUG("link to world rank ", me.shown(peer), " made");
                               return stream(peer, host, link);
                             });
  for (int p = 0; p < me.world; ++p) {
    if (p == me.rank || conns[static_cast<size_t>(p)]) continue;
    conns[static_cast<size_t>(p)] =
        stream(p, parseEndpoint(addrs[static_cast<size_t>(p)]).host, table.find(me.shown(p)));
  }
  return conns;
}

}  // namespace rr::transport::tcp
