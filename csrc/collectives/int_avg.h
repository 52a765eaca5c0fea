// op=avg on integers, exactly: the sum of n integers can wrap their own type, so each value
// is added in int64 -- as it is for types up to 32 bits, split into its high and low 32 bits
// for 64-bit ones -- by one sum collective over that wider buffer, and divided once at the
// end, rounding toward zero (as NCCL's ncclAvg does on integers). The wider buffer moves 2x
// to 8x the bytes: a correctness path (counters, batch sizes), not a fast one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/types.h"

namespace rr::collectives::intavg {

// Whether `op` on `t` takes this path (avg of an integer type; bool's avg stays refused).
bool applies(DataType t, ReduceOp op);
// int64 words per element in the wide buffer (1, or 2 for 64-bit types).
size_t words(DataType t);
// x (count elements of t) -> wide (count * words(t) int64).
std::vector<int64_t> widen(DataType t, const void* x, size_t count);
// wide (summed over n ranks) -> out (count elements of t): the average, rounded toward zero.
void narrow(DataType t, const int64_t* wide, void* out, size_t count, int n);

}  // namespace rr::collectives::intavg
