// Broadcast from any root. Ranks are renumbered relative to the root (v = rank - root).
//
// Small messages: binomial tree, ceil(log2 n) rounds. For n = 8:
//
//        v0 ----------> v4 ----> v6 -> v7
//         |--> v2 -> v3  |-> v5
//         |-> v1
//
// Large messages: a pipelined chain v0 -> v1 -> ... -> v(n-1) in segments; each rank
// forwards segment s as soon as it has it, so the time is ~ bytes/bandwidth + n segments.
// The chain sends frames of RINGREDUCE_SEGMENT_BYTES, the tree what the planner says
// (treeFrameBytes: the whole message when small).
#include <algorithm>

#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "core/chunking.h"

namespace rr::collectives {
namespace {

void binomial(Communicator& c, transport::FrameHeader h, char* buf, size_t bytes, int root) {
  const int n = c.world();
  const int v = chunking::mod(c.rank() - root, n);
  auto real = [&](int vr) { return chunking::mod(vr + root, n); };
  int mask = 1, parent = -1;
  while (mask < n) {
    if (v & mask) {
      parent = real(v - mask);
      break;
    }
    mask <<= 1;
  }
  const size_t seg = treeFrameBytes(c, bytes);
  for (size_t off = 0; off < bytes; off += seg) {
    const size_t len = std::min(seg, bytes - off);
    if (parent >= 0) {
      transport::RecvOp rv;
      rv.reset(h, buf + off, len);
      c.sendRecv(-1, nullptr, parent, &rv);
    }
    for (int m = mask >> 1; m > 0; m >>= 1) {
      if (v + m < n) {
        transport::SendOp s;
        s.reset(h, buf + off, len);
        c.sendRecv(real(v + m), &s, -1, nullptr);
      }
    }
  }
}

void chain(Communicator& c, const transport::FrameHeader& h, char* buf, size_t bytes, int root) {
  const int n = c.world();
  const int v = chunking::mod(c.rank() - root, n);
  const int prev = chunking::mod(c.rank() - 1, n), next = chunking::mod(c.rank() + 1, n);
  const bool hasPrev = v > 0, hasNext = v < n - 1;
  const size_t seg = std::max<size_t>(1, c.options().segmentBytes);
  const size_t S = chunking::numSegments(bytes, seg);
  size_t su = hasNext ? 0 : S, ru = hasPrev ? 0 : S;
  bool sActive = false, rActive = false;
  transport::SendOp s;
  transport::RecvOp rv;
  while (su < S || ru < S) {
    if (!sActive && su < S && (!hasPrev || ru > su)) {
      size_t off = su * seg;
      s.reset(h, buf + off, std::min(seg, bytes - off));
      sActive = true;
    }
    if (!rActive && ru < S) {
      size_t off = ru * seg;
      rv.reset(h, buf + off, std::min(seg, bytes - off));
      rActive = true;
    }
    bool progressed = false;
    if (sActive && c.progressSend(next, s)) {
      sActive = false;
      ++su;
      progressed = true;
    }
    if (rActive && c.progressRecv(prev, rv)) {
      rActive = false;
      ++ru;
      progressed = true;
    }
    if (!progressed && (sActive || rActive)) c.waitIo(sActive ? next : -1, rActive ? prev : -1);
  }
}

}  // namespace

void broadcast(Communicator& c, void* buf, size_t count, DataType dtype, int root) {
  const size_t bytes = count * elementSize(dtype);
  if (count == 0 || c.world() == 1) {
    c.skip();
    return;
  }
  const Algorithm a = planBroadcast(c, bytes);
  transport::FrameHeader h =
      c.begin(CollectiveKind::kBroadcast, dtype, ReduceOp::kSum, root, a, count, bytes);
  // A point-to-point sender over TCP returns once the kernel took its frames and never reads
  // the channel: look for the receiver's abort (a size mismatch) before sending more. (Over
  // shared memory a sender waits within two messages, and waits see aborts.)
  if (a != Algorithm::kShm && c.options().p2pChannel && c.rank() == root) c.pollIdle();
  if (a == Algorithm::kShm)
    shm::broadcast(c, h, static_cast<char*>(buf), bytes, root);
  else if (a == Algorithm::kTree)
    binomial(c, h, static_cast<char*>(buf), bytes, root);
  else
    chain(c, h, static_cast<char*>(buf), bytes, root);
}

}  // namespace rr::collectives
