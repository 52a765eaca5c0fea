#include "bindings/shm_setup.h"

#include <algorithm>
#include <cstring>

#include <pybind11/stl.h>

#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "core/error.h"
#include "core/log.h"
#include "transport/select.h"

namespace py = pybind11;

namespace rr::bindings {

namespace {

constexpr size_t kMaxSegmentName = 128;  // bytes per name slot over TCP, NUL-padded

// Each rank's segment name, from every rank (the names are random, so only their creators
// know them); names[r] is local rank r's. A name must start with the plan's prefix, so a
// confused peer cannot make us open another job's segment.
std::vector<std::string> exchangeNames(ShmMeeting& meet, const std::vector<int>& members,
                                       const std::string& prefix, const std::string& mine) {
  if (mine.size() >= kMaxSegmentName)
    throw InvalidArgument("shm_prefix is too long (segment name " + mine + " has " +
                          std::to_string(mine.size()) + " characters, at most " +
                          std::to_string(kMaxSegmentName - 1) + " fit)");
  std::vector<std::string> all = meet.allgather(mine), names;
  for (int g : members) {
    const std::string& n = all.at(static_cast<size_t>(g));
    if (n.size() >= kMaxSegmentName || n.rfind(prefix + "-", 0) != 0)
      throw Error("rank " + std::to_string(g) + " announced the shared memory segment '" +
                  n.substr(0, 64) + "', which is not one of this job's (" + prefix +
                  "-...): do all ranks run the same ringreduce version?");
    names.push_back(n);
  }
  return names;
}

}  // namespace

ShmPlan shmFromDict(const py::dict& d, int rank, int world, const Options& o) {
  ShmPlan plan;
  std::vector<std::string> hosts;
  std::string setting = "auto";
  for (auto item : d) {
    std::string k = py::str(item.first);
    py::handle v = item.second;
    if (k == "shm_prefix") plan.prefix = v.cast<std::string>();
    else if (k == "shm_hosts") hosts = v.cast<std::vector<std::string>>();
    else if (k == "shm_transport") setting = v.cast<std::string>();
    else if (k.rfind("shm_", 0) == 0) throw InvalidArgument("unknown option '" + k + "'");
  }
  plan.cfg.spinUs = o.spinUs;  // one spin setting for sockets and shared memory
  if (hosts.empty() || plan.prefix.empty()) return ShmPlan{};
  if (static_cast<int>(hosts.size()) != world)
    throw InvalidArgument("need one host identity per rank (" + std::to_string(hosts.size()) +
                          " given, world size " + std::to_string(world) + ")");
  transport::ShmLayout l = transport::selectShm(hosts, rank, setting);
  // A group's log names world ranks, as its errors do.
  auto label = [&o](int r) { return o.rankLabels.empty() ? r : o.rankLabels.at(static_cast<size_t>(r)); };
  auto list = [&label](const std::vector<int>& rs) {
    std::string s;
    for (int r : rs) s += (s.empty() ? "" : ", ") + std::to_string(label(r));
    return "[" + s + "]";
  };
  RR_INFO("rank ", label(rank), " of ", o.groupName.empty() ? "world" : o.groupName, ": ",
          l.members.empty() ? std::string("TCP only")
                            : "shared memory with ranks " + list(l.members) +
                                  (l.slicePeers.empty() ? "" : ", slice ring " + list(l.slicePeers)),
          " (", l.reason, ")");
  if (l.members.empty()) return ShmPlan{};
  plan.members = std::move(l.members);
  plan.slicePeers = std::move(l.slicePeers);
  return plan;
}

ShmMeeting meetOverTcp(comm::Communicator& c) {
  constexpr size_t kMax = kMaxSegmentName;
  ShmMeeting m;
  m.allgather = [&c](const std::string& mine) {
    std::vector<char> in(kMax, '\0'), all(kMax * static_cast<size_t>(c.world()), '\0');
    std::copy(mine.begin(), mine.end(), in.begin());
    collectives::allgather(c, in.data(), all.data(), kMax, DataType::kUInt8);
    std::vector<std::string> out;
    for (int r = 0; r < c.world(); ++r) {
      const char* p = all.data() + static_cast<size_t>(r) * kMax;
      out.emplace_back(p, strnlen(p, kMax));
    }
    return out;
  };
  m.barrier = [&c] { collectives::barrier(c); };
  return m;
}

ShmMeeting meetOverStore(const py::object& fn) {
  ShmMeeting m;
  auto call = [fn](const char* step, const std::string& v) {
    py::gil_scoped_acquire gil;
    return fn(step, v).cast<std::vector<std::string>>();
  };
  m.allgather = [call](const std::string& mine) { return call("names", mine); };
  m.barrier = [call, n = 0]() mutable { call(++n == 1 ? "mapped" : "unlinked", ""); };
  return m;
}

void setupShm(comm::Communicator& c, const ShmPlan& plan, ShmMeeting& meet) {
  try {
    const std::vector<int>& members = plan.members;
    auto it = std::find(members.begin(), members.end(), c.rank());
    if (it == members.end()) throw InvalidArgument("the shared-memory layout must include this rank");
    int local = static_cast<int>(it - members.begin());
    transport::shm::ShmConfig cfg = plan.cfg;
    collectives::planShmSlots(static_cast<int>(members.size()), transport::shm::capacityBytes(),
                              &cfg);
    cfg.lazySlots = c.options().p2pChannel;
    cfg.slotsLater = !c.options().p2pChannel && !c.options().groupName.empty();  // a group
    RR_DEBUG("shared memory of ", members.size(), " ranks: ", cfg.slots, " slots of ",
             cfg.chunkBytes >> 10, " KiB, waits spin ", cfg.spinUs, " us");
    auto dom = std::make_unique<transport::shm::ShmDomain>(local, members, plan.prefix, cfg);
    dom->attach(exchangeNames(meet, members, plan.prefix, dom->ownName()));
    meet.barrier();
    dom->unlinkOwn();
    meet.barrier();  // when init returns anywhere, no name is left in /dev/shm
    c.setShm(std::move(dom), plan.slicePeers);
  } catch (const std::exception& e) {
    c.poison(std::string("shared memory setup failed: ") + e.what(), transport::AbortCode::kOther);
    throw;
  }
}

}  // namespace rr::bindings
