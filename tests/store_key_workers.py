"""Rank-side code of tests/test_groups.py's store tests: groups made and destroyed over and
over leave the job's store as they found it (each group checked against numpy first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import ringreduce as rr
from ringreduce import _state


def _summed(g: rr.Group, fails: list, what: str) -> None:
    me = rr.get_rank()
    x = (np.arange(37) * 3 + me * 11).astype(np.int64)
    rr.allreduce(x, group=g)
    want = sum((np.arange(37) * 3 + r * 11).astype(np.int64) for r in g.ranks)
    if not np.array_equal(x, want):
        fails.append(f"{what}: allreduce {x[:4]} != {want[:4]}")


def _counted_alone(count: Callable[[], int | None], barrier: Callable[[], Any]) -> int | None:
    """The store's key count, taken with every rank held on both sides: no rank is still
    writing keys of what came before (a destroy()), nor already writing keys of what comes
    next (a fast rank's next group; its farewell, a "bye" key, when it leaves)."""
    barrier()
    n = count()
    barrier()
    return n


def groups_made_and_destroyed(rank: int, world: int, rounds: int = 3) -> dict:
    """new_group of several shapes (all, one rank, odd ranks, the ends, all but 0), a split,
    one destroyed at once and one carrying send/recv, `rounds` times: each checked, then
    destroyed. Returns the store's key count
    before and after (the same store: one TCPStore for the job; None at world size 1,
    which has no store)."""
    store = _state._DEFAULT[0].store

    def count() -> int | None:
        return None if store is None else store.num_keys()
    shapes = [list(range(world)), [world - 1], list(range(1, world, 2)),
              sorted({0, world - 1}), list(range(1, world))]
    fails: list = []
    before = _counted_alone(count, rr.barrier)
    for i in range(rounds):
        live = []
        for members in shapes:
            g = rr.new_group(members) if members else None
            if g is not None:
                _summed(g, fails, f"round {i} {members}")
                live.append(g)
        top = rr.new_group()
        part = top.split(rank % 2, key=-rank)
        _summed(part, fails, f"round {i} split")
        if part.ranks != sorted(range(rank % 2, world, 2), reverse=True):
            fails.append(f"round {i} split: ranks {part.ranks}")
        rr.barrier()  # every rank outside a group has left its note there before it goes
        for g in (*live, part, top):
            g.destroy()
        # destroyed as soon as made (a member may still be finishing its creation: its keys
        # were kept for good), and a group's point-to-point channels ("want" keys were)
        rr.new_group().destroy()
        ring = rr.new_group()
        if world > 1:
            x, got = np.full(3, 7.0 * rank + i), np.zeros(3)
            w = rr.isend(x, dst=(rank + 1) % world, group=ring)
            rr.recv(got, src=(rank - 1) % world, group=ring)
            w.wait()
            if not (got == 7.0 * ((rank - 1) % world) + i).all():
                fails.append(f"round {i} ring: {got}")
        ring.destroy()
    after = _counted_alone(count, rr.barrier)
    return {"fails": fails, "before": before, "after": after}


def torch_groups_made_and_destroyed(rank: int, world: int, rounds: int = 3) -> dict:
    """The same through torch: dist.new_group / destroy_process_group(group) on the
    "ringreduce" backend. What stays: each torch group's per-member generation counter
    (groups.from_store: torch's group names restart with each default group)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    store = dist.distributed_c10d._get_default_store()
    shapes = [list(range(world)), [world - 1], sorted({0, world - 1})]
    fails: list = []
    before = _counted_alone(store.num_keys, dist.barrier)
    for i in range(rounds):
        for members in shapes:
            pg = dist.new_group(members)
            if rank in members:
                t = torch.arange(6, dtype=torch.int64) + 5 * rank
                dist.all_reduce(t, group=pg)
                want = sum(torch.arange(6, dtype=torch.int64) + 5 * r for r in members)
                if not torch.equal(t, want):
                    fails.append(f"round {i} {members}: {t.tolist()} != {want.tolist()}")
            dist.destroy_process_group(pg)
    after = _counted_alone(store.num_keys, dist.barrier)
    counters = rounds * sum(len(m) for m in shapes if len(m) > 1)
    dist.destroy_process_group()
    return {"fails": fails, "before": before, "after": after, "counters": counters}
