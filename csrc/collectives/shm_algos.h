// Shared-memory collectives (all ranks on one host); see each .cc for the schedule.
#pragma once

#include "collectives/allreduce_impl.h"

namespace rr::collectives::shm {

void allreduce(comm::Communicator& c, const transport::FrameHeader& h, const AllreduceArgs& a);
void broadcast(comm::Communicator& c, const transport::FrameHeader& h, char* buf, size_t bytes,
               int root);
void barrier(comm::Communicator& c, const transport::FrameHeader& h);
// shm_rooted.cc: `bytes` per rank; root's out (gather) / in (scatter) hold n blocks. Scatter
// copies the root's own block too, while the others read theirs.
void gather(comm::Communicator& c, const transport::FrameHeader& h, const char* in, char* out,
            size_t bytes, int root);
void scatter(comm::Communicator& c, const transport::FrameHeader& h, const char* in, char* out,
             size_t bytes, int root);
// shm_alltoall.cc: sizes and offsets in bytes, one per local rank (this rank's own entries
// 0); `own`: this rank's block to itself, copied while the exchange waits (ranges must not
// overlap; bytes 0 = nothing to copy).
struct OwnBlock {
  const char* src = nullptr;
  char* dst = nullptr;
  size_t bytes = 0;
};
void alltoall(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
              const size_t* sendBytes, const size_t* sendOffs, char* out,
              const size_t* recvBytes, const size_t* recvOffs, const OwnBlock& own);

// shm_gatherall.cc: `bytes` per rank (all-gather; out[me] is the caller's already), `count`
// elements per block (reduce-scatter; `in` holds n blocks). One line round when the line
// holds it, else pipelined through the chunk slots.
void allgather(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
               char* out, size_t bytes);
void reduceScatter(comm::Communicator& c, const transport::FrameHeader& h, const char* in,
                   char* out, size_t count, DataType dtype, ReduceOp op);

}  // namespace rr::collectives::shm
