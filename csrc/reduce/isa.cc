#include "reduce/isa.h"

#include <atomic>
#include <cstring>

#include "core/error.h"

namespace rr::reduce::detail {
namespace {

Isa detectIsa() {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's CPU model also checks XGETBV, so "avx512f" means the OS saves zmm state too.
  __builtin_cpu_init();
  const bool f16c = __builtin_cpu_supports("f16c");
  if (f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (f16c && __builtin_cpu_supports("avx2")) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kScalar;
}

// -1 until first use; then the active ISA. Lowered (never raised above bestIsa) by
// setMaxIsa. Relaxed is enough: every ISA computes the same bits.
std::atomic<int> gActive{-1};

}  // namespace

const char* toString(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown-isa";
}

Isa parseIsa(const char* name) {
  if (name != nullptr) {
    for (int i = 0; i < kNumIsas; ++i) {
      if (std::strcmp(name, toString(static_cast<Isa>(i))) == 0) return static_cast<Isa>(i);
    }
  }
  RR_THROW(InvalidArgument, "unknown instruction set '", name ? name : "(null)",
           "'; use one of scalar, avx2, avx512");
}

Isa bestIsa() {
  static const Isa best = detectIsa();
  return best;
}

Isa activeIsa() {
  int v = gActive.load(std::memory_order_relaxed);
  if (v < 0) {
    int expected = -1;
    gActive.compare_exchange_strong(expected, static_cast<int>(bestIsa()),
                                    std::memory_order_relaxed);
    v = gActive.load(std::memory_order_relaxed);
  }
  return static_cast<Isa>(v);
}

void setMaxIsa(Isa isa) {
  const int v = static_cast<int>(isa);
  RR_CHECK(v >= 0 && v < kNumIsas, "bad Isa value ", v);
  const int best = static_cast<int>(bestIsa());
  gActive.store(v < best ? v : best, std::memory_order_relaxed);
}

const KernelTable& kernelsFor(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(bestIsa())) {
    RR_THROW(InvalidArgument, "instruction set ", toString(isa),
             " is not supported by this CPU (best: ", toString(bestIsa()), ")");
  }
  switch (isa) {
    case Isa::kAvx512: return avx512Kernels();
    case Isa::kAvx2: return avx2Kernels();
    case Isa::kScalar: break;
  }
  return scalarKernels();
}

}  // namespace rr::reduce::detail
