"""Who may run beside whom when the suite runs in parallel (pytest-xdist, the README's test
command: ``-n 4 --dist loadfile``; a plain ``pytest`` run is serial and takes no lock).

Most tests wait -- for a timeout, a heartbeat, a peer that dies -- and leave the two CPUs of
a small CI machine idle; running four files at once cuts the suite's time. Two kinds of
test must not share the machine like that:

- ``@pytest.mark.exclusive``: looks at the whole host (every ``rr-*`` name in /dev/shm), or
  its ranks' order of events holds only on an idle machine (a re-init on the same port
  while torch's store of the last one closes; a destroy() that must come before the peer's
  goodbye) -- so nothing else may run beside it (a reader-writer lock across the workers,
  writer first: once an exclusive test waits, no other test starts).
- ``@pytest.mark.cpu_heavy``: keeps both CPUs busy (5-6 ranks reducing, a compiler); at
  most one runs at a time, so the timing-sensitive waiters beside it see a load near 2.5,
  not 8.

The locks are taken around each test's whole run protocol, outside pytest-timeout's timer
(the wait for a lock is not the test's time). Lock files live in a directory the controller
makes and its workers inherit (RR_TEST_LOCK_DIR)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

_ENV = "RR_TEST_LOCK_DIR"
# Which of PORT_SLOTS ranges of test ports this pytest session hands out (_spawn.free_port):
# two sessions on one host (a developer's beside a helper's) had the same ranges, and one's
# store could take the port the other had just handed to a test ("claimed by 2 processes").
PORT_SLOT_ENV, PORT_SLOTS = "RR_TEST_PORT_SLOT", 3


def _claim_port_slot(config: Any) -> None:
    """The first range no other running session holds (a lock file held for the session;
    the kernel drops it when the session ends, however it ends), else one by process id."""
    for slot in range(PORT_SLOTS):
        f = open(os.path.join(tempfile.gettempdir(), f"rr-test-port-slot-{slot}.lock"),  # noqa: SIM115
                 "a")  # held open for the session
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        config.add_cleanup(f.close)
        os.environ[PORT_SLOT_ENV] = str(slot)
        return
    os.environ[PORT_SLOT_ENV] = str(os.getpid() % PORT_SLOTS)


def configure(config: Any) -> None:
    """Controller (or a serial session): claim a port range and make the lock directory its
    workers inherit (workers start later)."""
    if hasattr(config, "workerinput"):
        return
    if PORT_SLOT_ENV not in os.environ:
        _claim_port_slot(config)
    if _ENV in os.environ:
        return
    if getattr(config.option, "numprocesses", None):
        os.environ[_ENV] = tempfile.mkdtemp(prefix="rr-test-locks-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(_ENV), ignore_errors=True))


@contextlib.contextmanager
def held(item: Any) -> Iterator[None]:
    """The locks `item`'s marks ask for, held while it runs (none outside xdist workers)."""
    d = os.environ.get(_ENV)
    if not d or not hasattr(item.config, "workerinput"):
        yield
        return
    exclusive = item.get_closest_marker("exclusive") is not None
    heavy = item.get_closest_marker("cpu_heavy") is not None
    with contextlib.ExitStack() as stack:
        if heavy and not exclusive:  # first: a heavy test waiting here holds nothing else
            cpu = stack.enter_context(open(os.path.join(d, "cpu"), "a"))
            fcntl.flock(cpu, fcntl.LOCK_EX)
        gate = stack.enter_context(open(os.path.join(d, "gate"), "a"))
        main = stack.enter_context(open(os.path.join(d, "main"), "a"))
        if exclusive:  # hold the gate: no new test starts; then wait for the running ones
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(main, fcntl.LOCK_EX)
        else:  # pass the gate (blocks while an exclusive test waits or runs)
            fcntl.flock(gate, fcntl.LOCK_SH)
            fcntl.flock(main, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases every lock
