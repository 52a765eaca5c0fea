#include "transport/shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/sha256.h"

namespace rr::transport::shm {
namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Fault [p, p + len) in (write: allocating tmpfs pages); 0 or the errno (EINVAL: the kernel
// has no MADV_POPULATE_*; EFAULT: a page could not be allocated).
int populateRange(char* p, size_t len, bool write) {
  if (len == 0) return 0;
  while (::madvise(p, len, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

// Map pages already allocated by reading one byte of each.
void touchPages(const char* p, size_t len) {
  for (size_t i = 0; i < len; i += 4096) (void)*static_cast<const volatile char*>(p + i);
}

}  // namespace

Segment::~Segment() {
  if (addr_) ::munmap(addr_, size_);
  if (owner_ && linked_) ::shm_unlink(name_.c_str());
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (addr_) ::munmap(addr_, size_);
    if (owner_ && linked_) ::shm_unlink(name_.c_str());
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    name_ = std::move(o.name_);
    owner_ = std::exchange(o.owner_, false);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

Segment Segment::create(const std::string& prefix, size_t bytes, const std::vector<Range>& now) {
  // 128 random bits make a clash all but impossible; the retries are for a broken or
  // malicious random source, and never remove the name that was in the way.
  constexpr int kAttempts = 4;
  std::string name;
  int fd = -1;
  for (int attempt = 1; fd < 0; ++attempt) {
    uint8_t rnd[16];
    crypto::randomBytes(rnd, sizeof(rnd));
    name = prefix + "-" + std::to_string(::getpid()) + "-" + hex(rnd, sizeof(rnd));
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) break;
    if (errno == EEXIST && attempt < kAttempts) continue;
    if (errno == EEXIST)
      RR_THROW(Error, "cannot create shared memory segment ", name, ": ", kAttempts,
               " fresh random names all exist already (left alone: they belong to another "
               "process); check that getrandom works, or set RINGREDUCE_TRANSPORT=tcp");
    RR_THROW(Error, "cannot create shared memory segment ", name, ": ", std::strerror(errno),
             " (is /dev/shm mounted and writable? set RINGREDUCE_TRANSPORT=tcp to avoid it)");
  }
  // Every failure below removes the name we just created (ours alone), exactly once: by
  // the Segment's destructor once it owns the mapping.
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    RR_THROW(Error, "cannot size shared memory segment ", name, ": ", std::strerror(err));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    RR_THROW(Error, "mmap of ", name, " failed: ", std::strerror(err));
  }
  Segment s;
  s.name_ = name;
  s.owner_ = true;
  s.linked_ = true;
  s.addr_ = p;
  s.size_ = bytes;
  // tmpfs hands out zeroed pages: no memset (it cost a quarter of a 4-rank group's setup).
  int rc = 0;
  size_t want = 0;  // what the message names: the pages asked for now, not the file's size
  for (const Range& r : now) want += r.len;
  for (const Range& r : now) {
    rc = populateRange(s.data() + r.off, r.len, true);
    if (rc != 0) break;
  }
  if (rc == EINVAL) {  // no MADV_POPULATE_WRITE (kernel < 5.14): everything now, as before
    want = bytes;
    rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc == 0) touchPages(s.data(), bytes);
  }
  ::close(fd);
  if (rc != 0)
    RR_THROW(Error, "cannot allocate ", (want + 1023) >> 10, " KiB of shared memory for ", name, ": ",
             std::strerror(rc == EFAULT ? ENOSPC : rc),
             " (/dev/shm is full or too small: free it, destroy groups no longer used, enlarge it "
             "(docker --shm-size), or set RINGREDUCE_TRANSPORT=tcp)");
  return s;
}

bool Segment::populate(const Range& r, bool write) {
  RR_CHECK(r.off % 4096 == 0 && r.off + r.len <= size_,
           "page-aligned range within the segment: ", r.off, " + ", r.len, " of ", size_);
  const int rc = populateRange(data() + r.off, r.len, write);
  if (rc == 0) return true;
  if (rc == EINVAL) {  // old kernel: its owner allocated the whole segment at create
    touchPages(data() + r.off, r.len);
    return true;
  }
  if (rc == EFAULT || rc == ENOMEM) {  // /dev/shm is full (the fault would have been SIGBUS)
    if (write) release(r);
    return false;
  }
  RR_THROW(Error, "cannot fault in shared memory segment ", name_, ": ", std::strerror(rc));
}

void Segment::release(const Range& r) {
  if (owner_ && r.len) ::madvise(data() + r.off, r.len, MADV_REMOVE);  // best effort
}

Segment Segment::open(const std::string& name, size_t bytes) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    RR_THROW(Error, "cannot open peer shared memory segment ", name, ": ", std::strerror(errno),
             " (are the ranks in different containers with private /dev/shm? set "
             "RINGREDUCE_TRANSPORT=tcp)");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    ::close(fd);
    RR_THROW(Error, "peer shared memory segment ", name, " has the wrong size (",
             static_cast<long long>(st.st_size), " bytes, expected ", bytes,
             "): are all ranks running the same ringreduce version and settings?");
  }
  // Not MAP_POPULATE: it would allocate the ranges the owner left unallocated.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) RR_THROW(Error, "mmap of ", name, " failed: ", std::strerror(errno));
  Segment s;
  s.addr_ = p;
  s.size_ = bytes;
  s.name_ = name;
  return s;
}

size_t capacityBytes() {
  struct statvfs st {};
  if (::statvfs("/dev/shm", &st) != 0) return 0;
  return static_cast<size_t>(st.f_blocks) * static_cast<size_t>(st.f_frsize);
}

void Segment::unlink() {
  if (owner_ && linked_) {
    ::shm_unlink(name_.c_str());
    linked_ = false;
  }
}

}  // namespace rr::transport::shm
