// Entry points of every collective. Each runs on the communicator's executor thread,
// blocks until done (with the communicator's deadline) and throws on failure.
// Buffers are raw host memory of `count` elements of `dtype`; the caller validated them.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "core/params.h"
#include "core/types.h"

namespace rr::collectives {

using comm::Communicator;

// In place: buf holds this rank's input and receives the reduction over all ranks.
void allreduce(Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op,
               Algorithm algo);
// In place over several buffers of one dtype, reduced as if concatenated (one collective;
// matches an allreduce of the concatenation on other ranks). Shared memory reads and writes
// the pieces directly; other algorithms go through one flat copy.
struct Piece {
  void* ptr;
  size_t count;
};
void allreduceCoalesced(Communicator& c, const std::vector<Piece>& pieces, DataType dtype,
                        ReduceOp op, Algorithm algo);
// In place: root's buf is copied into every other rank's buf.
void broadcast(Communicator& c, void* buf, size_t count, DataType dtype, int root);
void barrier(Communicator& c);
// out (world * count elements) receives every rank's `count`-element in, in rank order.
// in may alias out + rank * count.
void allgather(Communicator& c, const void* in, void* out, size_t count, DataType dtype);
// in holds world * count elements; out receives this rank's reduced block of count.
void reduceScatter(Communicator& c, const void* in, void* out, size_t count, DataType dtype,
                   ReduceOp op);
// Rooted and personalised collectives (reduce.cc, gather.cc, scatter.cc, alltoall.cc).
// reduce: root's buf receives the reduction; other ranks' buf is left as it was.
void reduce(Communicator& c, void* buf, size_t count, DataType dtype, ReduceOp op, int root);
// gather: root's out (world * count elements) receives every rank's in, in rank order.
void gather(Communicator& c, const void* in, void* out, size_t count, DataType dtype, int root);
// scatter: root's in (world * count elements) is split; rank r's out receives block r.
void scatter(Communicator& c, const void* in, void* out, size_t count, DataType dtype, int root);
// all_to_all: this rank sends sendCounts[p] elements from in + sendOffs[p] to rank p and
// receives recvCounts[p] elements from rank p into out + recvOffs[p] (element units).
void alltoall(Communicator& c, const void* in, const size_t* sendCounts, const size_t* sendOffs,
              void* out, const size_t* recvCounts, const size_t* recvOffs, DataType dtype);

// Cost model: which all-reduce algorithm "auto" runs for `bytes` on `world` ranks.
Algorithm chooseAllreduce(const Options& o, int world, size_t bytes);
// Predicted seconds for an algorithm (exposed for tests and `ringreduce-bench --tune`).
double predictAllreduce(const Options& o, Algorithm a, int world, size_t bytes);

// The model at cluster scale (`ringreduce-bench --model`): `hosts` x `local` ranks placed
// host by host, one network link per host (alpha per message, beta per byte through it,
// shared by all of the host's concurrent streams) and shared memory inside a host.
struct ClusterModel {
  int hosts = 1;
  int local = 1;
  double alphaUs = kTcpAlphaUs;              // between hosts
  double betaNsPerByte = kTcpBetaNsPerByte;  // between hosts, through one host's link
  double shmAlphaUs = kShmAlphaUs;              // within a host
  double shmBetaNsPerByte = kShmBetaNsPerByte;  // per phase
  // Flat algorithms' hops between ranks of one host when there are several hosts: loopback
  // TCP.
  double localAlphaUs = kTcpAlphaUs;
  double localBetaNsPerByte = kTcpBetaNsPerByte;
};
enum class ModelAlgo { kRing, kRecursiveDoubling, kBinomialTree, kHier };
// Predicted seconds; kBinomialTree (reduce + broadcast) is modelled for comparison only.
double predictAllreduceCluster(const ClusterModel& m, ModelAlgo a, size_t bytes);
// The fastest predicted of what the core runs: ring, recursive doubling, and hierarchical
// when hosts and ranks per host are both > 1. `predicted` (4 entries, by ModelAlgo) gets
// each candidate's prediction when not null.
ModelAlgo pickAllreduceCluster(const ClusterModel& m, size_t bytes, double* predicted = nullptr);

}  // namespace rr::collectives
