"""Workers for tests/test_group_links.py: groups over the links their processes share
(the default, RINGREDUCE_GROUP_LINKS=1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ringreduce import _fds


def _checked_allreduce(rr: Any, g: Any, salt: int) -> list:
    x = np.arange(1000, dtype=np.float64) * (g.rank + 1) + salt
    rr.allreduce(x, group=g)
    want = np.arange(1000, dtype=np.float64) * sum(range(1, g.size + 1)) + salt * g.size
    return [] if np.array_equal(x, want) else [f"allreduce on {g.name}: {x[:4]} != {want[:4]}"]


def sockets_per_group(rank: int, world: int) -> dict:
    """TCP sockets this process holds with the world (the harness's), after a first group,
    and after three more live groups of every rank (each checked with an all-reduce)."""
    import ringreduce as rr

    fails: list = []
    counts = [_fds.tcp_sockets()]
    groups = []
    for i in range(4):
        g = rr.new_group(list(range(world)))
        groups.append(g)
        fails += _checked_allreduce(rr, g, i)
        counts.append(_fds.tcp_sockets())
    links = rr.world_group().links
    made = len(links) if links is not None else -1
    for g in groups:
        g.destroy()
    return {"fails": fails, "counts": counts, "links": made}


def two_threads(rank: int, world: int) -> list:
    """Two overlapping groups used at once from two threads: 8 MiB all-reduces, each group's
    streams on the same links."""
    import threading

    import ringreduce as rr

    fails: list = []
    a = rr.new_group(list(range(world)))
    b = rr.new_group(list(range(world)))

    def run(g: Any, salt: int) -> None:
        for i in range(6):
            x = np.full(1 << 20, float(g.rank + salt + i))
            rr.allreduce(x, group=g)
            want = sum(float(r + salt + i) for r in range(g.size))
            if not np.all(x == want):
                fails.append(f"{g.name} round {i}: {x[0]} != {want}")

    ts = [threading.Thread(target=run, args=(g, s)) for g, s in ((a, 1), (b, 100))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(100)
    fails += [f"thread {i} still running" for i, t in enumerate(ts) if t.is_alive()]
    if not any(t.is_alive() for t in ts):
        a.destroy()
        b.destroy()
    return fails
