#include "transport/tcp/link_table.h"

#include "core/error.h"
#include "core/log.h"
#include "transport/tcp/tcp_connection.h"

namespace rr::transport::tcp {

std::vector<uint64_t> LinkTable::ids(const std::vector<int>& ranks) const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<uint64_t> out;
  for (int r : ranks) {
    auto it = links_.find(r);
    out.push_back(it == links_.end() || it->second.empty() ? 0 : it->second.begin()->first);
  }
  return out;
}

std::shared_ptr<Link> LinkTable::get(int r, uint64_t id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = links_.find(r);
  if (it == links_.end()) return nullptr;
  auto l = it->second.find(id);
  return l == it->second.end() ? nullptr : l->second;
}

void LinkTable::add(int r, uint64_t id, std::shared_ptr<Link> link) {
  std::lock_guard<std::mutex> g(mu_);
  links_[r][id] = std::move(link);
}

size_t LinkTable::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return links_.size();
}

void LinkTable::close(double seconds) {
  std::map<int, std::map<uint64_t, std::shared_ptr<Link>>> all;
  {
    std::lock_guard<std::mutex> g(mu_);
    all.swap(links_);
  }
  const Deadline d = Deadline::after(seconds);
  for (auto& [r, byId] : all)
    for (auto& [id, link] : byId) link->close(std::max(d.pollMs(), 0) / 1000.0);
}

std::vector<std::unique_ptr<Connection>> connectOverLinks(const Identity& me, Listener& listener,
                                                          const std::vector<std::string>& addrs,
                                                          LinkTable& table, uint64_t streamId,
                                                          const std::vector<uint64_t>& agreed,
                                                          Deadline d, const StillWanted& check) {
  RR_CHECK_EQ(static_cast<int>(agreed.size()), me.world, "one agreed link id per member");
  // Also on a link that is down: what the peer wrote to this stream before it left (a send
  // its destroy() completed, its goodbye) is read first, then the end or the link's error,
  // which the connection reports as it would its own socket's.
  auto stream = [&](int peer, const std::string& host,
                    const std::shared_ptr<Link>& link) -> std::unique_ptr<Connection> {
    return std::make_unique<TcpConnection>(peer, host, streamPipe(link->open(streamId)));
  };
  std::vector<int> want;  // symmetric: both members read the same two published ids
  for (int p = 0; p < me.world; ++p)
    if (p != me.rank && agreed[static_cast<size_t>(p)] == 0) want.push_back(p);
  auto conns = connectSubset(me, listener, addrs, want, d, check,
                             [&](int peer, const std::string& host, Fd fd) {
                               auto link = Link::start(std::move(fd), detail::concat(
                                   "rank ", me.shown(peer), " (", host, ")"));
                               table.add(me.shown(peer), streamId, link);
                               RR_DEBUG("link ", streamId, " to world rank ", me.shown(peer),
                                        " made");
                               return stream(peer, host, link);
                             });
  for (int p = 0; p < me.world; ++p) {
    if (p == me.rank || conns[static_cast<size_t>(p)]) continue;
    auto link = table.get(me.shown(p), agreed[static_cast<size_t>(p)]);
    RR_CHECK(link != nullptr, "the link this rank published for world rank ", me.shown(p));
    conns[static_cast<size_t>(p)] =
        stream(p, parseEndpoint(addrs[static_cast<size_t>(p)]).host, link);
  }
  return conns;
}

}  // namespace rr::transport::tcp
