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

// Each link has an id: the stream id of the set-up that made it (the same in both
// processes). Set-ups of one pair may run at once (isend/irecv make channels on helper
// threads), so the two processes of a pair may see different links -- one may have added a
// link the other has not yet, or both made one: a set-up therefore uses a link only when
// both members published the same id for it (connectOverLinks' `agreed`) and makes a new
// one otherwise. Links are kept until close; the one set-ups publish is the smallest id, so
// the two tables of a pair converge on the same link.
class LinkTable {
 public:
  // Per world rank in `ranks`, the id of the link to its process that set-ups publish (the
  // smallest; 0: none).
  std::vector<uint64_t> ids(const std::vector<int>& ranks) const;
  // The link `id` to the process of world rank `r`; null if there is none.
  std::shared_ptr<Link> get(int r, uint64_t id) const;
  void add(int r, uint64_t id, std::shared_ptr<Link> link);
  size_t size() const;  // processes this one has a link to
  // Close every link, sending what their streams wrote first for at most `seconds` in all.
  void close(double seconds);

 private:
  mutable std::mutex mu_;
  std::map<int, std::map<uint64_t, std::shared_ptr<Link>>> links_;
};

// A group's connections (every member: a full mesh) as streams `streamId` on the table's
// links. `agreed[p]`: the id of the link to member p's process that both published (0:
// they did not agree, or neither has one) -- the members connect first where it is 0
// (connectSubset, authenticated as any connection of the group: `me` carries the group's
// ranks and their world ranks as labels) and the connection becomes their link `streamId`.
// Throws PeerError for a member whose link is down (its process exited, crashed or
// destroyed its world).
std::vector<std::unique_ptr<Connection>> connectOverLinks(const Identity& me, Listener& listener,
                                                          const std::vector<std::string>& addrs,
                                                          LinkTable& table, uint64_t streamId,
                                                          const std::vector<uint64_t>& agreed,
                                                          Deadline d, const StillWanted& check);

}  // namespace rr::transport::tcp
