"""Builds and runs tests/cpp/sha256_check.cc, the known-answer test for the handshake's
SHA-256 / HMAC-SHA256 (csrc/core/sha256.cc). Needs only g++, not the built extension."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120


def test_sha256_known_answers(tmp_path: Path) -> None:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found; install a C++17 compiler to run the SHA-256 check")
    exe = tmp_path / "sha256_check"
    build = subprocess.run(
        [gxx, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(ROOT / "csrc"),
         str(ROOT / "csrc/core/sha256.cc"), str(ROOT / "tests/cpp/sha256_check.cc"),
         "-o", str(exe)],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )
    assert build.returncode == 0, f"compiling sha256_check failed:\n{build.stderr}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=TIMEOUT_S,
                         check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"sha256_check failed:\n{out}"
    assert "sha256_check:" in out and ", 0 failed" in out, out
