"""Build the c10d backend adapter once before the tests (about a minute the first time for
a torch build, then cached): otherwise the first multi-process test using the "ringreduce"
torch backend would spend its timeout compiling."""

from __future__ import annotations

import os
import sys

import _xdist_locks
import pytest

# torch's TCPStore names every peer it connects to or accepts by reverse DNS (getnameinfo in
# c10d's formatSockAddr, pytorch#159007): two queries per store connection. This machine's
# resolver drops ~2% of them, and each drop stalled that connection for the resolver's 5 s
# timeout: 3-4 inits in 100 took 5 s longer (test_reliability's init/destroy cycles ran 30 s
# instead of ~5), and multi-rank tests drew such stalls at random. A 1 s timeout with three
# tries bounds a drop at 1 s, and a failed lookup (then torch warns and logs numbers) at
# 1 in ~10^5. A user's RES_OPTIONS is kept; ranks inherit it.
os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:3")


def pytest_sessionstart(session) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from ringreduce import _c10d_build

    mod, why = _c10d_build.load()
    if mod is None:
        print(f"\nringreduce: c10d adapter unavailable: {why}", file=sys.stderr)


def pytest_configure(config) -> None:
    _xdist_locks.configure(config)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    with _xdist_locks.held(item):
        yield
