"""Build and run the standalone checks in tests/cpp: each is a C++ program over a few of
csrc's files (no extension, no Python) that prints "<name>: N passed, M failed" and exits
non-zero on a failure. Only g++ is needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120
BUILD_TIMEOUT_S = 3 * TIMEOUT_S
WARNINGS = ("-Wall", "-Wextra", "-Werror")


def build(out_dir: Path, name: str, sources: Sequence[str], flags: Sequence[str] = ("-O2",),
          what: str = "") -> Path:
    """Compile tests/cpp/<name>.cc with `sources` (paths from the repository root) into
    out_dir; skips when g++ is missing (`what`: the check, for the skip's reason)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip(f"g++ not found; install a C++17 compiler to run {what or name}")
    exe = out_dir / name
    srcs = [ROOT / s for s in sources] + [ROOT / f"tests/cpp/{name}.cc"]
    objs = [out_dir / f"{name}.{i}.o" for i in range(len(srcs))]

    def compile_one(src: Path, obj: Path) -> subprocess.CompletedProcess:
        return subprocess.run([gxx, "-std=c++17", *flags, *WARNINGS, "-I", str(ROOT / "csrc"),
                               "-c", str(src), "-o", str(obj)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)

    # One compiler per CPU (the sanitized fuzzer took ~60 s on one of two, in the slot that
    # lets one cpu_heavy test run at a time), then one link with the same flags.
    with ThreadPoolExecutor(max(1, min(len(srcs), len(os.sched_getaffinity(0))))) as pool:
        done = list(pool.map(compile_one, srcs, objs))
    for d in done:
        assert d.returncode == 0, f"compiling {name} failed:\n{d.stderr[-4000:]}"
    link = subprocess.run([gxx, *flags, *map(str, objs), "-o", str(exe)], capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert link.returncode == 0, f"linking {name} failed:\n{link.stderr[-4000:]}"
    return exe


def run(exe: Path, env: dict[str, str] | None = None) -> str:
    """Run a built check; assert it passed everything. Returns its output."""
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False, env=None if env is None else {**os.environ, **env})
    out = done.stdout + done.stderr
    assert done.returncode == 0 and f"{exe.name}:" in out and ", 0 failed" in out, \
        f"{exe.name} failed (exit {done.returncode}):\n{out[-6000:]}"
    return out
