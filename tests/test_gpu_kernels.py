"""GPU kernels checked without a GPU: device float16/bfloat16 conversions and the CUDA
reduction kernels compiled for the host and compared bit for bit with the CPU kernels, the
.cu files compiled by nvcc, and (opt-in, RINGREDUCE_TEST_CUDA_BUILD=1) a full CUDA build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from gpu_common import _NVCC, CSRC, DTYPES, OPS, ROOT, TAGS, _py  # noqa: F401

from ringreduce import _C, gpu  # noqa: F401
from ringreduce.gpu import arrays as gpu_arrays

# ---------------------------------------------------------------------------------------
# Device float16/bfloat16 conversions, compiled for the host against reduce/half.h
# ---------------------------------------------------------------------------------------

_HALF_HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#define __device__
#define __forceinline__ inline
static inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline int __clz(uint32_t x) { return x ? __builtin_clz(x) : 32; }
#include "cuda/half_device.cuh"
#include "reduce/half.h"
int main() {
  long bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float a = rr::cuda::dev::halfToFloat((uint16_t)h), b = rr::reduce::halfToFloat((uint16_t)h);
    if (std::memcmp(&a, &b, 4)) ++bad;
    a = rr::cuda::dev::bf16ToFloat((uint16_t)h); b = rr::reduce::bf16ToFloat((uint16_t)h);
    if (std::memcmp(&a, &b, 4)) ++bad;
  }
  // Every 4099th float bit pattern, plus all patterns near the half/bfloat16 rounding
  // boundaries (low 16 bits around the halfway points) and the subnormal-half range.
  auto check = [&](uint32_t x) {
    float f; std::memcpy(&f, &x, 4);
    if (rr::cuda::dev::floatToHalf(f) != rr::reduce::floatToHalf(f)) ++bad;
    if (rr::cuda::dev::floatToBf16(f) != rr::reduce::floatToBf16(f)) ++bad;
  };
  for (uint64_t x = 0; x <= 0xFFFFFFFFull; x += 4099) check((uint32_t)x);
  for (uint32_t hi = 0; hi < 65536; hi += 7)
    for (uint32_t lo : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      check((hi << 16) | lo);
  for (uint32_t x = 0x33000000u; x <= 0x38800000u; x += 13) { check(x); check(x | 0x80000000u); }
  std::printf("%ld\n", bad);
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
def test_device_half_conversions_match_cpu_reference(tmp_path):
    src = tmp_path / "half_check.cc"
    src.write_text(_HALF_HARNESS)
    exe = tmp_path / "half_check"
    subprocess.run(["g++", "-std=c++17", "-O2", f"-I{CSRC}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True, timeout=120)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stdout + out.stderr


# ---------------------------------------------------------------------------------------
# The CUDA kernels themselves, run on the host: reduce_kernels.cuh with every (block,
# thread) of each launch executed in turn, compared bit for bit with the CPU kernels. This
# checks the real launch logic (pack/tail split, alignment choice, grid-stride indexing)
# and the element formulas; what it cannot check is the GPU's own arithmetic (NaN payloads
# differ there, see reduce_kernels.cu) -- that is test_cuda_kernels_match_cpu_semantics.
# ---------------------------------------------------------------------------------------

_EMULATE_HARNESS = r"""
// Host emulation of csrc/cuda/reduce_kernels.cuh: every (block, thread) of each launch runs
// in turn, and the results are compared bit for bit with the CPU kernels (reduce/reduce.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
struct RrDim3 {
  unsigned x = 0, y = 1, z = 1;
};
static RrDim3 blockIdx, threadIdx, blockDim, gridDim;
static inline uint32_t __float_as_uint(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline int __clz(uint32_t x) { return x ? __builtin_clz(x) : 32; }

static long gLaunches = 0;
template <class K, class... A>
int rrEmulate(K kernel, unsigned blocks, unsigned threads, A... args) {
  ++gLaunches;
  gridDim.x = blocks;
  blockDim.x = threads;
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) {
      blockIdx.x = b;
      threadIdx.x = t;
      kernel(args...);
    }
  }
  return 0;
}
#define RR_CUDA_LAUNCH(kernel, blocks, threads, stream, ...) \
  ((void)(stream), rrEmulate(kernel, blocks, threads, __VA_ARGS__))
