// The links (link.h) of this process to the other processes of its job, one per pair of
// processes, made the first time a group of both needs one and shared by every group after
// (the default; RINGREDUCE_GROUP_LINKS=0 turns it off): a new group then opens no
// connection between processes that already share a link, only streams on it. The job's
// world owns the table and closes it when it is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/link.h"
#include "transport/tcp/mesh.h"
#include "transport/transport.h"

namespace rr::transport::tcp {

class LinkTable {
 public:
  // The link to the process of world rank `r` (up or down), or null if none was made.
  std::shared_ptr<Link> find(int r) const;
  void add(int r, std::shared_ptr<Link> link);
  size_t size() const;
  // Close every link, sending what their streams wrote first for at most `seconds` in all.
  void close(double seconds);

 private:
  mutable std::mutex mu_;
  std::map<int, std::shared_ptr<Link>> links_;
};

// A group's connections (every member: a full mesh) as streams `streamId` on the table's
// links. Members without a link between their processes connect first (connectSubset,
// authenticated as any connection of the group: `me` carries the group's ranks and their
// world ranks as labels) and the connection becomes their link. Throws PeerError for a
// member whose link is down (its process exited, crashed or destroyed its world).
std::vector<std::unique_ptr<Connection>> connectOverLinks(const Identity& me, Listener& listener,
                                                          const std::vector<std::string>& addrs,
                                                          LinkTable& table, uint64_t streamId,
                                                          Deadline d, const StillWanted& check);

}  // namespace rr::transport::tcp
