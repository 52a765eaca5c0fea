// One POSIX shared-memory segment: created by its owner (mode 0600, a name of the owner's
// choosing that ends in its pid and 128 random bits, so neither another job -- even one with
// the same secret -- nor another user can guess or collide with it), mapped by its peers
// (the owner tells them the name), pre-faulted so no page fault lands on the hot path, and
// unlinked as soon as every peer has mapped it, so nothing is left in /dev/shm even if the
// owner is SIGKILLed afterwards. Only the owner ever unlinks a name, and only its own.
//
// Pages are allocated range by range (populate): /dev/shm holds only what is used. A range
// is allocated by its owner (populate(write)) before any peer maps it in (populate(read)).
// On a kernel without MADV_POPULATE_WRITE (< 5.14) create() allocates everything at once.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rr::transport::shm {

class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;

  struct Range {
    size_t off, len;
  };
  // Create "<prefix>-<pid>-<32 random hex digits>" exclusively (O_EXCL: a name that exists
  // belongs to someone else and is left alone; a fresh random name is tried instead), size it,
  // map it and allocate and pre-fault `now` (a full /dev/shm is a clear error, not a later
  // SIGBUS). name() tells the peers what to open. Throws rr::Error naming the segment and
  // what to do.
  static Segment create(const std::string& prefix, size_t bytes, const std::vector<Range>& now);
  // Map a peer's segment (it must exist with exactly `bytes`); nothing is faulted in yet.
  static Segment open(const std::string& name, size_t bytes);
  // Fault in [off, off + len): write = allocate our own pages (false when /dev/shm has no
  // room: nothing is left half-allocated), read = map a peer's already allocated pages.
  bool populate(const Range& r, bool write);
  // Give the pages of [off, off + len) back to /dev/shm (ours only).
  void release(const Range& r);

  void unlink();  // remove the name (mapping stays valid); idempotent
  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  bool owner_ = false;
  bool linked_ = false;
};

// Size of the tmpfs behind shm_open (/dev/shm) in bytes, 0 if unknown. Its total, not what
// is free: every rank of a host reads the same number, so sizes derived from it agree.
size_t capacityBytes();

}  // namespace rr::transport::shm
