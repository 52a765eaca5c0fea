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


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world,transport", [(2, "shm"), (3, "tcp")])
def test_a_slot_rewritten_inside_a_fast_call(world: int, transport: str) -> None:
    """The world's slot rewritten while a fast call ran Python code before using the capsule
    it had read (here: a collection's callback): the call now holds what it read. Python's
    debug allocator overwrites freed memory, so a freed capsule is no capsule (its memory,
    reused at once for the next one, had passed for it)."""
    calls = 3000
    outs = run_world(world, "fastcall_workers:slot_rewritten_by_a_collection", calls,
                     timeout=60, env={"PYTHONMALLOC": "malloc_debug",
                                      "RINGREDUCE_TRANSPORT": transport})
    for o in outs:
        assert o["wrong"] == 0 and o["fast"] >= calls and o["rewrites"] > 10, o
