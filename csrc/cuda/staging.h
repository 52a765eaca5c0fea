// Staging planner for CUDA buffers sent over TCP/shm: pure math, no CUDA, no I/O, so it is
// tested exhaustively on any machine (tests/test_gpu.py through _C.gpu.plan_staging).
//
// A device buffer of `count` elements moves through a pinned host staging area split into
// `numBuffers` equal slots (2 = double buffering). Chunk c uses slot c % numBuffers. The
// plan is the order in which one host thread issues three kinds of step per chunk:
//   kCopyStart  enqueue the async copy on the copy stream and record its event
//               (device->host into the slot, or host->device out of it)
//   kCopyWait   wait for that copy's event
//   kTransfer   the blocking network step: send the slot's bytes, or receive into the slot
//
// Device to wire (send):                       Wire to device (receive):
//   start(0) .. start(k-1)                        for c: [wait(c-k)] recv(c) start(c)
//   for c: wait(c) send(c) [start(c+k)]           then wait() the last k chunks
//
//   copy   |D0|D1|  |D2|  |D3|                     wire |R0|R1|R2|R3|
//   wire      |S0 |S1 |S2 |S3 |   (k = 2)          copy    |H0|H1|H2|H3|   (k = 2)
//
// So with k >= 2 the copy of one chunk overlaps the transfer of its neighbour, and a slot
// is never rewritten while its previous chunk is still being sent (send) or copied to the
// device (receive). The CUDA copy stream and events live with the caller; this only orders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rr::cuda::staging {

enum class Direction : uint8_t { kDeviceToWire = 0, kWireToDevice = 1 };
enum class StepKind : uint8_t { kCopyStart = 0, kCopyWait = 1, kTransfer = 2 };

struct Chunk {
  size_t offset;      // first element in the user's buffer
  size_t count;       // elements (> 0)
  size_t byteOffset;  // offset * elemSize
  size_t bytes;       // count * elemSize
  int slot;           // staging slot: index % numBuffers
  size_t slotOffset;  // byte offset of the slot in the staging area: slot * slotBytes
};

struct Step {
  StepKind kind;
  size_t chunk;
};

struct Plan {
  size_t elemSize = 0;
  size_t slotBytes = 0;   // bytes per slot: a multiple of elemSize (and of 64 when >= 64)
  size_t slotElems = 0;
  int numBuffers = 0;
  size_t stagingBytesUsed = 0;  // slotBytes * min(numBuffers, chunks)
  std::vector<Chunk> chunks;
  std::vector<Step> steps;
};

// Slots of at most stagingBytes / numBuffers bytes. Throws InvalidArgument when elemSize
// is 0, numBuffers is outside 1..kMaxBuffers, or a slot cannot hold one element.
constexpr int kMaxBuffers = 16;
Plan plan(size_t count, size_t elemSize, size_t stagingBytes, int numBuffers, Direction dir);

const char* toString(StepKind k);
const char* toString(Direction d);

}  // namespace rr::cuda::staging
