#include "transport/select.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace rr::transport {

namespace {

std::string sizes(const std::vector<std::vector<int>>& groups) {
  std::string s;
  for (const auto& g : groups) s += (s.empty() ? "" : ", ") + std::to_string(g.size());
  return "[" + s + "]";
}

}  // namespace

ShmLayout selectShm(const std::vector<std::string>& hosts, int rank, const std::string& setting) {
  if (setting != "auto" && setting != "tcp" && setting != "shm")
    RR_THROW(InvalidArgument, "transport must be auto, tcp or shm, not '", setting, "'");
  if (rank < 0 || rank >= static_cast<int>(hosts.size()))
    RR_THROW(InvalidArgument, "need one host identity per rank (rank ", rank, ", ",
             hosts.size(), " given)");
  ShmLayout out;
  if (setting == "tcp") {
    out.reason = "RINGREDUCE_TRANSPORT=tcp";
    return out;
  }
  std::map<std::string, std::vector<int>> byHost;  // ranks ascending within each
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) byHost[hosts[r]].push_back(r);
  std::vector<std::vector<int>> groups;
  for (auto& [h, ranks] : byHost) groups.push_back(ranks);
  std::sort(groups.begin(), groups.end());  // by first rank: the same order on every rank
  const std::vector<int>& mine = byHost.at(hosts[static_cast<size_t>(rank)]);
  if (groups.size() == 1) {
    out.members = mine;
    out.reason = "one host";
    return out;
  }
  if (setting == "shm") {
    std::set<std::string> names;
    for (const auto& [h, ranks] : byHost) names.insert(h.substr(0, h.find('/')));
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    RR_THROW(InvalidArgument, "RINGREDUCE_TRANSPORT=shm needs every rank on one host, but ranks "
             "run on ", groups.size(), " hosts (", list.substr(0, 200),
             "); use auto (hierarchical) or tcp");
  }
  const size_t local = mine.size();
  if (local < 2 || std::any_of(groups.begin(), groups.end(),
                               [&](const std::vector<int>& g) { return g.size() != local; })) {
    out.reason = "hosts have " + sizes(groups) + " ranks: TCP only";
    return out;
  }
  const size_t idx = static_cast<size_t>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  out.members = mine;
  for (const auto& g : groups) out.slicePeers.push_back(g[idx]);
  out.reason = std::to_string(groups.size()) + " hosts of " + std::to_string(local) + " ranks";
  return out;
}

}  // namespace rr::transport
