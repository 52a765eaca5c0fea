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
        rr.barrier()  # no rank leaves (closing its links) before every rank counted
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


def torch_subgroups_alike(rank: int, world: int) -> list:
    """torch subgroups over the same ranks more than once (dist.new_group twice,
    new_subgroups then new_group, a 2-D DeviceMesh then new_subgroups): each torch group
    has a PrefixStore of its own, and the keys inside repeat for groups of one size -- the
    second group's stream on the shared links collided with the first's ("stream ... is
    already open on the link"; found by a helper). Each group all-reduces rank-dependent
    values, checked."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    fails: list = []
    made: list = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    if world >= 4:
        made.append(dist.new_subgroups(group_size=2)[0])
        made.append(dist.new_group([0, 1]))
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("rep", "shard"))
        made += [mesh["rep"].get_group(), mesh["shard"].get_group(),
                 dist.new_subgroups(group_size=2)[0]]
    for i, g in enumerate(made):
        if g is None or g == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        members = dist.get_process_group_ranks(g)
        x = torch.arange(10, dtype=torch.float64) + 100 * rank + i
        dist.all_reduce(x, group=g)
        want = torch.arange(10, dtype=torch.float64) * len(members) + sum(
            100 * m + i for m in members)
        if not torch.equal(x, want):
            fails.append(f"group {i} {members}: {x[:3].tolist()} != {want[:3].tolist()}")
    dist.destroy_process_group()
    return fails
