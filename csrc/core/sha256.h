// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), dependency-free, for the
// connection handshake: each side proves knowledge of the per-job secret by
// answering a random challenge with HMAC(secret, challenge || context).
// Not a general crypto library: no side-channel hardening beyond digestEqual.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rr::crypto {

using Digest = std::array<uint8_t, 32>;

// Incremental hasher. Not thread-safe; one instance per thread.
class Sha256 {
 public:
  Sha256();
  // data may be null when n == 0.
  void update(const void* data, size_t n);
  // Returns the digest of everything passed to update() and resets the hasher to
  // its freshly constructed state, so it can be reused for a new message.
  Digest finish();

 private:
  void reset();
  void compress(const uint8_t* block);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t bufLen_;
  uint64_t totalLen_;  // bytes; the message length limit of 2^61 bytes is not a concern here
};

Digest sha256(const void* data, size_t n);
// Keys longer than the 64-byte block are hashed first, as RFC 2104 says.
Digest hmacSha256(const void* key, size_t keyLen, const void* msg, size_t msgLen);
// Constant-time comparison of n bytes (time does not depend on where they differ): use it
// for every MAC check, so a forger cannot learn a valid MAC byte by byte from timing.
bool constantTimeEqual(const void* a, const void* b, size_t n);
// constantTimeEqual of two digests.
bool digestEqual(const Digest& a, const Digest& b);
// n cryptographically random bytes from getrandom(2) (fallback /dev/urandom);
// throws rr::Error on failure. Blocks only until the kernel pool is initialised.
void randomBytes(void* out, size_t n);
// Lower-case hex, 64 characters.
std::string toHex(const Digest& d);

}  // namespace rr::crypto
