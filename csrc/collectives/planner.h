// The planner: the one place that decides how a collective runs on a communicator -- its
// transport (shared memory when every rank is on this host; across hosts TCP, or for the
// all-reduce shared memory inside each host plus TCP between them) and its algorithm --
// from the layout, the size and the cost model (cost_model.cc). Collectives run what it
// returns; each plan is logged at RINGREDUCE_DEBUG=DEBUG.
#pragma once

#include <cstddef>

#include "collectives/collectives.h"
#include "transport/shm/domain.h"

namespace rr::collectives {

// "auto": shared memory on one host; across hosts the cluster model's pick among ring,
// recursive doubling (kTree) and hierarchical (when the hosts share memory inside), or the
// flat model's ring/tree without shared memory. An explicit request is checked and kept.
Algorithm planAllreduce(Communicator& c, Algorithm requested, size_t bytes);
// kShm, kTree (binomial tree) or kRing (pipelined chain).
Algorithm planBroadcast(Communicator& c, size_t bytes);
// The binomial tree's frames (TCP broadcast, kTree): a message of at most 4 segments
// (RINGREDUCE_SEGMENT_BYTES) goes in one frame, a larger one in frames of one segment, each
// forwarded to the children as soon as it is in.
size_t treeFrameBytes(Communicator& c, size_t bytes);
// kShm (one line round) or kTree (dissemination).
Algorithm planBarrier(Communicator& c);
// kShm (the shared-memory all-reduce on a copy) or kTree (binomial tree to the root).
Algorithm planReduce(Communicator& c, size_t bytes);
// Gather, scatter, all-to-all: kShm or kAuto (direct to/from the root; pairwise exchange).
// `shmOk`: the collective's shared-memory path can take this call.
Algorithm planDirect(Communicator& c, CollectiveKind kind, size_t bytes, bool shmOk = true);

// Shared memory's variant, decided here for every collective that has both: one round
// through the ranks' lines when what a line must carry (`lineBytes`) fits one
// (ShmConfig::smallMax), else pipelined chunk slots.
bool shmOneRound(Communicator& c, size_t lineBytes);

// Single-copy reads (transport/shm/cma.h), decided here for the collectives that offer
// them (a point-to-point message larger than the slots, scatter, all-to-all): this rank
// offers its peers to read its buffer in place when RINGREDUCE_CMA is on (job-wide) and
// it can read every local peer (probed once; permissions are symmetric). The collective
// still tells its peers per call, and falls back to the slots where it does not offer.
bool shmOffersInPlace(Communicator& c);

// All-gather, reduce-scatter: kShm on one host (one line round when `lineBytes`, what each
// rank's line must carry, fits the line; else pipelined chunk slots), else kRing over TCP.
Algorithm planGatherAll(Communicator& c, CollectiveKind kind, size_t bytes, size_t lineBytes);

// Shared memory's slot sizes for `local` ranks on a host (cfg->slots each): the large
// all-reduce splits each chunk into `local` slices, which should be >= 512 KiB, so
// cfg->chunkBytes = local x 512 KiB, the host's slots within min(32 MiB, shmCapacity / 16)
// (shmCapacity: the size of /dev/shm, 0 = unknown), at least 512 KiB; the collectives that
// only copy use cfg->copyBytes = 512 KiB units.
void planShmSlots(int local, size_t shmCapacity, transport::shm::ShmConfig* cfg);
// A point-to-point channel's eager limit over shared memory: what its slots hold (a larger
// message waits for its receiver: shm_broadcast.cc). ringreduce.p2p's EAGER_MAX.
size_t p2pEagerBytes();

// While one lives on this thread, plans are not logged (queries from the bench: what would
// the communicator run?).
struct QuietPlans {
  QuietPlans();
  ~QuietPlans();
  QuietPlans(const QuietPlans&) = delete;
  QuietPlans& operator=(const QuietPlans&) = delete;
};

// The cluster model of `c`'s layout: hosts x ranks per host (from its shared-memory
// domain), Options' alpha/beta for the links (RINGREDUCE_TUNING_FILE sets them).
ClusterModel clusterModel(Communicator& c);

}  // namespace rr::collectives
