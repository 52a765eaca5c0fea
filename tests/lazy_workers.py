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


def silent_strangers(rank: int, world: int, per_rank: int) -> dict:
    """Sparse mode keeps each rank's listener open for connections made on first use. Rank
    0 opens `per_rank` connections to every listener that never say a word; then every pair
    connects (all-to-all). Those connections must not wait behind the strangers (before,
    each stranger got up to 5 s of the accept in turn: 12 of them timed the job out)."""
    import socket
    import time

    from ringreduce import _rendezvous

    w = _state.current()
    socks = []
    if rank == 0:
        p = _rendezvous._world_prefix()
        for r in range(world):
            host, port = w.store.get(f"{p}addr/{r}").decode().rsplit(":", 1)
            socks += [socket.create_connection((host.strip("[]"), int(port)))
                      for _ in range(per_rank)]
    rr.barrier()
    t0 = time.monotonic()
    blocks = np.arange(world * 3, dtype=np.int32) + 100 * rank
    got = np.asarray(rr.all_to_all(blocks)).ravel()
    want = np.concatenate([np.arange(3 * rank, 3 * rank + 3) + 100 * p for p in range(world)])
    took = time.monotonic() - t0
    rr.barrier()
    for s in socks:
        s.close()
    return {"ok": bool((got == want).all()), "took": took,
            "connections": w.comm.link_stats()["connections"]}
