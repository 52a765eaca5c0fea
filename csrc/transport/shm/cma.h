// Cross-memory attach: a rank reads a local peer's private buffer with process_vm_readv,
// one copy instead of two through the shared segment (Open MPI's shared-memory transport
// does the same). Linux only, and only where the kernel lets a process read a sibling of
// the same user (no Yama ptrace_scope >= 1, no seccomp filter refusing the call): each
// rank probes every peer once, by reading a random word the peer published, and the ranks
// use it only when all of them can (collectives/shm_alltoall.cc). RINGREDUCE_CMA=0 turns
// it off.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace rr::transport::shm {

// This process's probe: the address of a word holding a random value, and that value.
uint64_t probeAddress();
uint64_t probeValue();
// Whether this process can read process `pid`'s probe word at `addr` and finds `value`.
bool canRead(pid_t pid, uint64_t addr, uint64_t value);
// Read `len` bytes at address `addr` of process `pid` into `dst`. 0, or the errno.
int readFrom(pid_t pid, uint64_t addr, void* dst, size_t len);

}  // namespace rr::transport::shm
