"""Workers for tests/test_lazy.py: what a rank keeps open in a sparse (lazy) communicator."""

from __future__ import annotations

import resource

import numpy as np

import ringreduce as rr
from ringreduce import _C, _state


def links(rank: int, world: int) -> dict:
    """link_stats before and after collectives that need peers outside the overlay."""
    comm = _state.current().comm
    before = comm.link_stats()
    x = np.full(7, rank + 1.0, np.float32)
    rr.allreduce(x)  # ring/tree partners: within the overlay
    assert np.allclose(x, world * (world + 1) / 2), x
    after_allreduce = comm.link_stats()
    root = world - 2
    out = rr.gather(np.array([rank], np.int64), dst=root)
    if rank == root:
        assert out.ravel().tolist() == list(range(world)), out
    after_gather = comm.link_stats()
    blocks = np.arange(world * 3, dtype=np.int32) + 100 * rank
    got = np.asarray(rr.all_to_all(blocks)).ravel()
    want = np.concatenate([np.arange(3 * rank, 3 * rank + 3) + 100 * p for p in range(world)])
    assert (got == want).all(), (got, want)
    return {"overlay": _C.overlay_peers(rank, world), "before": before,
            "after_allreduce": after_allreduce, "after_gather": after_gather,
            "after_all_to_all": comm.link_stats()}


def low_fd_limit(rank: int, world: int, soft: int, hard: int) -> dict:
    """Set RLIMIT_NOFILE, then init: return the limit init left, or the error it raised."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        rr.init()
    except RuntimeError as e:
        return {"error": str(e)}
    x = np.full(3, rank + 1.0, np.float64)
    rr.allreduce(x)
    assert np.allclose(x, world * (world + 1) / 2)
    rr.destroy()
    return {"limit": list(resource.getrlimit(resource.RLIMIT_NOFILE))}
