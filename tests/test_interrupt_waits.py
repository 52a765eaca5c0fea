"""Builds and runs tests/cpp/interrupt_check.cc: the TCP set-up waits (accepting, connecting,
the handshake) run Python's signal handlers while they wait, so Ctrl-C stops a rank whose
peer died or stopped during init or group creation at once, not after
RINGREDUCE_CONNECT_TIMEOUT. Needs only g++, not the built extension."""

from pathlib import Path

import _cpp_check

SOURCES = ["csrc/core/interrupt.cc", "csrc/core/log.cc", "csrc/transport/tcp/socket.cc"]


def test_setup_waits_are_interruptible(tmp_path: Path) -> None:
    exe = _cpp_check.build(tmp_path, "interrupt_check", SOURCES, ("-O1", "-pthread"),
                           what="the interrupt check")
    _cpp_check.run(exe)
