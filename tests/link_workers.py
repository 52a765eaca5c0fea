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


def concurrent_channels(rank: int, world: int, rounds: int = 3, tags: int = 6) -> dict:
    """Each round, isend to the next rank and irecv from the previous on `tags` new tags at
    once: their channels are set up on helper threads at the same time, over the shared
    links. Before, the two processes of a pair could disagree on whether a link existed (one
    had added it, the other not yet) and one waited for a connection never made until
    RINGREDUCE_CONNECT_TIMEOUT (found by a helper: 5 runs in 6 at 3 ranks)."""
    import time

    import ringreduce as rr

    fails: list = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t0 = time.monotonic()
    for rnd in range(rounds):
        works, got = [], []
        for tag in range(1 + rnd * tags, 1 + (rnd + 1) * tags):
            works.append(rr.isend(np.full(5, 1000.0 * rank + tag, np.float32), dst=nxt, tag=tag))
            got.append((tag, np.zeros(5, np.float32)))
            works.append(rr.irecv(got[-1][1], src=prv, tag=tag))
        for w in works:
            w.wait()
        fails += [f"round {rnd} tag {t}: {y[0]} != {1000.0 * prv + t}" for t, y in got
                  if not np.all(y == 1000.0 * prv + t)]
    links = rr.world_group().links
    return {"fails": fails, "secs": time.monotonic() - t0,
            "links": len(links) if links is not None else -1}
