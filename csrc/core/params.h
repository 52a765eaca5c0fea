// Tunables of one communicator. Python reads each from its RINGREDUCE_* variable (see
// ringreduce/_env.py, where every knob is declared once) and passes them in; defaults here
// match the ones declared there.
#pragma once

#include <cstddef>
#include <string>
#include <vector>
#include <cstdint>

namespace rr {

struct Options {
  // Seconds any single collective may wait for a peer before raising TimeoutError.
  double timeoutSec = 600.0;
  // Seconds init may take to connect the full mesh (RINGREDUCE_CONNECT_TIMEOUT).
  double connectTimeoutSec = 120.0;
  // Pipelining unit for large messages over TCP (RINGREDUCE_SEGMENT_BYTES).
  size_t segmentBytes = 512 * 1024;
  // Cost model (alpha-beta, collectives/cost_model.cc): per-message latency and per-byte
  // time over TCP, as `python bench/measure_alpha_beta.py` fitted them on 2 ranks over
  // loopback and wrote them to bench/alpha_beta.json (with the machine; tests/test_bench.py
  // checks these equal it). RINGREDUCE_TUNING_FILE overrides them, e.g. with the output of
  // `ringreduce-bench --tune --tune-out FILE` run on the target machine.
  double alphaUs = 8.4;
  double betaNsPerByte = 0.176;
  // RINGREDUCE_HALF_WIRE: bits per float16/bfloat16 partial result that TCP all-reduce and
  // reduce-scatter send. 16 halves the bytes on the wire: each hop adds in float32 and
  // rounds to 16 bits once (as NCCL and Gloo do), so the error grows with the hops. 32 sends
  // float32 partials and rounds once at the end. Every rank must use the same value.
  int halfWireBits = 16;
  // Forced ring/tree switch in bytes for all-reduce; negative = use the cost model.
  int64_t treeThresholdBytes = -1;
  // Broadcasts up to this many bytes use the binomial tree, larger ones the chain.
  size_t broadcastTreeMaxBytes = 256 * 1024;
  // Heartbeats (RINGREDUCE_HEARTBEAT_INTERVAL / _TIMEOUT): a peer silent for longer than
  // the timeout is reported as frozen, partitioned or dead. 0 disables the check.
  double heartbeatIntervalSec = 0.5;
  double heartbeatTimeoutSec = 4.0;
  // RINGREDUCE_STALL_WARN: after waiting this long in one collective, log which ranks are
  // behind (from their heartbeats) -- once per collective, on every waiting rank. 0 = off.
  double stallWarnSec = 10.0;
  // Busy-poll sockets this long before sleeping in poll(2): a small message's answer
  // usually arrives within microseconds, and a wake-up costs tens of them. Python sets 0
  // when ranks outnumber cores (spinning would steal the peer's core).
  double spinUs = 1000.0;
  // RINGREDUCE_FULL_MESH_MAX: communicators of up to this many ranks connect every pair at
  // init and heartbeat every peer (complete diagnostics); larger ones connect and watch a
  // sparse overlay of O(log n) peers and make other connections on first use.
  int fullMeshMax = 16;
  // RINGREDUCE_CHECKSUM: CRC32C on every TCP payload (shared memory is not checksummed).
  bool checksum = false;
  // A group's communicator: the world rank of each of its ranks (messages name world
  // ranks, as users know them; empty = the world itself) and its name ("group3").
  std::vector<int> rankLabels;
  std::string groupName;
};

}  // namespace rr
