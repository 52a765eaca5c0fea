// Pure chunking and neighbour math, separate from I/O so it can be tested exhaustively.
#pragma once

#include <cstddef>

namespace rr::chunking {

// Split `count` elements into `parts` nearly equal chunks: the first count % parts chunks
// get one extra element. Chunks may be empty when count < parts.
inline size_t chunkLen(size_t count, int parts, int i) {
  size_t p = static_cast<size_t>(parts), idx = static_cast<size_t>(i);
  return count / p + (idx < count % p ? 1 : 0);
}
inline size_t chunkOffset(size_t count, int parts, int i) {
  size_t p = static_cast<size_t>(parts), idx = static_cast<size_t>(i);
  size_t rem = count % p;
  return idx * (count / p) + (idx < rem ? idx : rem);
}

// (a mod n) for possibly negative a.
inline int mod(int a, int n) { return ((a % n) + n) % n; }

// Number of segments of at most segElems elements covering len (0 for len 0).
inline size_t numSegments(size_t len, size_t segElems) {
  return segElems == 0 ? 0 : (len + segElems - 1) / segElems;
}

// Largest power of two <= n (n >= 1).
inline int floorPow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// ceil(log2(n)) for n >= 1.
inline int ceilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

}  // namespace rr::chunking
