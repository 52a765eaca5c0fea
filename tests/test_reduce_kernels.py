"""Builds and runs tests/cpp/reduce_check.cc, the bit-exactness check of the CPU reduce
kernels (csrc/reduce): every dtype x op against a scalar reference, NaN propagation, integer
wrap-around, finalize, and exhaustive float16/bfloat16 conversions. The program is run once
per instruction set this CPU supports, with RINGREDUCE_ISA capping the public entry points
at that path. Needs only g++, not the built extension."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import _cpp_check
import pytest

# Keeps both CPUs busy (compiles the kernels once per instruction set): one such test at a time under
# pytest-xdist (tests/_xdist_locks.py).
pytestmark = pytest.mark.cpu_heavy

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 120
ALL_ISAS = ("scalar", "avx2", "avx512")


@pytest.fixture(scope="module")
def reduce_check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc/reduce").glob("*.cc"))
    return _cpp_check.build(tmp_path_factory.mktemp("reduce_check"), "reduce_check",
                            [*sources, "csrc/core/types.cc"], ("-O2",), "the reduce kernel check")


def _supported_isas(exe: Path) -> list[str]:
    out = subprocess.run([str(exe), "--list-isas"], check=False, capture_output=True,
                         text=True, timeout=RUN_TIMEOUT_S, env=_env(None))
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


# What csrc/reduce/isa.cc asks of the CPU for each path.
_CPU_FLAGS = {"avx2": {"avx2", "f16c"},
              "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c"}}


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return {w for line in f if line.startswith("flags") for w in line.split(":", 1)[1].split()}


def _env(isa: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RINGREDUCE_ISA"}
    if isa is not None:
        env["RINGREDUCE_ISA"] = isa
    return env


@pytest.mark.parametrize("isa", ALL_ISAS)
def test_reduce_kernels_bit_exact(reduce_check: Path, isa: str) -> None:
    supported = _supported_isas(reduce_check)
    assert "scalar" in supported, supported
    if isa not in supported:
        # Only where the CPU lacks it (the program under test's detection is checked against
        # the kernel's own list: a detection bug must not skip a path silently).
        missing = _CPU_FLAGS.get(isa, set()) - _cpu_flags()
        assert missing, f"the CPU has every flag the {isa} path needs, but {supported} omits it"
        pytest.skip(f"this CPU does not support the {isa} path (no {sorted(missing)})")
    run = subprocess.run([str(reduce_check)], check=False, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S, env=_env(isa))
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"reduce_check with RINGREDUCE_ISA={isa} failed:\n{out}"
    assert f"isa={isa} " in out, out
    assert "reduce_check:" in out and ", 0 failed" in out, out
