"""Builds and runs tests/cpp/interrupt_check.cc: the TCP set-up waits (accepting, connecting,
the handshake) run Python's signal handlers while they wait, so Ctrl-C stops a rank whose
peer died or stopped during init or group creation at once, not after
RINGREDUCE_CONNECT_TIMEOUT. Needs only g++, not the built extension."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120
SOURCES = ["csrc/core/interrupt.cc", "csrc/core/log.cc", "csrc/transport/tcp/socket.cc",
           "tests/cpp/interrupt_check.cc"]


def test_setup_waits_are_interruptible(tmp_path: Path) -> None:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found; install a C++17 compiler to run the interrupt check")
    exe = tmp_path / "interrupt_check"
    build = subprocess.run(
        [gxx, "-std=c++17", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror",
         "-I", str(ROOT / "csrc"), *[str(ROOT / s) for s in SOURCES], "-o", str(exe)],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert build.returncode == 0, f"compiling interrupt_check failed:\n{build.stderr[-4000:]}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT_S,
                         check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and ", 0 failed" in out, f"interrupt_check failed:\n{out}"
