// Scalar float16 / bfloat16 <-> float32 conversions, exact and branch-light.
//
// These are the reference the vector paths must match bit for bit (tests/cpp/reduce_check.cc
// compares them over every 16-bit pattern and against F16C on machines that have it):
//  - float32 -> float16: round to nearest, ties to even; overflow gives inf; results below
//    the smallest subnormal round to (signed) zero. A NaN keeps its sign and the top 10
//    payload bits and gets the quiet bit set -- exactly what VCVTPS2PH does, so the F16C
//    and software paths agree on NaNs too.
//  - float16 -> float32: exact (subnormals normalised); a NaN gets the quiet bit set and
//    keeps its payload, as VCVTPH2PS does.
//  - float32 -> bfloat16: round to nearest even on the bit pattern; a NaN is truncated and
//    gets the quiet bit, so a NaN whose payload lives only in the low 16 bits stays a NaN.
//    (AVX512_BF16's VCVTNEPS2BF16 is *not* used: it flushes subnormals to zero.)
//  - bfloat16 -> float32: exact (the bits shifted up).
// None of these read MXCSR, so FTZ/DAZ or a changed rounding mode cannot change them.
#pragma once

#include <cstdint>
#include <cstring>

namespace rr::reduce {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) {  // NaN: quiet it, keep the top of the payload
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  }
  if (ax >= 0x477FF000u) {  // >= 65520 (halfway between 65504 and 2^16) or inf
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  if (ax >= 0x38800000u) {  // result is a normal half (|f| >= 2^-14, or rounds up to it)
    uint32_t r = ax - 0x38000000u;  // rebias the exponent from 127 to 15
    r += 0x0FFFu + ((r >> 13) & 1u);  // round to nearest even on the 13 dropped bits
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) {  // |f| <= 2^-25: rounds to zero (2^-25 itself ties to even 0)
    return sign;
  }
  // Subnormal half: value = m * 2^(e - 150); in units of 2^-24 that is m >> (126 - e).
  const uint32_t e = ax >> 23;                       // 102 .. 112 here
  const uint32_t m = (ax & 0x007FFFFFu) | 0x00800000u;  // implicit bit made explicit
  const uint32_t shift = 126u - e;                   // 14 .. 24
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const uint32_t up = (rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (q + up));  // q + up == 0x400 is the smallest normal
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) {  // inf or NaN (NaN: quiet bit set, payload kept)
    return bitsFloat(sign | 0x7F800000u | (m != 0 ? 0x00400000u | (m << 13) : 0u));
  }
  if (e != 0) {
    return bitsFloat(sign | ((e + 112u) << 23) | (m << 13));
  }
  if (m == 0) {
    return bitsFloat(sign);
  }
  // Subnormal: m * 2^-24. Normalise so the leading 1 becomes the implicit bit.
  uint32_t exp = 113u;  // exponent of 2^-14, the bottom of the normal range, rebiased
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --exp;
  }
  return bitsFloat(sign | (exp << 23) | ((m & 0x3FFu) << 13));
}

inline uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16ToFloat(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

}  // namespace rr::reduce
