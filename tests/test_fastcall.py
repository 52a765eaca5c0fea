"""rr.barrier() and rr.allreduce(ndarray) on the world run without a Python frame
(_C.FastCall, the latency floor): results against numpy, every other call exactly as the
Python functions (errors included), a destroyed world refused, call sites still recorded."""

from __future__ import annotations

import numpy as np
import pytest
from _spawn import run_world
from _stall import late_rank_reports

import ringreduce as rr


def test_no_world() -> None:
    if rr.is_initialized():  # left by an earlier test in this process
        rr.destroy()
    assert rr.barrier.__wrapped__.__module__ == "ringreduce.api"
    with pytest.raises(RuntimeError, match="not initialised"):
        rr.barrier()
    with pytest.raises(RuntimeError, match="not initialised"):
        rr.allreduce(np.ones(2, np.float32))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,transport", [(1, "auto"), (2, "shm"), (3, "tcp"), (5, "shm")])
def test_fast_calls_match_numpy(world: int, transport: str) -> None:
    results = run_world(world, "fastcall_workers:semantics", timeout=90,
                        env={"RINGREDUCE_TRANSPORT": transport})
    for rank, bad in enumerate(results):
        assert bad == [], f"rank {rank}:\n" + "\n".join(bad)


@pytest.mark.timeout(60)
def test_destroyed_world_is_refused() -> None:
    for r in run_world(2, "fastcall_workers:after_destroy", timeout=40, init=False):
        assert r["barrier"] == r["python"] and "not initialised" in r["barrier"], r
        assert r["allreduce"] == r["python"].replace("barrier()", "allreduce()"), r


@pytest.mark.timeout(90)
def test_stall_report_names_the_fast_call_site() -> None:
    late_rank_reports("fastcall_workers:late_rank", init=True, ok=lambda v: v["sum"] == 3.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,transport", [(2, "shm"), (3, "tcp"), (4, "shm")])
def test_fast_send_recv(world: int, transport: str) -> None:
    results = run_world(world, "fastcall_workers:p2p_semantics", timeout=100,
                        env={"RINGREDUCE_TRANSPORT": transport})
    for rank, bad in enumerate(results):
        assert bad == [], f"rank {rank}:\n" + "\n".join(bad)
