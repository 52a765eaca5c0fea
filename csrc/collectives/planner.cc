#include "collectives/planner.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace rr::collectives {

namespace {

thread_local int tQuiet = 0;

// "4 ranks" / "4 ranks on 2 hosts" / "4 ranks on 1 host (shared memory)".
std::string layout(Communicator& c) {
  std::string s = std::to_string(c.world()) + " ranks";
  if (c.shmAll()) return s + " on 1 host (shared memory)";
  if (c.shm()) return s + " on " + std::to_string(c.world() / c.shm()->world()) + " hosts";
  return s;
}

// `why` is built only when the plan is logged.
template <typename Why>
Algorithm logged(Communicator& c, CollectiveKind k, size_t bytes, Algorithm a, const Why& why) {
  if (tQuiet) return a;
  RR_LOG(log::kDebug, "plan: ", c.kindName(k, -1), " #", c.seq() + 1, " on ", c.name(), ", ",
         bytes, " bytes, ", layout(c), " -> ", toString(a), " (", why(), ")");
  return a;
}

Algorithm logged(Communicator& c, CollectiveKind k, size_t bytes, Algorithm a, const char* why) {
  return logged(c, k, bytes, a, [why] { return why; });
}

// Measured here (2-core VM, float32, median of 9, two interleaved runs each): all-reduce of
// 64 MiB with 512 KiB chunks vs 512 KiB slices -- 2 ranks 29-30 -> 16-18 ms, 3 ranks 79-98
// -> 49-51 ms, 4 ranks 105-106 -> 66-72 ms; 4 MiB at 2 ranks 1.6-1.8 -> 0.6 ms. The copying
// collectives got slower with bigger units at 3-4 ranks (all-to-all 16 MiB 9-10 -> 14-15
// ms), so they keep 512 KiB.
constexpr size_t kShmSliceBytes = 512 * 1024;
constexpr size_t kShmCopyBytes = 512 * 1024;
constexpr size_t kShmHostSlotBytes = 32u << 20;
// Beyond the 512 KiB floor a communicator's slots take at most this share of /dev/shm: a
// job makes one per group, and docker's default /dev/shm is 64 MiB (world + 3 groups of 4
// ranks at 32 MiB each did not fit; at the floor, 8 MiB each, they do).
constexpr size_t kShmCapacityShare = 16;

}  // namespace

size_t p2pEagerBytes() {
  return static_cast<size_t>(transport::shm::ShmConfig{}.slots) * kShmCopyBytes;
}

void planShmSlots(int local, size_t shmCapacity, transport::shm::ShmConfig* cfg) {
  const size_t n = static_cast<size_t>(std::max(local, 1));
  const size_t k = static_cast<size_t>(std::max(cfg->slots, 1));
  const size_t host = shmCapacity ? std::min(kShmHostSlotBytes, shmCapacity / kShmCapacityShare)
                                  : kShmHostSlotBytes;
  const size_t want = std::min(n * kShmSliceBytes, host / (n * k));
  cfg->chunkBytes = std::max(kShmCopyBytes, want / 4096 * 4096);
  cfg->copyBytes = kShmCopyBytes;
}

QuietPlans::QuietPlans() { ++tQuiet; }
QuietPlans::~QuietPlans() { --tQuiet; }

ClusterModel clusterModel(Communicator& c) {
  ClusterModel m;
  m.local = c.shm() ? c.shm()->world() : 1;
  m.hosts = c.world() / m.local;
  m.alphaUs = m.localAlphaUs = c.options().alphaUs;
  m.betaNsPerByte = m.localBetaNsPerByte = c.options().betaNsPerByte;
  return m;
}

