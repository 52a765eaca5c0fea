"""The test harness's own guarantees: ports handed to tests (_spawn.free_port) never overlap
between the workers of one session nor between two pytest sessions running at once on the
host (a developer's beside a helper's used to share them: "claimed by 2 processes")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import _spawn
import _xdist_locks
import pytest

TESTS = Path(__file__).resolve().parent


def _block(monkeypatch: pytest.MonkeyPatch, slot: int, workers: int, worker: int) -> range:
    monkeypatch.setenv(_xdist_locks.PORT_SLOT_ENV, str(slot))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    first, length = _spawn._port_block()
    return range(first, first + length)


@pytest.mark.parametrize("workers", [1, 2, 4, 8])
def test_port_blocks_are_disjoint_and_below_the_ephemeral_range(
        monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    blocks = [_block(monkeypatch, s, workers, w)
              for s in range(_xdist_locks.PORT_SLOTS) for w in range(workers)]
    ports = [p for b in blocks for p in b]
    assert len(ports) == len(set(ports))
    assert min(ports) >= 10000 and max(ports) < 32768  # Linux's ephemeral range starts there
    assert min(len(b) for b in blocks) >= 800  # room for a worker's tests before reuse
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    port = _spawn.free_port()
    assert port in _block(monkeypatch, int(os.environ[_xdist_locks.PORT_SLOT_ENV]), 1, 0)


def test_a_second_session_claims_another_port_range() -> None:
    """This session holds its range's lock; a session started beside it (here: the claim
    run in a new process without the inherited choice) takes another."""
    mine = os.environ.get(_xdist_locks.PORT_SLOT_ENV)
    assert mine is not None  # conftest's pytest_configure claimed one
    env = {k: v for k, v in os.environ.items() if k != _xdist_locks.PORT_SLOT_ENV}
    code = ("import os, types, _xdist_locks as x; "
            "x._claim_port_slot(types.SimpleNamespace(add_cleanup=lambda f: None)); "
            "print(os.environ[x.PORT_SLOT_ENV])")
    out = subprocess.run([sys.executable, "-c", code], cwd=TESTS, env=env, timeout=60,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() != mine, (mine, out.stdout)
