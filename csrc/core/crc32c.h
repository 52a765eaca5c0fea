// CRC32C (Castagnoli) of a buffer: SSE4.2 crc32 instructions when the CPU has them (chosen
// at run time), a table otherwise. Used for the optional payload checksum
// (RINGREDUCE_CHECKSUM=1).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rr {
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
}
