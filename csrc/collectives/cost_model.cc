// The alpha-beta(-gamma) cost model: the only place the ring/tree threshold lives.
//
//   tree (recursive doubling): rounds * (alpha + bytes * beta) + log2(p) * bytes * gamma
//       rounds = log2(p) + 2 when n is not a power of two (fold and unfold)
//   ring: 2(n-1) * alpha + 2(n-1)/n * bytes * beta + (n-1)/n * bytes * gamma
//
// alpha (per message) and beta (per byte on the wire) come from Options: the defaults are
// what `python bench/measure_alpha_beta.py` fitted on 2 ranks over loopback TCP
// (bench/alpha_beta.json, with the machine); RINGREDUCE_TUNING_FILE with the output of
// `ringreduce-bench --tune --tune-out FILE` fits them to another machine. gamma, the per-byte
// reduction cost, is small next to beta over TCP and fixed here: the same script measures it
// (a memory-bound float32 add) into the same file. tests/test_bench.py checks all three.
#include <algorithm>
#include <cmath>

#include "collectives/collectives.h"
#include "core/chunking.h"
#include "core/log.h"

namespace rr::collectives {
namespace {
constexpr double kGammaNsPerByte = 0.042;  // bench/alpha_beta.json
constexpr double kHierMargin = 0.15;       // pickAllreduceCluster
}

double predictAllreduce(const Options& o, Algorithm a, int world, size_t bytes) {
  const double n = world, b = static_cast<double>(bytes);
  const double alpha = o.alphaUs * 1e-6, beta = o.betaNsPerByte * 1e-9, gamma = kGammaNsPerByte * 1e-9;
  if (world <= 1) return 0.0;
  if (a == Algorithm::kTree) {
    int p = chunking::floorPow2(world);
    double lg = std::log2(static_cast<double>(p));
    double rounds = lg + (p == world ? 0 : 2);
    return rounds * (alpha + b * beta) + lg * b * gamma;
  }
  return 2 * (n - 1) * alpha + 2 * (n - 1) / n * b * beta + (n - 1) / n * b * gamma;
}

Algorithm chooseAllreduce(const Options& o, int world, size_t bytes) {
  if (o.treeThresholdBytes >= 0)
    return bytes <= static_cast<size_t>(o.treeThresholdBytes) ? Algorithm::kTree : Algorithm::kRing;
  double t = predictAllreduce(o, Algorithm::kTree, world, bytes);
  double r = predictAllreduce(o, Algorithm::kRing, world, bytes);
  return t <= r ? Algorithm::kTree : Algorithm::kRing;
}

namespace {
// One step of a flat algorithm in which every rank exchanges `bytes` with a partner `dist`
// ranks away (ranks placed host by host): on one host through shared memory; with several,
// inside a host over loopback TCP (the flat algorithms' TCP connections), else over the
// host's link, which carries `streams` concurrent transfers.
double step(const ClusterModel& m, int dist, double bytes, int streams) {
  if (m.hosts <= 1) return m.shmAlphaUs * 1e-6 + bytes * m.shmBetaNsPerByte * 1e-9;
  if (dist < m.local) return m.localAlphaUs * 1e-6 + bytes * m.localBetaNsPerByte * 1e-9;
  return m.alphaUs * 1e-6 + bytes * streams * m.betaNsPerByte * 1e-9;
}
}  // namespace

double predictAllreduceCluster(const ClusterModel& m, ModelAlgo a, size_t bytes) {
  const int n = m.hosts * m.local;
  if (n <= 1) return 0.0;
  const double b = static_cast<double>(bytes), gamma = kGammaNsPerByte * 1e-9;
  switch (a) {
    case ModelAlgo::kRing: {
      // 2(n-1) steps of b/n; with several hosts each step has one cross-host hop per host
      // (the ring leaves each host once).
      // Every hop of a step runs at once: the slowest (inside the host or across) counts.
      double s = step(m, m.hosts > 1 ? m.local : 1, b / n, 1);
      if (m.hosts > 1 && m.local > 1) s = std::max(s, step(m, 1, b / n, 1));
      return 2.0 * (n - 1) * s + (n - 1.0) / n * b * gamma;
    }
    case ModelAlgo::kRecursiveDoubling: {
      const int p = chunking::floorPow2(n);
      double t = 0;
      // Partners 2^k away: inside the host while 2^k < local; beyond, all of a host's
      // ranks cross at once and share its link.
      for (int d = 1; d < p; d *= 2) t += step(m, d, b, std::min(m.local, n));
      if (p != n) t += 2 * step(m, m.local, b, 1);  // fold into / unfold from a power of two
      return t + std::log2(static_cast<double>(p)) * b * gamma;
    }
    case ModelAlgo::kBinomialTree: {
      // Reduce to rank 0, then broadcast, whole messages: 2 ceil(log2 n) levels; at a
      // level crossing hosts, at most one rank per host sends.
      double t = 0;
      int levels = 0;
      for (int d = 1; d < n; d *= 2, ++levels) t += step(m, d, b, 1);
      return 2 * t + levels * b * gamma;
    }
    case ModelAlgo::kHier: {
      // Shared-memory reduce-scatter to `local` slices, one ring per slice across hosts
      // (all of them through the host's link), shared-memory all-gather.
      double intra = m.local > 1 ? 2 * (m.shmAlphaUs * 1e-6 + b * m.shmBetaNsPerByte * 1e-9) : 0;
      const int h = m.hosts;
      double inter = h > 1 ? 2.0 * (h - 1) * (m.alphaUs * 1e-6 + b / h * m.betaNsPerByte * 1e-9)
                           : 0;
      return intra + inter + b * gamma;
    }
  }
  return 0.0;
}

ModelAlgo pickAllreduceCluster(const ClusterModel& m, size_t bytes, double* predicted) {
  const ModelAlgo runnable[] = {ModelAlgo::kRing, ModelAlgo::kRecursiveDoubling, ModelAlgo::kHier};
  double t[4] = {-1, -1, -1, -1};
  ModelAlgo best = ModelAlgo::kRing;
  for (ModelAlgo a : runnable) {
    const int i = static_cast<int>(a);
    if (a == ModelAlgo::kHier && (m.hosts <= 1 || m.local <= 1)) continue;
    t[i] = predictAllreduceCluster(m, a, bytes);
    if (predicted) predicted[i] = t[i];
    if (t[i] < t[static_cast<int>(best)]) best = a;
  }
  // Against the ring (the bandwidth algorithm), hierarchical sends fewer bytes across
  // hosts; the link is priced at what Options say (loopback's alpha/beta unless
  // RINGREDUCE_TUNING_FILE measured the real one) and other jobs share it: within
  // kHierMargin of the ring, hierarchical is kept.
  const double h = t[static_cast<int>(ModelAlgo::kHier)];
  if (best == ModelAlgo::kRing && h >= 0 && h <= t[static_cast<int>(best)] * (1 + kHierMargin))
    best = ModelAlgo::kHier;
  return best;
}

}  // namespace rr::collectives
