#include "cuda/staging.h"

#include "core/error.h"

namespace rr::cuda::staging {

const char* toString(StepKind k) {
  switch (k) {
    case StepKind::kCopyStart: return "copy_start";
    case StepKind::kCopyWait: return "copy_wait";
    case StepKind::kTransfer: return "transfer";
  }
  return "unknown-step";
}

const char* toString(Direction d) {
  switch (d) {
    case Direction::kDeviceToWire: return "device_to_wire";
    case Direction::kWireToDevice: return "wire_to_device";
  }
  return "unknown-direction";
}

Plan plan(size_t count, size_t elemSize, size_t stagingBytes, int numBuffers, Direction dir) {
  if (elemSize == 0) RR_THROW(InvalidArgument, "staging plan: element size must be > 0");
  if (numBuffers < 1 || numBuffers > kMaxBuffers) {
    RR_THROW(InvalidArgument, "staging plan: numBuffers must be in 1..", kMaxBuffers, ", got ",
             numBuffers);
  }
  if (dir != Direction::kDeviceToWire && dir != Direction::kWireToDevice) {
    RR_THROW(InvalidArgument, "staging plan: unknown direction ", static_cast<int>(dir));
  }
  const size_t k = static_cast<size_t>(numBuffers);
  size_t slot = stagingBytes / k;
  // Keep slots (and so chunk offsets) 64-byte aligned when they are big enough: copies of
  // aligned chunks run at full speed. 64 is a multiple of every element size we use.
  if (slot >= 64 && 64 % elemSize == 0) slot -= slot % 64;
  slot -= slot % elemSize;
  if (slot == 0) {
    RR_THROW(InvalidArgument, "staging plan: ", stagingBytes, " staging bytes in ", numBuffers,
             " slots cannot hold one ", elemSize, "-byte element per slot; raise the staging size");
  }
  Plan p;
  p.elemSize = elemSize;
  p.slotBytes = slot;
  p.slotElems = slot / elemSize;
  p.numBuffers = numBuffers;
  const size_t n = count == 0 ? 0 : (count + p.slotElems - 1) / p.slotElems;
  p.chunks.reserve(n);
  for (size_t c = 0; c < n; ++c) {
    const size_t off = c * p.slotElems;
    const size_t len = (count - off < p.slotElems) ? count - off : p.slotElems;
    const int s = static_cast<int>(c % k);
    p.chunks.push_back({off, len, off * elemSize, len * elemSize, s, static_cast<size_t>(s) * slot});
  }
  p.stagingBytesUsed = slot * (n < k ? n : k);
  p.steps.reserve(3 * n);
  auto add = [&](StepKind kind, size_t c) { p.steps.push_back({kind, c}); };
  if (dir == Direction::kDeviceToWire) {
    for (size_t c = 0; c < n && c < k; ++c) add(StepKind::kCopyStart, c);
    for (size_t c = 0; c < n; ++c) {
      add(StepKind::kCopyWait, c);
      add(StepKind::kTransfer, c);  // slot c % k is free again once this returns
      if (c + k < n) add(StepKind::kCopyStart, c + k);
    }
  } else {
    for (size_t c = 0; c < n; ++c) {
      if (c >= k) add(StepKind::kCopyWait, c - k);  // the slot's previous H2D must be done
      add(StepKind::kTransfer, c);
      add(StepKind::kCopyStart, c);
    }
    for (size_t c = n > k ? n - k : 0; c < n; ++c) add(StepKind::kCopyWait, c);
  }
  return p;
}

}  // namespace rr::cuda::staging
