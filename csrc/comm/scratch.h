// Grow-only, 64-byte aligned scratch buffers, one per slot. After the first few calls the
// hot path allocates nothing. Owned by one communicator; used by its executor thread only.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace rr::comm {

class ScratchArena {
 public:
  static constexpr int kSlots = 3;
  enum Slot { kAcc = 0, kRecv = 1, kExtra = 2 };

  ~ScratchArena() {
    for (auto& b : bufs_) std::free(b.ptr);
  }
  char* get(Slot slot, size_t bytes) {
    Buf& b = bufs_[slot];
    if (bytes > b.size) {
      std::free(b.ptr);
      size_t sz = (bytes + 63) / 64 * 64;
      b.ptr = static_cast<char*>(std::aligned_alloc(64, sz));
      if (!b.ptr) {
        b.size = 0;
        throw std::bad_alloc();
      }
      b.size = sz;
    }
    return b.ptr;
  }

 private:
  struct Buf {
    char* ptr = nullptr;
    size_t size = 0;
  };
  Buf bufs_[kSlots];
};

}  // namespace rr::comm
