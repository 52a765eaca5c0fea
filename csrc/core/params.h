// Options of one communicator. The environment's knobs are declared once, in
// core/tunables.def; Python reads that table (ringreduce._C.TUNABLES), parses each variable
// and passes the values in; the rest come from the tuning file or are derived.
#pragma once

#include <cstddef>
#include <string>
#include <vector>
#include <cstdint>

namespace rr {

// The cost model's defaults (alpha-beta, collectives/cost_model.cc): per-message latency and
// per-byte time over TCP, as `python bench/measure_alpha_beta.py` fitted them on 2 ranks
// over loopback and wrote them to bench/alpha_beta.json (with the machine;
// tests/test_bench.py checks these equal it); and within a host over shared memory
// (bench/shm_2ranks.json: 8 B all-reduce; 64 MiB on 2 ranks in 7.6 ms, 2 phases). Python
// reads them as ringreduce._C.COST_MODEL.
inline constexpr double kTcpAlphaUs = 8.4;
inline constexpr double kTcpBetaNsPerByte = 0.176;
inline constexpr double kShmAlphaUs = 0.8;
inline constexpr double kShmBetaNsPerByte = 0.057;

struct Options {
  // The environment's knobs (core/tunables.def: variable, default and meaning of each).
#define RR_TUNABLE(field, key, Type, env, dflt, parse, shown, doc) Type field = dflt;
#define RR_PY_TUNABLE(key, env, dflt, parse, shown, doc)
#include "core/tunables.def"
#undef RR_TUNABLE
#undef RR_PY_TUNABLE
  // Cost model over TCP (above). RINGREDUCE_TUNING_FILE overrides it, e.g. with the output
  // of `ringreduce-bench --tune --tune-out FILE` run on the target machine.
  double alphaUs = kTcpAlphaUs;
  double betaNsPerByte = kTcpBetaNsPerByte;
  // Broadcasts up to this many bytes use the binomial tree, larger ones the chain.
  size_t broadcastTreeMaxBytes = 256 * 1024;
  // Busy-poll sockets this long before sleeping in poll(2): a small message's answer
  // usually arrives within microseconds, and a wake-up costs tens of them. Python sets 0
  // when ranks outnumber cores (spinning would steal the peer's core).
  double spinUs = 1000.0;
  // A group's communicator: the world rank of each of its ranks (messages name world
  // ranks, as users know them; empty = the world itself) and its name ("group3").
  std::vector<int> rankLabels;
  std::string groupName;
  // A point-to-point channel (ringreduce/p2p.py: two ranks, one direction, the root always
  // the sender): a small message over shared memory is sent eagerly -- the sender writes
  // its line and returns, at most two messages ahead of its receiver -- as MPI and TCP
  // sends return before the receive is posted (collectives/shm_broadcast.cc).
  bool p2pChannel = false;
  // A channel's group (its store prefix): a channel that loses its peer (dead, frozen)
  // fails this process's other channels of that group, telling their peers which rank was
  // lost (runtime/executor.cc) -- a pipeline's first stage, waiting for a second stage
  // that lost the third, learnt nothing until its timeout (found by a helper).
  std::string p2pFamily;
  // A group (ringreduce/groups.py): when shared memory reaches every one of its ranks (one
  // host), it opens no TCP connection at init -- its data moves through shared memory, its
  // liveness comes from the segments and pidfds (transport/shm/liveness.h) -- and connects
  // a pair over TCP only if an algorithm ever asks for it (comm/lazy_connect.cc).
  bool socketless = false;
  // A group's or channel's: the job's world size (a rank outside it that a peer says it lost
  // is a world rank below this); 0: this communicator is the world (nothing is outside it).
  int jobWorld = 0;
};

}  // namespace rr