#include "cuda/reduce_kernels.cuh"
#include "reduce/reduce.h"

using namespace rr;
namespace impl = rr::cuda::kern::impl;

static long gBad = 0, gChecks = 0;
static std::mt19937_64 gRng(12345);

template <class T>
static T randomValue() {
  if constexpr (std::is_floating_point_v<T>) {
    switch (gRng() % 10) {
      case 0: return std::numeric_limits<T>::quiet_NaN();
      case 1: return -std::numeric_limits<T>::infinity();
      case 2: return -0.0;
      case 3: return std::numeric_limits<T>::denorm_min() * static_cast<T>(gRng() % 7);
      case 4: {  // a NaN with a payload
        T v;
        if constexpr (sizeof(T) == 4) { uint32_t u = 0x7FC00000u | (gRng() & 0x3FFFFF); std::memcpy(&v, &u, 4); }
        else { uint64_t u = 0x7FF8000000000000ull | (gRng() & 0xFFFFFFFFFFFull); std::memcpy(&v, &u, 8); }
        return v;
      }
      default: return static_cast<T>((static_cast<double>(gRng() % 2000001) - 1000000.0) / 977.0);
    }
  } else {
    T v;
    uint64_t bits = gRng();
    std::memcpy(&v, &bits, sizeof(T));
    return v;
  }
}

// Buffers at a chosen misalignment (in elements) from a 64-byte boundary.
template <class T>
struct Buf {
  std::vector<unsigned char> raw;
  T* p;
  Buf(size_t n, size_t misalign) : raw((n + 16) * sizeof(T) + 128) {
    uintptr_t base = reinterpret_cast<uintptr_t>(raw.data());
    base = (base + 63) & ~uintptr_t(63);
    p = reinterpret_cast<T*>(base + misalign * sizeof(T));
  }
};

static void report(const char* what, size_t n, size_t mis, size_t i) {
  if (gBad < 10) std::printf("MISMATCH %s n=%zu misalign=%zu at %zu\n", what, n, mis, i);
  ++gBad;
}

template <class A, class B>
static void compare(const char* what, const A* x, const B* y, size_t n, size_t mis) {
  static_assert(sizeof(A) == sizeof(B));
  ++gChecks;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(x + i, y + i, sizeof(A)) != 0) { report(what, n, mis, i); return; }
  }
}

static const size_t kSizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 100, 1000, 4099};

template <class T, ReduceOp kOp>
static void checkDirect(DataType dt, const char* name) {
  for (size_t n : kSizes) {
    for (size_t mis : {0, 1, 3}) {
      for (int which = 0; which < 3; ++which) {  // 0 both aligned, 1 dst off, 2 src off
        Buf<T> d1(n, which == 1 ? mis : 0), d2(n, which == 1 ? mis : 0), s(n, which == 2 ? mis : 0);
        for (size_t i = 0; i < n; ++i) {
          d1.p[i] = d2.p[i] = randomValue<T>();
          s.p[i] = randomValue<T>();
        }
        impl::launchReduce<T, kOp>(d1.p, s.p, n, nullptr);
        reduce::getReduceFn(dt, kOp)(d2.p, s.p, n);
        compare(name, d1.p, d2.p, n, mis);
        // In place (dst == src).
        Buf<T> e1(n, mis), e2(n, mis);
        for (size_t i = 0; i < n; ++i) e1.p[i] = e2.p[i] = randomValue<T>();
        impl::launchReduce<T, kOp>(e1.p, e1.p, n, nullptr);
        reduce::getReduceFn(dt, kOp)(e2.p, e2.p, n);
        compare(name, e1.p, e2.p, n, mis);
      }
    }
  }
}

