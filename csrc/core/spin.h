// The busy-wait phase every wait begins with (the socket wait loop, comm/wait.cc, and the
// shared-memory one, transport/shm/domain.cc): try `ready` until it holds or `us`
// microseconds have passed, reading the clock once every `batch` tries (a read costs
// ~25 ns on a VM: as much as a try). Whether a wait spins at all, and for how long, is the
// caller's policy (Options::spinUs, Communicator::spinAllowed, ShmConfig).
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RR_CPU_RELAX() _mm_pause()
#else
#define RR_CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

namespace rr {

template <typename F>
bool spinFor(double us, int batch, F&& ready) {
  if (!(us > 0)) return false;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::nanoseconds(static_cast<int64_t>(us * 1000));
  do {
    for (int i = 0; i < batch; ++i)
      if (ready()) return true;
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

}  // namespace rr
