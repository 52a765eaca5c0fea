#include "core/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>
#if defined(__linux__) && __has_include(<sys/random.h>)
#include <sys/random.h>
#define RR_HAVE_GETRANDOM 1
#endif

#include "core/error.h"

namespace rr::crypto {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

constexpr size_t kBlock = 64;

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t loadBE32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

inline void storeBE32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}

// Zeroes key-derived scratch in a way the optimiser may not drop.
void wipe(void* p, size_t n) {
  volatile uint8_t* v = static_cast<volatile uint8_t*>(p);
  while (n--) *v++ = 0;
}

}  // namespace

Sha256::Sha256() { reset(); }

void Sha256::reset() {
  static constexpr uint32_t kInit[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(h_, kInit, sizeof(h_));
  std::memset(buf_, 0, sizeof(buf_));
  bufLen_ = 0;
  totalLen_ = 0;
}

void Sha256::compress(const uint8_t* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) w[i] = loadBE32(block + 4 * i);
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3];
  uint32_t e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d;
  h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
}

void Sha256::update(const void* data, size_t n) {
  if (n == 0) return;  // data may be null; memcpy(null, 0) is UB
  const uint8_t* p = static_cast<const uint8_t*>(data);
  totalLen_ += n;
  if (bufLen_ > 0) {
    size_t take = std::min(n, kBlock - bufLen_);
    std::memcpy(buf_ + bufLen_, p, take);
    bufLen_ += take;
    p += take;
    n -= take;
    if (bufLen_ < kBlock) return;
    compress(buf_);
    bufLen_ = 0;
  }
  for (; n >= kBlock; p += kBlock, n -= kBlock) compress(p);
  if (n > 0) {
    std::memcpy(buf_, p, n);
    bufLen_ = n;
  }
}

Digest Sha256::finish() {
  const uint64_t bits = totalLen_ * 8;
  // Pad: 0x80, zeros up to 56 mod 64, then the 64-bit big-endian bit length.
  uint8_t pad[kBlock + 8] = {0x80};
  size_t padLen = (bufLen_ < 56 ? 56 : 56 + kBlock) - bufLen_;
  for (int i = 0; i < 8; ++i) pad[padLen + i] = uint8_t(bits >> (56 - 8 * i));
  update(pad, padLen + 8);
  Digest out;
  for (int i = 0; i < 8; ++i) storeBE32(out.data() + 4 * i, h_[i]);
  reset();
  return out;
}

Digest sha256(const void* data, size_t n) {
  Sha256 s;
  s.update(data, n);
  return s.finish();
}

Digest hmacSha256(const void* key, size_t keyLen, const void* msg, size_t msgLen) {
  uint8_t k[kBlock] = {};
  if (keyLen > kBlock) {
    Digest kd = sha256(key, keyLen);
    std::memcpy(k, kd.data(), kd.size());
    wipe(kd.data(), kd.size());
  } else if (keyLen > 0) {
    std::memcpy(k, key, keyLen);
  }
  uint8_t pad[kBlock];
  for (size_t i = 0; i < kBlock; ++i) pad[i] = k[i] ^ 0x36;
  Sha256 inner;
  inner.update(pad, kBlock);
  inner.update(msg, msgLen);
  Digest innerDigest = inner.finish();
  for (size_t i = 0; i < kBlock; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256 outer;
  outer.update(pad, kBlock);
  outer.update(innerDigest.data(), innerDigest.size());
  wipe(k, sizeof(k));
  wipe(pad, sizeof(pad));
  return outer.finish();
}

bool constantTimeEqual(const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  volatile uint8_t diff = 0;  // volatile: keep the compiler from short-circuiting the loop
  for (size_t i = 0; i < n; ++i) diff = diff | (x[i] ^ y[i]);
  return diff == 0;
}

bool digestEqual(const Digest& a, const Digest& b) {
  return constantTimeEqual(a.data(), b.data(), a.size());
}

void randomBytes(void* out, size_t n) {
  uint8_t* p = static_cast<uint8_t*>(out);
#ifdef RR_HAVE_GETRANDOM
  while (n > 0) {
    ssize_t got = ::getrandom(p, n, 0);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else if (got < 0 && errno == ENOSYS) {
      break;  // pre-3.17 kernel: fall back to /dev/urandom below
    } else {
      RR_THROW(Error, "getrandom failed: ", std::strerror(errno));
    }
  }
  if (n == 0) return;
#endif
  int fd;
  do {
    fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) RR_THROW(Error, "cannot open /dev/urandom: ", std::strerror(errno));
  while (n > 0) {
    ssize_t got = ::read(fd, p, n);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      int err = got == 0 ? EIO : errno;
      ::close(fd);
      RR_THROW(Error, "reading /dev/urandom failed: ", std::strerror(err));
    }
  }
  ::close(fd);
}

std::string toHex(const Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(2 * d.size(), '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 0xf];
  }
  return s;
}

}  // namespace rr::crypto