Algorithm planAllreduce(Communicator& c, Algorithm requested, size_t bytes) {
  const CollectiveKind k = CollectiveKind::kAllReduce;
  if (requested == Algorithm::kShm && !c.shmAll())
    RR_THROW(InvalidArgument, "algo=shm needs every rank on one host with shared memory enabled");
  if (requested == Algorithm::kHier && (!c.shm() || c.shmAll()))
    RR_THROW(InvalidArgument, "algo=hier needs several hosts with the same number (>= 2) of ranks");
  if (requested != Algorithm::kAuto) return logged(c, k, bytes, requested, "requested");
  if (c.shmAll()) return logged(c, k, bytes, Algorithm::kShm, "one host");
  const Options& o = c.options();
  if (!c.shm() || o.treeThresholdBytes >= 0) {  // flat model, or the switch forced
    Algorithm a = chooseAllreduce(o, c.world(), bytes);
    if (a == Algorithm::kRing && c.shm()) a = Algorithm::kHier;
    return logged(c, k, bytes, a, o.treeThresholdBytes >= 0 ? "RINGREDUCE_TREE_THRESHOLD_BYTES"
                                                            : "flat model");
  }
  double t[4] = {0, 0, 0, 0};
  const ModelAlgo pick = pickAllreduceCluster(clusterModel(c), bytes, t);
  const Algorithm a = pick == ModelAlgo::kHier ? Algorithm::kHier
                      : pick == ModelAlgo::kRing ? Algorithm::kRing : Algorithm::kTree;
  return logged(c, k, bytes, a, [&t] {
    auto us = [&t](ModelAlgo m) { return static_cast<long>(t[static_cast<int>(m)] * 1e6); };
    return detail::concat("cluster model: ring ", us(ModelAlgo::kRing), " us, recursive doubling ",
                          us(ModelAlgo::kRecursiveDoubling), " us, hierarchical ",
                          us(ModelAlgo::kHier), " us");
  });
}

Algorithm planBroadcast(Communicator& c, size_t bytes) {
  const CollectiveKind k = CollectiveKind::kBroadcast;
  if (c.shmAll()) return logged(c, k, bytes, Algorithm::kShm, "one host");
  const bool tree = bytes <= c.options().broadcastTreeMaxBytes || c.world() == 2;
  return logged(c, k, bytes, tree ? Algorithm::kTree : Algorithm::kRing,
                tree ? "binomial tree" : "pipelined chain");
}

// Frames of one segment above 4: a rank that fails while sending can finish the frame it is
// in and tell its peer why (TcpConnection::sendAbort); 64 MiB at 2 ranks also ran 1.5x faster
// (receiving in cache-sized pieces). Up to 4 segments, one frame: splitting 1 MiB cost ~20%.
size_t treeFrameBytes(Communicator& c, size_t bytes) {
  const size_t seg = std::max<size_t>(1, c.options().segmentBytes);
  return bytes <= 4 * seg ? bytes : seg;
}

Algorithm planBarrier(Communicator& c) {
  const CollectiveKind k = CollectiveKind::kBarrier;
  return logged(c, k, 0, c.shmAll() ? Algorithm::kShm : Algorithm::kTree,
                c.shmAll() ? "one line round" : "dissemination");
}

Algorithm planReduce(Communicator& c, size_t bytes) {
  const CollectiveKind k = CollectiveKind::kReduce;
  if (c.shmAll())
    return logged(c, k, bytes, Algorithm::kShm, "shared-memory all-reduce schedule, root collects");
  return logged(c, k, bytes, Algorithm::kTree, "binomial tree");
}

Algorithm planDirect(Communicator& c, CollectiveKind kind, size_t bytes, bool shmOk) {
  if (c.shmAll() && shmOk) return logged(c, kind, bytes, Algorithm::kShm, "one host");
  return logged(c, kind, bytes, Algorithm::kAuto,
                kind == CollectiveKind::kAllToAll ? "pairwise exchange" : "direct");
}

bool shmOneRound(Communicator& c, size_t lineBytes) {
  return lineBytes <= c.shm()->config().smallMax;
}

bool shmOffersInPlace(Communicator& c) { return c.options().cma && c.shm()->cmaReadable(); }

Algorithm planGatherAll(Communicator& c, CollectiveKind kind, size_t bytes, size_t lineBytes) {
  if (c.shmAll())
    return logged(c, kind, bytes, Algorithm::kShm,
                  shmOneRound(c, lineBytes) ? "one host, one line round"
                                            : "one host, pipelined chunk slots");
  return logged(c, kind, bytes, Algorithm::kRing, "TCP ring");
}

}  // namespace rr::collectives
