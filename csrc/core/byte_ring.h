// A ring of at most `capacity` bytes with at most one producer and one consumer, for the
// stream buffers of a link (transport/tcp/link.h). Its memory grows as reserve() asks (a
// link's window may be 16 MiB, most streams never hold more than a sub-frame) and moves
// only then, so a producer may fill the spans free() returned (a recv() straight into them)
// while the consumer reads, and a consumer may send from the spans filled() returned while
// the producer adds, as long as the indices are changed under the owner's lock and nobody
// holds spans while reserve() runs.
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
  // The free space allocated now (what free() and copyIn() may fill).
  size_t writable() const { return alloc_ - size_; }
  bool empty() const { return size_ == 0; }

  // Make at least min(n, room()) bytes writable: grows the memory (at least doubling it, up
  // to capacity), which moves the stored bytes -- only while nobody holds spans of them.
  void reserve(size_t n) {
    const size_t want = size_ + std::min(n, room());
    if (want <= alloc_) return;
    const size_t grown = std::min(cap_, std::max({want, 2 * alloc_, kMinAlloc}));
    std::unique_ptr<char[]> b(new char[grown]);
    copyOut(b.get(), size_);
    buf_ = std::move(b);
    alloc_ = grown;
    head_ = 0;
  }
  // Up to two spans of the stored bytes from `off` on, at most `max` bytes in all: the
  // number of spans (0-2) written to out.
  int filled(iovec out[2], size_t off, size_t max) const {
    if (off >= size_) return 0;
    return spans(out, (head_ + off) % alloc_, std::min(size_ - off, max));
  }
  // Up to two spans of the writable space, at most `max` bytes in all.
  int free(iovec out[2], size_t max) {
    if (writable() == 0 || max == 0) return 0;
    return spans(out, (head_ + size_) % alloc_, std::min(writable(), max));
  }
  // `n` bytes written into the spans free() returned are now stored.
  void commit(size_t n) { size_ += std::min(n, writable()); }
  // Drop the first `n` stored bytes. The free space keeps its start (head_ + size_): a
  // producer filling it outside the lock commits where it wrote.
  void consume(size_t n) {
    n = std::min(n, size_);
    if (alloc_) head_ = (head_ + n) % alloc_;
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
  // Store up to n bytes of src, as many as are writable; returns the count.
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
    const size_t first = std::min(n, alloc_ - start);
    out[0] = {buf_.get() + start, first};
    if (first == n) return 1;
    out[1] = {buf_.get(), n - first};
    return 2;
  }

  static constexpr size_t kMinAlloc = 64 << 10;
  std::unique_ptr<char[]> buf_;
  size_t cap_;
  size_t alloc_ = 0;  // bytes of buf_
  size_t head_ = 0;   // index of the first stored byte
  size_t size_ = 0;
};

}  // namespace rr
