#include "collectives/int_avg.h"

#include <new>

#include "core/error.h"

namespace rr::collectives::intavg {

namespace {

template <typename T>
void widenSmall(const void* x, int64_t* w, size_t count) {
  const T* p = static_cast<const T*>(x);
  for (size_t i = 0; i < count; ++i) w[i] = static_cast<int64_t>(p[i]);
}

template <typename T>
void narrowSmall(const int64_t* w, void* out, size_t count, int n) {
  T* p = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(w[i] / n);  // C++: toward zero
}

// x = hi * 2^32 + lo with lo in [0, 2^32): sums of n his and los fit int64 for n < 2^31.
template <typename T>
void widenWide(const void* x, int64_t* w, size_t count) {
  const T* p = static_cast<const T*>(x);
  for (size_t i = 0; i < count; ++i) {
    w[2 * i] = static_cast<int64_t>(p[i] >> 32);  // arithmetic shift for int64
    w[2 * i + 1] = static_cast<int64_t>(static_cast<uint64_t>(p[i]) & 0xffffffffu);
  }
}

// The average of the n values is hi_sum * 2^32 + lo_sum over n. With hi_sum = q * n + r
// (0 <= r < n, floor division), it is q * 2^32 + (r * 2^32 + lo_sum) / n, whose second
// numerator is below n * 2^33 (fits for n < 2^30). Unsigned arithmetic wraps the partial
// q * 2^32 harmlessly: the true result lies between the inputs, so it fits T.
template <typename T>
void narrowWide(const int64_t* w, void* out, size_t count, int n) {
  constexpr bool kSigned = static_cast<T>(-1) < 0;
  T* p = static_cast<T*>(out);
  const int64_t nn = n;
  for (size_t i = 0; i < count; ++i) {
    const int64_t hi = w[2 * i];
    int64_t q = hi / nn, r = hi % nn;
    if (r < 0) r += nn, q -= 1;
    const uint64_t rest = (static_cast<uint64_t>(r) << 32) + static_cast<uint64_t>(w[2 * i + 1]);
    const uint64_t floorAvg = (static_cast<uint64_t>(q) << 32) + rest / static_cast<uint64_t>(nn);
    int64_t v = static_cast<int64_t>(floorAvg);
    if (kSigned && v < 0 && rest % static_cast<uint64_t>(nn) != 0) v += 1;  // toward zero
    p[i] = static_cast<T>(v);
  }
}

}  // namespace

bool applies(DataType t, ReduceOp op) {
  return op == ReduceOp::kAvg && !isFloating(t) && t != DataType::kBool;
}

size_t words(DataType t) { return t == DataType::kInt64 || t == DataType::kUInt64 ? 2 : 1; }

std::vector<int64_t> widen(DataType t, const void* x, size_t count) {
  std::vector<int64_t> w;
  try {
    w.resize(count * words(t));
  } catch (const std::bad_alloc&) {
    RR_THROW(Error, "avg of ", count, " ", toString(t), " values needs ",
             count * words(t) * sizeof(int64_t) >> 20, " MiB of scratch (integer means are "
             "exact: summed in int64) and it could not be allocated; free memory, split the "
             "buffer, or reduce with sum and divide");
  }
  switch (t) {
    case DataType::kInt8: widenSmall<int8_t>(x, w.data(), count); break;
    case DataType::kUInt8: widenSmall<uint8_t>(x, w.data(), count); break;
    case DataType::kInt16: widenSmall<int16_t>(x, w.data(), count); break;
    case DataType::kUInt16: widenSmall<uint16_t>(x, w.data(), count); break;
    case DataType::kInt32: widenSmall<int32_t>(x, w.data(), count); break;
    case DataType::kUInt32: widenSmall<uint32_t>(x, w.data(), count); break;
    case DataType::kInt64: widenWide<int64_t>(x, w.data(), count); break;
    case DataType::kUInt64: widenWide<uint64_t>(x, w.data(), count); break;
    default: break;  // not an integer type: applies() is false
  }
  return w;
}

void narrow(DataType t, const int64_t* w, void* out, size_t count, int n) {
  switch (t) {
    case DataType::kInt8: narrowSmall<int8_t>(w, out, count, n); break;
    case DataType::kUInt8: narrowSmall<uint8_t>(w, out, count, n); break;
    case DataType::kInt16: narrowSmall<int16_t>(w, out, count, n); break;
    case DataType::kUInt16: narrowSmall<uint16_t>(w, out, count, n); break;
    case DataType::kInt32: narrowSmall<int32_t>(w, out, count, n); break;
    case DataType::kUInt32: narrowSmall<uint32_t>(w, out, count, n); break;
    case DataType::kInt64: narrowWide<int64_t>(w, out, count, n); break;
    case DataType::kUInt64: narrowWide<uint64_t>(w, out, count, n); break;
    default: break;
  }
}

}  // namespace rr::collectives::intavg
