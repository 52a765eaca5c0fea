// Shared memory's set-up for a new communicator (_C.Communicator): the plan read from
// Python's options (the layout itself is transport::selectShm's), the meeting its ranks use
// to exchange segment names (over the TCP mesh, or the store when there is none), and the
// set-up: create, exchange names, map, unlink.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "comm/communicator.h"
#include "core/params.h"
#include "transport/shm/domain.h"

namespace rr::bindings {

// Shared-memory settings: the layout transport::selectShm picks from "shm_hosts" (every
// rank's host identity) and "shm_transport" (RINGREDUCE_TRANSPORT); without hosts, TCP only.
struct ShmPlan {
  std::string prefix;          // segment names' start; empty: no shared memory
  std::vector<int> members;    // communicator ranks on this host, ascending
  std::vector<int> slicePeers; // hierarchical ring peers (one per host)
  transport::shm::ShmConfig cfg;  // spin from Options; slot sizes: planShmSlots() at setup
};

// The plan from a new communicator's options (shm_prefix, shm_hosts -- one per rank --,
// shm_transport) for communicator rank `rank` of `world`, logged at
// INFO with `o`'s rank labels and group name; unknown shm_* keys raise InvalidArgument.
ShmPlan shmFromDict(const pybind11::dict& d, int rank, int world, const Options& o);

// How setupShm's ranks meet: all-gather one string per rank (result indexed by
// communicator rank) and a barrier. Over the TCP mesh, or -- a socketless communicator,
// which has none -- through the rendezvous store (Python's callback).
struct ShmMeeting {
  std::function<std::vector<std::string>(const std::string&)> allgather;
  std::function<void()> barrier;
};

ShmMeeting meetOverTcp(comm::Communicator& c);
// The store, through `fn(step, value) -> [value of every rank]` (ringreduce/_comm.py).
ShmMeeting meetOverStore(const pybind11::object& fn);

// Every rank creates its segment, the names are exchanged, everyone maps its peers', a
// barrier, then each rank removes its own name: from here on a crash leaves nothing behind in
// /dev/shm.
void setupShm(comm::Communicator& c, const ShmPlan& plan, ShmMeeting& meet);

}  // namespace rr::bindings