template <class T>
static void checkDivide(DataType dt, const char* name) {
  for (size_t n : kSizes) {
    for (int world : {1, 2, 3, 7}) {
      Buf<T> acc(n, 0), o1(n, 1), o2(n, 1);
      for (size_t i = 0; i < n; ++i) acc.p[i] = randomValue<T>();
      if (world == 1) {  // finalize() copies; the GPU path copies with cudaMemcpyAsync
        continue;
      }
      impl::launchDivide<T>(acc.p, o1.p, n, world, nullptr);
      reduce::finalize(dt, ReduceOp::kAvg, world, acc.p, o2.p, n);
      compare(name, o1.p, o2.p, n, 1);
    }
  }
}

template <DataType kT, ReduceOp kOp>
static void checkHalf(const char* name, ReduceOp userOp) {
  for (size_t n : kSizes) {
    for (size_t mis : {0, 1, 2}) {
      Buf<uint16_t> a(n, mis), b(n, 0), o1(n, mis), o2(n, mis);
      Buf<float> acc1(n, 0), acc2(n, 0), tmp(n, 0);
      for (size_t i = 0; i < n; ++i) {
        a.p[i] = static_cast<uint16_t>(gRng());
        b.p[i] = static_cast<uint16_t>(gRng());
        if (gRng() % 3) {  // mostly finite, moderate values so sums and products round
          a.p[i] &= 0xBFFF;
          b.p[i] &= 0xBFFF;
        }
      }
      impl::launchWiden<kT>(a.p, acc1.p, n, nullptr);
      impl::launchAccumulate<kT, kOp>(acc1.p, b.p, n, nullptr);
      const int world = userOp == ReduceOp::kAvg ? 2 : 1;
      impl::launchNarrow<kT>(acc1.p, o1.p, n, world, nullptr);
      reduce::widen(kT, a.p, acc2.p, n);
      reduce::widen(kT, b.p, tmp.p, n);
      reduce::getReduceFn(DataType::kFloat32, kOp)(acc2.p, tmp.p, n);
      reduce::finalize(kT, userOp, 2, acc2.p, o2.p, n);
      compare(name, acc1.p, acc2.p, n, mis);
      compare(name, o1.p, o2.p, n, mis);
    }
  }
}

