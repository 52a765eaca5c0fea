// The CUDA reduce kernels behind a (dtype, op) table, with the same contract as the CPU API
// in reduce/reduce.h, but enqueued on a caller-given stream instead of run in place:
//   reduce     dst OP= src on the accumulate type (16-bit floats are rejected, as on the CPU)
//   accumulate float32 acc OP= widen(src) for 16-bit src (saves a widen pass per step)
//   widen      16-bit float -> float32
//   finalize   avg division and rounding back to the user's dtype, once
// Arguments are checked before anything is enqueued (InvalidArgument, nothing launched);
// launch failures throw CudaError. Nothing here synchronises: results are ready when the
// stream reaches them. Pointers must be device memory (or managed) of the current device.
//
// kernelTable() needs no GPU and no CUDA build: it lists what the CUDA build compiles (from
// kernel_list.h) and whether this build linked it, so tests check the table everywhere.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/types.h"

namespace rr::cuda {

struct KernelInfo {
  DataType dtype;           // the user's dtype
  ReduceOp op;
  DataType accumulate;      // what partial results are reduced in
  std::string reduceKernel;    // kernel applied per step: reduce_<t>_<op> or accumulate_<t>_<op>
  std::string finalizeKernel;  // divide_<t> / narrow_<t>, or "" when finalize is a copy
  std::string widenKernel;     // widen_<t> for 16-bit floats, else ""
  bool compiled;               // true when this build linked the launchers (CUDA build)
};

// Every (dtype, op) the CUDA path serves, ordered by dtype code then op code.
std::vector<KernelInfo> kernelTable();
bool supports(DataType t, ReduceOp op);

void reduce(DataType t, ReduceOp op, void* dst, const void* src, size_t n, void* stream);
void accumulate(DataType t, ReduceOp op, float* acc, const void* src, size_t n, void* stream);
void widen(DataType t, const void* src, float* dst, size_t n, void* stream);
// acc holds n values of accumulateType(t); for avg they are divided by world; 16-bit floats
// are rounded once. acc and dst may alias unless t is a 16-bit float.
void finalize(DataType t, ReduceOp op, int world, const void* acc, void* dst, size_t n,
              void* stream);

}  // namespace rr::cuda
