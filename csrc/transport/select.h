// Which transport reaches which peer, decided once per communicator from every rank's host
// identity (NCCL's canConnect, in one place): shared memory between ranks of one host, TCP
// otherwise. The planner (collectives/planner.cc) then picks each call's algorithm on the
// layout chosen here.
#pragma once

#include <string>
#include <vector>

namespace rr::transport {

struct ShmLayout {
  std::vector<int> members;     // communicator ranks on this rank's host, ascending; empty: TCP
  std::vector<int> slicePeers;  // several hosts: this rank's peer on each host (hierarchical
                                // ring), hosts ordered by their lowest rank; empty on one host
  std::string reason;           // why, for the log
};

// `hosts[r]`: rank r's host identity (equal exactly when two ranks can share memory);
// `setting`: RINGREDUCE_TRANSPORT ("auto", "tcp" or "shm"). One host: shared memory
// between all ranks. Several hosts with the same number (>= 2) of ranks each: shared memory
// inside each host (hierarchical all-reduce). Otherwise TCP only. "shm" across hosts is
// refused (InvalidArgument, naming the hosts).
ShmLayout selectShm(const std::vector<std::string>& hosts, int rank, const std::string& setting);

}  // namespace rr::transport