#define RR_CHECK_DIRECT(tag, dt, ctype, optag, op) \
  checkDirect<ctype, ReduceOp::op>(DataType::dt, "reduce_" #tag "_" #optag);
#define RR_CHECK_DIVIDE(tag, dt, ctype) checkDivide<ctype>(DataType::dt, "divide_" #tag);
#define RR_CHECK_HALF(tag, dt, optag, op) \
  checkHalf<DataType::dt, ReduceOp::op>("accumulate_" #tag "_" #optag, ReduceOp::op);

int main() {
  RR_CUDA_REDUCE_KERNELS(RR_CHECK_DIRECT)
  RR_CUDA_DIRECT_TYPES(RR_CHECK_DIVIDE)
  RR_CUDA_ACCUMULATE_KERNELS(RR_CHECK_HALF)
  checkHalf<DataType::kFloat16, ReduceOp::kSum>("avg_f16", ReduceOp::kAvg);
  checkHalf<DataType::kBFloat16, ReduceOp::kSum>("avg_bf16", ReduceOp::kAvg);
  std::printf("checks=%ld launches=%ld bad=%ld\n", gChecks, gLaunches, gBad);
  return gBad != 0;
}
"""

_CPU_REDUCE_SOURCES = ["reduce/reduce.cc", "reduce/isa.cc", "reduce/kernels_scalar.cc",
                       "reduce/kernels_avx2.cc", "reduce/kernels_avx512.cc", "core/types.cc"]


@pytest.mark.cpu_heavy  # compiles
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
@pytest.mark.timeout(300)
def test_kernels_emulated_on_host_match_cpu_kernels(tmp_path):
    moved = [f for f in _CPU_REDUCE_SOURCES if not (CSRC / f).is_file()]
    assert not moved, f"CPU reduce sources moved: {moved}; update _CPU_REDUCE_SOURCES"
    src = tmp_path / "emulate.cc"
    src.write_text(_EMULATE_HARNESS)
    exe = tmp_path / "emulate"
    cmd = ["g++", "-std=c++17", "-O2", f"-I{CSRC}", "-include", "cuda/kernel_list.h", str(src),
           *[str(CSRC / f) for f in _CPU_REDUCE_SOURCES], "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "bad=0" in out.stdout and "checks=" in out.stdout


# ---------------------------------------------------------------------------------------
# nvcc: the .cu files compile (the full CUDA build is opt-in below)
# ---------------------------------------------------------------------------------------


@pytest.mark.skipif(_NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cu", ["reduce_kernels.cu", "runtime_api.cu"])
def test_cuda_sources_compile_with_nvcc(tmp_path, cu):
    obj = tmp_path / (cu + ".o")
    cmd = [_NVCC, "-std=c++17", "-O2", f"-I{CSRC}", "-DRINGREDUCE_WITH_CUDA",
           "-Xcompiler=-fPIC,-Wall,-Wextra,-Wno-unused-parameter", "-Werror=all-warnings",
           "-Xcompiler=-Werror", "-gencode", "arch=compute_80,code=sm_80",
           "-c", str(CSRC / "cuda" / cu), "-o", str(obj)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=580, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    if shutil.which("nm") and cu == "reduce_kernels.cu":
        syms = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True,
                              check=False).stdout
        for name in ("reduce_f32_sum", "accumulate_bf16_max", "narrow_f16", "divide_i64"):
            assert f"rr::cuda::kern::{name}(" in syms


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(os.environ.get("RINGREDUCE_TEST_CUDA_BUILD") != "1",
                    reason="full CUDA build takes minutes; set RINGREDUCE_TEST_CUDA_BUILD=1")
@pytest.mark.skipif(_NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")
def test_full_cuda_build_imports_and_runs_cpu_allreduce(tmp_path):
    work = tmp_path / "src"
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(
        "*.so", "build", "*.egg-info", "__pycache__", ".git", ".pytest_cache"))
    env = dict(os.environ, RINGREDUCE_CUDA="1", RINGREDUCE_CUDA_ARCH_LIST="8.0")
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=work,
                       capture_output=True, text=True, env=env, timeout=1700, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run_env = dict(os.environ, PYTHONPATH=str(work))
    probe = _py(f"""
        import ringreduce, ringreduce.gpu as g
        assert ringreduce.__file__.startswith({str(work)!r}), ringreduce.__file__
        print(g.built_with_cuda(), g.cuda_build_info()["archs"], g.cuda_status()[0])
    """, env=run_env, cwd=work)
    assert probe.returncode == 0, probe.stderr
    built, archs, _ok = probe.stdout.split()
    if gpu_arrays._gpu is not None:  # module.cc registers the GPU module: check what it reports
        assert built == "True" and archs == "sm_80"
    script = tmp_path / "allreduce.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, ringreduce as rr
        rr.init()
        x = np.full(1000, rr.get_rank() + 1, dtype=np.float32)
        rr.allreduce(x)
        assert (x == 3).all(), x[:4]
        rr.destroy()
        print("ok")
    """))
    r = subprocess.run([sys.executable, "-m", "ringreduce.run", "-n", "2", str(script)],
                       cwd=work, capture_output=True, text=True, env=run_env, timeout=120,
                       check=False)
    assert r.returncode == 0 and r.stdout.count("ok") == 2, r.stdout + r.stderr


