// (dtype, op) -> CUDA launcher tables, built from kernel_list.h. Compiled by g++ in every
// build; only the CUDA build fills in the function pointers.
#include "cuda/dispatch.h"

#include "core/error.h"
#include "cuda/launch.h"
#include "cuda/runtime.h"

namespace rr::cuda {
namespace {

#ifdef RINGREDUCE_WITH_CUDA
#define RR_FN(name) &kern::name
#else
#define RR_FN(name) nullptr
#endif

template <class Fn>
struct Slot {
  const char* name = nullptr;
  Fn fn = nullptr;
};

struct Tables {
  Slot<kern::ReduceLaunch> reduce[kNumDataTypes][kNumReduceOps];
  Slot<kern::AccumulateLaunch> accumulate[kNumDataTypes][kNumReduceOps];
  Slot<kern::DivideLaunch> divide[kNumDataTypes];
  Slot<kern::WidenLaunch> widen[kNumDataTypes];
  Slot<kern::NarrowLaunch> narrow[kNumDataTypes];
};

constexpr int idx(DataType t) { return static_cast<int>(t); }
constexpr int idx(ReduceOp op) { return static_cast<int>(op); }

Tables makeTables() {
  Tables t;
#define RR_FILL_REDUCE(tag, dt, ctype, optag, op)        \
  t.reduce[idx(DataType::dt)][idx(ReduceOp::op)] = {      \
      "reduce_" #tag "_" #optag, RR_FN(reduce_##tag##_##optag)};
  RR_CUDA_REDUCE_KERNELS(RR_FILL_REDUCE)
#undef RR_FILL_REDUCE
#define RR_FILL_ACCUMULATE(tag, dt, optag, op)           \
  t.accumulate[idx(DataType::dt)][idx(ReduceOp::op)] = {  \
      "accumulate_" #tag "_" #optag, RR_FN(accumulate_##tag##_##optag)};
  RR_CUDA_ACCUMULATE_KERNELS(RR_FILL_ACCUMULATE)
#undef RR_FILL_ACCUMULATE
#define RR_FILL_DIVIDE(tag, dt, ctype) t.divide[idx(DataType::dt)] = {"divide_" #tag, RR_FN(divide_##tag)};
  RR_CUDA_DIRECT_TYPES(RR_FILL_DIVIDE)
#undef RR_FILL_DIVIDE
#define RR_FILL_HALF(tag, dt)                                              \
  t.widen[idx(DataType::dt)] = {"widen_" #tag, RR_FN(widen_##tag)};        \
  t.narrow[idx(DataType::dt)] = {"narrow_" #tag, RR_FN(narrow_##tag)};
  RR_CUDA_HALF_TYPES(RR_FILL_HALF)
#undef RR_FILL_HALF
  // Avg reduces like sum and divides in finalize.
  for (int d = 0; d < kNumDataTypes; ++d) {
    t.reduce[d][idx(ReduceOp::kAvg)] = t.reduce[d][idx(ReduceOp::kSum)];
    t.accumulate[d][idx(ReduceOp::kAvg)] = t.accumulate[d][idx(ReduceOp::kSum)];
  }
  return t;
}

const Tables& tables() {
  static const Tables t = makeTables();
  return t;
}

void checkCodes(DataType t, ReduceOp op, const char* fn) {
  if (idx(t) >= kNumDataTypes) RR_THROW(InvalidArgument, fn, ": unknown dtype code ", idx(t));
  if (idx(op) >= kNumReduceOps) RR_THROW(InvalidArgument, fn, ": unknown reduce op code ", idx(op));
}

void checkPointers(const void* a, const void* b, size_t n, const char* fn) {
  if (n > 0 && (a == nullptr || b == nullptr)) {
    RR_THROW(InvalidArgument, fn, ": null device buffer for ", n, " elements");
  }
}

// The launcher in `slot`, or an error saying why there is none.
template <class Fn>
Fn launcher(const Slot<Fn>& slot, const char* fn, DataType t, ReduceOp op) {
  if (slot.name == nullptr) {
    RR_THROW(InvalidArgument, fn, ": no CUDA kernel for ", toString(t), " ", toString(op));
  }
  if (slot.fn == nullptr) {
    requireDevice(0);  // throws the "built without CUDA" explanation in a CPU build
    RR_THROW(CudaUnavailable, fn, ": kernel ", slot.name, " is not in this build");
  }
  return slot.fn;
}

}  // namespace

std::vector<KernelInfo> kernelTable() {
  const Tables& t = tables();
  std::vector<KernelInfo> out;
  for (int d = 0; d < kNumDataTypes; ++d) {
    const DataType dt = static_cast<DataType>(d);
    const bool half = isHalf(dt);
    for (int o = 0; o < kNumReduceOps; ++o) {
      const ReduceOp op = static_cast<ReduceOp>(o);
      const char* stepName = half ? t.accumulate[d][o].name : t.reduce[d][o].name;
      const bool stepLinked = half ? t.accumulate[d][o].fn != nullptr : t.reduce[d][o].fn != nullptr;
      if (stepName == nullptr) continue;
      KernelInfo k{dt, op, accumulateType(dt), stepName, "", "", stepLinked};
      if (half) {
        k.finalizeKernel = t.narrow[d].name;
        k.widenKernel = t.widen[d].name;
        k.compiled = k.compiled && t.narrow[d].fn && t.widen[d].fn;
      } else if (op == ReduceOp::kAvg) {
        k.finalizeKernel = t.divide[d].name;
        k.compiled = k.compiled && t.divide[d].fn;
      }
      out.push_back(std::move(k));
    }
  }
  return out;
}

bool supports(DataType t, ReduceOp op) {
  if (idx(t) >= kNumDataTypes || idx(op) >= kNumReduceOps) return false;
  const Tables& tb = tables();
  return (isHalf(t) ? tb.accumulate[idx(t)][idx(op)].name : tb.reduce[idx(t)][idx(op)].name) !=
         nullptr;
}

void reduce(DataType t, ReduceOp op, void* dst, const void* src, size_t n, void* stream) {
  checkCodes(t, op, "cuda::reduce");
  if (isHalf(t)) {
    RR_THROW(InvalidArgument, "cuda::reduce: ", toString(t),
             " is reduced in float32; use cuda::accumulate() or widen() it first");
  }
  checkPointers(dst, src, n, "cuda::reduce");
  if (n == 0) return;  // zero-size is a no-op everywhere, even without CUDA
  auto fn = launcher(tables().reduce[idx(t)][idx(op)], "cuda::reduce", t, op);
  check(fn(dst, src, n, stream), "cuda::reduce kernel launch");
}

void accumulate(DataType t, ReduceOp op, float* acc, const void* src, size_t n, void* stream) {
  checkCodes(t, op, "cuda::accumulate");
  if (!isHalf(t)) {
    RR_THROW(InvalidArgument, "cuda::accumulate: ", toString(t),
             " is not a 16-bit float; use cuda::reduce()");
  }
  checkPointers(acc, src, n, "cuda::accumulate");
  if (n == 0) return;
  auto fn = launcher(tables().accumulate[idx(t)][idx(op)], "cuda::accumulate", t, op);
  check(fn(acc, src, n, stream), "cuda::accumulate kernel launch");
}

void widen(DataType t, const void* src, float* dst, size_t n, void* stream) {
  checkCodes(t, ReduceOp::kSum, "cuda::widen");
  if (!isHalf(t)) {
    RR_THROW(InvalidArgument, "cuda::widen: ", toString(t),
             " is not a 16-bit float (only float16 and bfloat16 are widened)");
  }
  checkPointers(src, dst, n, "cuda::widen");
  if (n == 0) return;
  auto fn = launcher(tables().widen[idx(t)], "cuda::widen", t, ReduceOp::kSum);
  check(fn(src, dst, n, stream), "cuda::widen kernel launch");
}

void finalize(DataType t, ReduceOp op, int world, const void* acc, void* dst, size_t n,
              void* stream) {
  checkCodes(t, op, "cuda::finalize");
  if (world < 1) RR_THROW(InvalidArgument, "cuda::finalize: world size must be >= 1, got ", world);
  checkPointers(acc, dst, n, "cuda::finalize");
  const int divisor = op == ReduceOp::kAvg ? world : 1;
  const Tables& tb = tables();
  if (isHalf(t)) {
    if (n > 0 && acc == dst) {
      RR_THROW(InvalidArgument, "cuda::finalize: ", toString(t),
               " needs a float32 accumulator separate from the output");
    }
    if (n == 0) return;
    auto fn = launcher(tb.narrow[idx(t)], "cuda::finalize", t, op);
    check(fn(static_cast<const float*>(acc), dst, n, divisor, stream),
          "cuda::finalize kernel launch");
    return;
  }
  if (divisor == 1) {  // a copy, bit for bit (x / 1 would quiet a signalling NaN)
    if (n > 0 && acc != dst) memcpyAsync(dst, acc, n * elementSize(t), stream);
    return;
  }
  if (n == 0) return;
  auto fn = launcher(tb.divide[idx(t)], "cuda::finalize", t, op);
  check(fn(acc, dst, n, divisor, stream), "cuda::finalize kernel launch");
}

}  // namespace rr::cuda
