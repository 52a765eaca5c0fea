"""Build the c10d backend adapter once before the tests (about a minute the first time for
a torch build, then cached): otherwise the first multi-process test using the "ringreduce"
torch backend would spend its timeout compiling."""

from __future__ import annotations

import os
import sys

import _xdist_locks
import pytest

# torch's TCPStore names every peer it connects to or accepts by reverse DNS (getnameinfo in
# c10d's formatSockAddr, pytorch#159007): two queries per store connection, which leave the
# machine. Where the resolver drops one (this sandbox's drops ~2%), that connection stalls
# for the resolver's 5 s timeout: 3-4 inits in 100 took 5 s longer (test_reliability's
# test_init_destroy_cycles ran 30 s instead of ~5), and every multi-rank test drew such
# stalls at random. Resolve over TCP within 1 s instead: where the server refuses TCP (here)
# the lookup fails at once and torch logs the address numerically after one warning per
# process ("The hostname of the client socket cannot be retrieved"); a user's RES_OPTIONS
# is kept. Ranks inherit it.
os.environ.setdefault("RES_OPTIONS", "use-vc timeout:1 attempts:1")


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
