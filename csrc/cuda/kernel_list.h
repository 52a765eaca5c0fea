// The one list of CUDA reduce kernels, as X-macros. reduce_kernels.cu defines a launcher
// per entry and dispatch.cc builds its (dtype, op) table from the same lists, so the table a
// CPU-only build reports (kernelTable()) names exactly what the CUDA build compiles: an entry
// here without a launcher fails to link in the CUDA build.
//
// Launchers are rr::cuda::kern::<kind>_<tag>[_<op>] (launch.h), e.g. reduce_f32_sum.
// Avg has no kernel of its own: it reduces with the sum kernel and divides once in
// finalize, exactly as the CPU path (reduce/reduce.h) does. Every dtype the CPU path
// supports is served; 16-bit floats are reduced in float32 and rounded once.
#pragma once

// dst OP= src on the accumulate type itself: X(tag, DataType, C type, op tag, ReduceOp).
#define RR_CUDA_REDUCE_KERNELS(X)       \
  X(f32, kFloat32, float, sum, kSum)     \
  X(f32, kFloat32, float, prod, kProd)   \
  X(f32, kFloat32, float, min, kMin)     \
  X(f32, kFloat32, float, max, kMax)     \
  X(f64, kFloat64, double, sum, kSum)    \
  X(f64, kFloat64, double, prod, kProd)  \
  X(f64, kFloat64, double, min, kMin)    \
  X(f64, kFloat64, double, max, kMax)    \
  X(i8, kInt8, int8_t, sum, kSum)        \
  X(i8, kInt8, int8_t, prod, kProd)      \
  X(i8, kInt8, int8_t, min, kMin)        \
  X(i8, kInt8, int8_t, max, kMax)        \
  X(u8, kUInt8, uint8_t, sum, kSum)      \
  X(u8, kUInt8, uint8_t, prod, kProd)    \
  X(u8, kUInt8, uint8_t, min, kMin)      \
  X(u8, kUInt8, uint8_t, max, kMax)      \
  X(i32, kInt32, int32_t, sum, kSum)     \
  X(i32, kInt32, int32_t, prod, kProd)   \
  X(i32, kInt32, int32_t, min, kMin)     \
  X(i32, kInt32, int32_t, max, kMax)     \
  X(i64, kInt64, int64_t, sum, kSum)     \
  X(i64, kInt64, int64_t, prod, kProd)   \
  X(i64, kInt64, int64_t, min, kMin)     \
  X(i64, kInt64, int64_t, max, kMax)

// float32 acc OP= widen(16-bit src): X(tag, DataType, op tag, ReduceOp).
#define RR_CUDA_ACCUMULATE_KERNELS(X)\
  X(f16, kFloat16, sum, kSum)      \
  X(f16, kFloat16, prod, kProd)    \
  X(f16, kFloat16, min, kMin)      \
  X(f16, kFloat16, max, kMax)      \
  X(bf16, kBFloat16, sum, kSum)    \
  X(bf16, kBFloat16, prod, kProd)  \
  X(bf16, kBFloat16, min, kMin)    \
  X(bf16, kBFloat16, max, kMax)

// Types reduced directly, which finalize() divides for avg: X(tag, DataType, C type).
#define RR_CUDA_DIRECT_TYPES(X)\
  X(f32, kFloat32, float)   \
  X(f64, kFloat64, double)  \
  X(i8, kInt8, int8_t)      \
  X(u8, kUInt8, uint8_t)    \
  X(i32, kInt32, int32_t)   \
  X(i64, kInt64, int64_t)

// 16-bit floats, with widen/narrow kernels: X(tag, DataType).
#define RR_CUDA_HALF_TYPES(X)\
  X(f16, kFloat16)    \
  X(bf16, kBFloat16)
