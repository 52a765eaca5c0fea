// Standalone known-answer test for csrc/core/sha256.{h,cc}: FIPS 180-2 SHA-256
// vectors, incremental == one-shot at every split point, RFC 4231 HMAC cases 1-7.
// Build (error.h is header-only, so no other source is needed):
//   g++ -std=c++17 -O2 -Wall -Wextra -Werror -I csrc csrc/core/sha256.cc tests/cpp/sha256_check.cc
// Prints "sha256_check: N passed, M failed"; exits non-zero when M > 0.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/sha256.h"

using rr::crypto::Digest;

namespace {

int passed = 0;
int failed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

void checkHex(const std::string& got, const std::string& want, const std::string& what) {
  check(got == want, what + ": got " + got + ", want " + want);
}

std::vector<uint8_t> repeat(uint8_t b, size_t n) { return std::vector<uint8_t>(n, b); }

void testSha256Vectors() {
  const char* abc = "abc";
  checkHex(rr::crypto::toHex(rr::crypto::sha256(abc, 3)),
           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "sha256(abc)");
  const char* m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  checkHex(rr::crypto::toHex(rr::crypto::sha256(m448, std::strlen(m448))),
           "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "sha256(448-bit)");
  checkHex(rr::crypto::toHex(rr::crypto::sha256(nullptr, 0)),
           "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "sha256(empty)");

  // One million 'a': once in one call, once in uneven 997-byte pieces.
  std::vector<uint8_t> million = repeat('a', 1000000);
  const std::string wantMillion =
      "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  checkHex(rr::crypto::toHex(rr::crypto::sha256(million.data(), million.size())), wantMillion,
           "sha256(1e6 x 'a') one-shot");
  rr::crypto::Sha256 s;
  for (size_t off = 0; off < million.size(); off += 997) {
    s.update(million.data() + off, std::min<size_t>(997, million.size() - off));
  }
  checkHex(rr::crypto::toHex(s.finish()), wantMillion, "sha256(1e6 x 'a') incremental");

  // finish() resets: the same object hashes a second message from scratch.
  s.update(abc, 3);
  checkHex(rr::crypto::toHex(s.finish()),
           "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
           "sha256(abc) after reuse");
}

void testIncremental() {
  std::vector<uint8_t> msg(200);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 131 + 7);
  const Digest oneShot = rr::crypto::sha256(msg.data(), msg.size());
  // Reference value from Python's hashlib, so one-shot itself is anchored too.
  checkHex(rr::crypto::toHex(oneShot),
           "78bbb470b40e45fffa0526d26567d7d3887d082518e712cc05d0a8f4903e231b", "sha256(200 bytes)");
  for (size_t split = 0; split <= msg.size(); ++split) {
    rr::crypto::Sha256 s;
    s.update(msg.data(), split);
    s.update(msg.data() + split, msg.size() - split);
    check(s.finish() == oneShot, "split at " + std::to_string(split));
  }
  // Every prefix length (covers the 55/56/63/64/65 padding edges) hashed byte by byte.
  for (size_t len = 0; len <= msg.size(); ++len) {
    rr::crypto::Sha256 s;
    for (size_t i = 0; i < len; ++i) s.update(msg.data() + i, 1);
    check(s.finish() == rr::crypto::sha256(msg.data(), len),
          "byte-wise prefix " + std::to_string(len));
  }
}

struct HmacCase {
  int id;
  std::vector<uint8_t> key;
  std::vector<uint8_t> data;
  std::string wantHex;  // truncated to its length (test 5 is 128 bits)
};

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

void testHmac() {
  std::vector<uint8_t> key4;
  for (uint8_t b = 1; b <= 25; ++b) key4.push_back(b);
  const std::vector<HmacCase> cases = {
      {1, repeat(0x0b, 20), bytes("Hi There"),
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {2, bytes("Jefe"), bytes("what do ya want for nothing?"),
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {3, repeat(0xaa, 20), repeat(0xdd, 50),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {4, key4, repeat(0xcd, 50),
       "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {5, repeat(0x0c, 20), bytes("Test With Truncation"), "a3b6167473100ee06e0c796c2955552b"},
      {6, repeat(0xaa, 131), bytes("Test Using Larger Than Block-Size Key - Hash Key First"),
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {7, repeat(0xaa, 131),
       bytes("This is a test using a larger than block-size key and a larger than block-size "
             "data. The key needs to be hashed before being used by the HMAC algorithm."),
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const HmacCase& c : cases) {
    Digest d = rr::crypto::hmacSha256(c.key.data(), c.key.size(), c.data.data(), c.data.size());
    checkHex(rr::crypto::toHex(d).substr(0, c.wantHex.size()), c.wantHex,
             "RFC 4231 test " + std::to_string(c.id));
  }
}

void testHelpers() {
  Digest a = rr::crypto::sha256("x", 1);
  Digest b = a;
  check(rr::crypto::digestEqual(a, b), "digestEqual(equal)");
  for (size_t i : {size_t(0), size_t(17), size_t(31)}) {
    b = a;
    b[i] ^= 0x01;
    check(!rr::crypto::digestEqual(a, b), "digestEqual(differs at " + std::to_string(i) + ")");
  }
  // The truncated MACs (heartbeats: 16 bytes) go through constantTimeEqual directly.
  check(rr::crypto::constantTimeEqual(a.data(), b.data(), 0), "constantTimeEqual(n=0)");
  b = a;
  b[15] ^= 0x80;
  check(rr::crypto::constantTimeEqual(a.data(), b.data(), 15), "constantTimeEqual(prefix)");
  check(!rr::crypto::constantTimeEqual(a.data(), b.data(), 16), "constantTimeEqual(last byte)");
  Digest z{};
  z[0] = 0xab;
  z[31] = 0x0f;
  checkHex(rr::crypto::toHex(z), "ab" + std::string(60, '0') + "0f", "toHex");

  // Two 32-byte draws colliding (or being all zero) means the source is broken.
  Digest r1{}, r2{};
  try {
    rr::crypto::randomBytes(r1.data(), r1.size());
    rr::crypto::randomBytes(r2.data(), r2.size());
    rr::crypto::randomBytes(nullptr, 0);
    check(r1 != r2 && r1 != Digest{}, "randomBytes gives fresh bytes");
    std::vector<uint8_t> big(1 << 20);  // larger than one getrandom() guarantee of 256 bytes
    rr::crypto::randomBytes(big.data(), big.size());
    size_t zeros = 0;
    for (uint8_t v : big) zeros += v == 0;
    check(zeros < 8192, "randomBytes(1 MiB) looks random (" + std::to_string(zeros) + " zeros)");
  } catch (const rr::Error& e) {
    check(false, std::string("randomBytes threw: ") + e.what());
  }
}

}  // namespace

int main() {
  testSha256Vectors();
  testIncremental();
  testHmac();
  testHelpers();
  std::printf("sha256_check: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
