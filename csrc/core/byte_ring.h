// A fixed-capacity ring of bytes with at most one producer and one consumer, for the
// stream buffers of a link (transport/tcp/link.h). The memory is allocated on first use and
// never moves while the ring lives, so a producer may fill the spans free() returned (a
// recv() straight into them) while the consumer reads, as long as the indices are changed
// under the owner's lock: the consumer only ever grows the free space.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>

namespace rr {

class ByteRing {
 public:
  explicit ByteRing(size_t capacity) : cap_(capacity) {}

  size_t capacity() const { return cap_; }
  size_t size() const { return size_; }
  size_t room() const { return cap_ - size_; }
  bool empty() const { return size_ == 0; }

  // Up to two spans of the stored bytes from `off` on, at most `max` bytes in all: the
  // number of spans (0-2) written to out.
  int filled(iovec out[2], size_t off, size_t max) const {
    if (off >= size_) return 0;
    return spans(out, (head_ + off) % cap_, std::min(size_ - off, max));
  }
  // Up to two spans of free space, at most `max` bytes in all (allocates on first use).
  int free(iovec out[2], size_t max) {
    if (room() == 0 || max == 0) return 0;
    if (!buf_) buf_.reset(new char[cap_]);
    return spans(out, (head_ + size_) % cap_, std::min(room(), max));
  }
  // `n` bytes written into the spans free() returned are now stored.
  void commit(size_t n) { size_ += std::min(n, room()); }
  // Drop the first `n` stored bytes. The free space keeps its start (head_ + size_): a
  // producer filling it outside the lock commits where it wrote.
  void consume(size_t n) {
    n = std::min(n, size_);
    if (cap_) head_ = (head_ + n) % cap_;
    size_ -= n;
  }
  // Copy up to n stored bytes from `off` on into dst (nothing consumed); returns the count.
  size_t copyOut(void* dst, size_t n, size_t off = 0) const {
    iovec v[2];
    const int k = filled(v, off, n);
    size_t done = 0;
    for (int i = 0; i < k; ++i) {
      std::memcpy(static_cast<char*>(dst) + done, v[i].iov_base, v[i].iov_len);
      done += v[i].iov_len;
    }
    return done;
  }
  // Store up to n bytes of src; returns the count.
  size_t copyIn(const void* src, size_t n) {
    iovec v[2];
    const int k = free(v, n);
    size_t done = 0;
    for (int i = 0; i < k; ++i) {
      std::memcpy(v[i].iov_base, static_cast<const char*>(src) + done, v[i].iov_len);
      done += v[i].iov_len;
    }
    commit(done);
    return done;
  }

 private:
  int spans(iovec out[2], size_t start, size_t n) const {
    if (n == 0) return 0;
    const size_t first = std::min(n, cap_ - start);
    out[0] = {buf_.get() + start, first};
    if (first == n) return 1;
    out[1] = {buf_.get(), n - first};
    return 2;
  }

  std::unique_ptr<char[]> buf_;
  size_t cap_;
  size_t head_ = 0;  // index of the first stored byte
  size_t size_ = 0;
};

}  // namespace rr
