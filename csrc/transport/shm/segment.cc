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

Segment Segment::create(const std::string& prefix, size_t bytes) {
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
  // Every failure below removes the name we just created (ours alone), exactly once.
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());  // leave no half-made name behind
    RR_THROW(Error, "cannot allocate ", bytes >> 10, " KiB of shared memory for ", name, ": ",
             std::strerror(rc),
             " (/dev/shm is full or too small: free it, destroy groups no longer used, enlarge it "
             "(docker --shm-size), or set RINGREDUCE_TRANSPORT=tcp)");
  }
  // Every page is already allocated and zeroed (posix_fallocate on tmpfs); MAP_POPULATE maps
  // them writable now, so no fault lands in the first collective (a memset here as well
  // cost a quarter of a 4-rank group's segment setup, for nothing).
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    int err = errno;
    ::shm_unlink(name.c_str());
    RR_THROW(Error, "mmap of ", name, " failed: ", std::strerror(err));
  }
  Segment s;
  s.name_ = name;
  s.owner_ = true;
  s.linked_ = true;
  s.addr_ = p;
  s.size_ = bytes;
  return s;
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
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
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
