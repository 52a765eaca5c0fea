"""Rank-side code of tests/test_groups.py for bad arguments to group calls."""

from __future__ import annotations

import numpy as np

import ringreduce as rr


def split_bad_color(rank: int, world: int) -> list:
    """World rank 1 passes color=-1 (NCCL_SPLIT_NOCOLOR), the last rank a key too wide for
    64 bits (world >= 3), the others good ones: every rank raises, naming those ranks, and
    the world and a following split work. Before, only the bad rank raised and the others'
    split met its next collective: "rank 1 is at barrier #4, rank 0 at allgather #4"."""
    color = -1 if rank == 1 else 0
    key = 1 << 70 if (world >= 3 and rank == world - 1) else rank
    said = []
    try:
        rr.world_group().split(color, key=key)
        said.append("no error")
    except Exception as e:  # noqa: BLE001
        said.append(f"{type(e).__name__}: {e}")
    x = np.full(5, float(rank + 1))
    rr.allreduce(x)
    said.append("allreduce ok" if np.all(x == world * (world + 1) / 2) else f"allreduce {x}")
    g = rr.world_group().split(rank % 2, key=-rank)
    members = sorted((r for r in range(world) if r % 2 == rank % 2), reverse=True)
    said.append("split ok" if g is not None and g.ranks == members else f"split {g}")
    return said


def env_changed_after_init(rank: int, world: int, name: str, value: str) -> list:
    """Rank 0 sets `name` in its environment after init (a library or a callback changing
    os.environ): groups and point-to-point channels made afterwards re-read it, so rank 0's
    group ran another algorithm (a hang till RINGREDUCE_TIMEOUT), made no shared link
    (the others crashed reading its address) or another transport (a handshake timeout) --
    found by a helper. They use what the ranks agreed on at init."""
    import os

    if rank == 0:
        os.environ[name] = value
    said = []
    g = rr.new_group(list(range(world)))
    for n in (7, 1 << 18):
        x = np.arange(n, dtype=np.float32) + rank
        rr.allreduce(x, group=g)
        want = world * np.arange(n, dtype=np.float32) + world * (world - 1) / 2
        said.append(bool(np.array_equal(x, want)))
    if world >= 2 and rank in (0, 1):
        y = np.full(1000, 5.0 if rank == 0 else 0.0, np.float32)
        (rr.send if rank == 0 else rr.recv)(y, 1 - rank)
        said.append(bool(np.all(y == 5.0)))
    return said
