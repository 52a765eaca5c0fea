// One logical buffer made of several pieces of host memory (a coalesced all-reduce of many
// tensors, e.g. a DDP bucket's gradients, without first copying them into one flat buffer).
// Offsets and lengths are in bytes of the logical buffer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace rr::collectives {

class Segments {
 public:
  void add(char* p, size_t bytes) {
    if (bytes == 0) return;
    ptr_.push_back(p);
    start_.push_back(total_);
    total_ += bytes;
  }
  size_t pieces() const { return ptr_.size(); }

  // [off, off + len) as one pointer when it lies inside one piece, else nullptr.
  char* contiguous(size_t off, size_t len) const {
    size_t i = find(off);
    return off + len <= end(i) ? ptr_[i] + (off - start_[i]) : nullptr;
  }
  void gather(size_t off, size_t len, char* dst) const {
    for (size_t i = find(off); len > 0; ++i) {
      size_t n = std::min(len, end(i) - off);
      std::memcpy(dst, ptr_[i] + (off - start_[i]), n);
      dst += n, off += n, len -= n;
    }
  }
  void scatter(const char* src, size_t off, size_t len) const {
    for (size_t i = find(off); len > 0; ++i) {
      size_t n = std::min(len, end(i) - off);
      std::memcpy(ptr_[i] + (off - start_[i]), src, n);
      src += n, off += n, len -= n;
    }
  }

 private:
  size_t end(size_t i) const { return i + 1 < start_.size() ? start_[i + 1] : total_; }
  size_t find(size_t off) const {  // the piece holding byte `off` (off < total_)
    if (ptr_.size() == 1) return 0;
    return static_cast<size_t>(std::upper_bound(start_.begin(), start_.end(), off) -
                               start_.begin()) - 1;
  }
  std::vector<char*> ptr_;
  std::vector<size_t> start_;
  size_t total_ = 0;
};

}  // namespace rr::collectives
