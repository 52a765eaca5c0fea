// All-to-all, pairwise exchange: in step i (1 <= i < n) rank r sends its block for
// (r + i) % n and receives the block of (r - i) % n at the same time, so every link is busy
// in both directions and no rank waits on a rank that waits on it. Each block crosses the
// wire once, straight from `in` into `out`; this rank's own block is a local copy.
//
//   n = 4, step 1: 0->1 1->2 2->3 3->0   step 2: 0->2 1->3 2->0 3->1   step 3: 0->3 ...
//
// Counts may differ per pair (torch's all_to_all_single with split sizes): a frame's
// payload size must equal what the receiver expects, else CollectiveMismatch names both.
// With every rank on one host: shm_alltoall.cc.
#include <cstring>

#include <vector>

#include "collectives/collectives.h"
#include "collectives/planner.h"
#include "collectives/shm_algos.h"
#include "core/chunking.h"
#include "core/error.h"

namespace rr::collectives {

void alltoall(Communicator& c, const void* in, const size_t* sendCounts, const size_t* sendOffs,
              void* out, const size_t* recvCounts, const size_t* recvOffs, DataType dtype) {
  const int n = c.world(), me = c.rank();
  const size_t es = elementSize(dtype);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  c.checkUsable();  // before `out` is touched
  const size_t meU = static_cast<size_t>(me);
  RR_CHECK_EQ(sendCounts[meU], recvCounts[meU], "all_to_all: this rank's block to itself");
  // This rank's block to itself. Shared memory copies it while it waits for peers (unless
  // the two ranges overlap); everything else copies it now.
  shm::OwnBlock own;
  const char* ownSrc = src + sendOffs[meU] * es;
  char* ownDst = dst + recvOffs[meU] * es;
  const size_t ownBytes = sendCounts[meU] * es;
  const bool ownOverlaps = ownDst < ownSrc + ownBytes && ownSrc < ownDst + ownBytes;
  size_t total = 0;
  for (int p = 0; p < n; ++p) total += sendCounts[static_cast<size_t>(p)] * es;
  if (n == 1) {
    if (ownBytes > 0 && ownDst != ownSrc) std::memmove(ownDst, ownSrc, ownBytes);
    c.skip();
    return;
  }
  // The header's count is 0: ranks may send different totals; each frame's payload size is
  // checked against what its receiver expects instead.
  // Shared memory when every rank is on this host and the size table fits one line.
  const Algorithm a = planDirect(
      c, CollectiveKind::kAllToAll, total,
      c.shmAll() && shmOneRound(c, static_cast<size_t>(n) * 8));
  const bool viaShm = a == Algorithm::kShm;
  if (ownBytes > 0 && ownDst != ownSrc) {
    if (viaShm && !ownOverlaps)
      own = shm::OwnBlock{ownSrc, ownDst, ownBytes};
    else
      std::memmove(ownDst, ownSrc, ownBytes);
  }
  transport::FrameHeader h =
      c.begin(CollectiveKind::kAllToAll, dtype, ReduceOp::kSum, 0, a, 0, total);
  if (viaShm) {
    std::vector<size_t> sb(static_cast<size_t>(n)), so(sb.size()), rb(sb.size()), ro(sb.size());
    for (size_t p = 0; p < sb.size(); ++p) {
      sb[p] = sendCounts[p] * es;
      so[p] = sendOffs[p] * es;
      rb[p] = recvCounts[p] * es;
      ro[p] = recvOffs[p] * es;
    }
    sb[meU] = rb[meU] = 0;  // this rank's own block: `own`, or copied above
    shm::alltoall(c, h, src, sb.data(), so.data(), dst, rb.data(), ro.data(), own);
    return;
  }
  for (int i = 1; i < n; ++i) {
    const size_t to = static_cast<size_t>(chunking::mod(me + i, n));
    const size_t from = static_cast<size_t>(chunking::mod(me - i, n));
    transport::SendOp s;
    transport::RecvOp r;
    h.step = static_cast<uint32_t>(i);
    s.reset(h, src + sendOffs[to] * es, sendCounts[to] * es);
    r.reset(h, dst + recvOffs[from] * es, recvCounts[from] * es);
    c.sendRecv(static_cast<int>(to), &s, static_cast<int>(from), &r);
  }
}

}  // namespace rr::collectives
