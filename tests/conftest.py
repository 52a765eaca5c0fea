"""Build the c10d backend adapter once before the tests (about a minute the first time for
a torch build, then cached): otherwise the first multi-process test using the "ringreduce"
torch backend would spend its timeout compiling."""

from __future__ import annotations

import sys

import _xdist_locks
import pytest


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
