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
#include <cmath>

#include "collectives/collectives.h"
#include "core/chunking.h"
#include "core/log.h"

namespace rr::collectives {
namespace {
constexpr double kGammaNsPerByte = 0.042;  // bench/alpha_beta.json
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

}  // namespace rr::collectives
