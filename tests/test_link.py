"""Builds and runs tests/cpp/link_check.cc: streams multiplexed over one connection
(csrc/transport/tcp/link.h) -- bytes in order on several streams both ways, a stream whose
reader waits holding up no other, ends, early data, a broken link, close() flushing -- over
a Unix socket pair and loopback TCP; once plain and once under ThreadSanitizer (the pump
thread shares every stream's buffers with its user). Needs only g++."""

import shutil
import subprocess
from pathlib import Path

import _cpp_check
import pytest

SOURCES = ["csrc/core/interrupt.cc", "csrc/core/log.cc", "csrc/transport/tcp/socket.cc",
           "csrc/transport/tcp/link.cc", "csrc/transport/tcp/link_pump.cc"]


def test_link_streams(tmp_path: Path) -> None:
    exe = _cpp_check.build(tmp_path, "link_check", SOURCES, ("-O2", "-pthread"),
                           what="the link check")
    _cpp_check.run(exe)


def _has_tsan() -> bool:
    gxx = shutil.which("g++")
    if gxx is None:
        return False
    probe = subprocess.run([gxx, "-print-file-name=libtsan.so"], capture_output=True,
                           text=True, timeout=30, check=False).stdout.strip()
    return Path(probe).is_absolute() and Path(probe).exists()


@pytest.mark.cpu_heavy
@pytest.mark.skipif(not _has_tsan(), reason="g++ without libtsan (install its sanitizer "
                    "runtime) cannot build the ThreadSanitizer variant")
def test_link_streams_under_thread_sanitizer(tmp_path: Path) -> None:
    exe = _cpp_check.build(tmp_path, "link_check", SOURCES,
                           ("-O1", "-g1", "-pthread", "-fsanitize=thread"), what="the link check")
    out = _cpp_check.run(exe, {"TSAN_OPTIONS": "halt_on_error=1:exitcode=66"})
    assert "ThreadSanitizer" not in out, out[-6000:]
