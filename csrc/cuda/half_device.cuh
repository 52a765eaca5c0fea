// float16 / bfloat16 <-> float32 conversions on the device, bit for bit the same as the CPU
// reference in reduce/half.h (round to nearest even; NaNs quieted with their top payload
// bits kept; no flush to zero). The CUDA intrinsics (__float2half_rn, ...) agree on every
// finite value but canonicalise NaNs, so they are not used: a GPU rank and a CPU rank must
// round the same float32 sum to the same 16 bits.
#pragma once

#include <cstdint>

namespace rr::cuda::dev {

__device__ __forceinline__ uint16_t floatToHalf(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (ax >= 0x38800000u) {
    uint32_t r = ax - 0x38000000u;
    r += 0x0FFFu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (ax <= 0x33000000u) return sign;
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - e;
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const uint32_t up = (rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (q + up));
}

__device__ __forceinline__ float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1Fu) {
    return __uint_as_float(sign | 0x7F800000u | (m != 0 ? 0x00400000u | (m << 13) : 0u));
  }
  if (e != 0) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return __uint_as_float(sign);
  // Subnormal: normalise with a count of leading zeros instead of half.h's loop.
  const int shift = __clz(m) - 21;  // bring bit 10 to the top of the mantissa (m < 0x400)
  m <<= shift;
  const uint32_t exp = 113u - static_cast<uint32_t>(shift);
  return __uint_as_float(sign | (exp << 23) | ((m & 0x3FFu) << 13));
}

__device__ __forceinline__ uint16_t floatToBf16(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf16ToFloat(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

}  // namespace rr::cuda::dev
