"""torch's ``dist.monitored_barrier`` on a ringreduce process group (torch 2.14 lets any
CPU backend run it; 2.13 only gloo): every rank checks in with rank 0, which names the
ranks that did not within the timeout -- gloo's semantics and wording -- and tells the
others the outcome. It runs through the process group's own store (torch's PrefixStore
for that group), not its connections: a barrier meant to find a missing rank must not
depend on that rank's connections."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

_KEY = "ringreduce/monitored_barrier/"


def _seconds(timeout: Any) -> float:
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _error(msg: str) -> Exception:
    import torch.distributed as dist

    return getattr(dist, "DistBackendError", RuntimeError)(msg)


def _arrived(store: Any, key: str, deadline: float) -> bool:
    """Whether `key` is set by `deadline` (monotonic): _rendezvous._appears, which polls
    check() (a store gone -- its host died -- raises, for store_used to name)."""
    from ._rendezvous import _appears

    return _appears(store, key, max(0.0, deadline - time.monotonic()))


def barrier(store: Any, prefix: str, rank: int, size: int, n: int, timeout: Any,
            wait_all: bool, group_timeout: float, world_rank: int) -> None:
    """The `n`-th monitored barrier of a process group (every rank counts its calls); keys
    under `prefix` (one per process group and init: a store reused by a later init holds
    none of them). `timeout` is rank 0's (a negative one: `group_timeout`); the others wait
    for its verdict as long as the group's collectives wait, and at least a few seconds
    longer than rank 0 -- as gloo, lest they time out first and the job ends without rank
    0's report. Nothing stays in the store once every rank has read the verdict."""
    from ._rendezvous import store_used

    if size <= 1:
        return
    secs = _seconds(timeout)
    if secs < 0:
        secs = group_timeout
    base = f"{_KEY}{prefix}{n}/"
    waited = secs if rank == 0 else max(group_timeout, secs + 5.0)
    with store_used(world_rank, "dist.monitored_barrier", store, waited):
        why = (_root(store, base, size, secs, wait_all) if rank == 0 else
               _member(store, base, rank, size, waited))
    if why:  # (raised outside store_used: torch's DistBackendError is a DistError too)
        raise _error(why)


def _root(store: Any, base: str, size: int, secs: float, wait_all: bool) -> str:
    """Rank 0: the ranks missing at the deadline ("" if none), told to the others."""
    deadline = time.monotonic() + secs
    missing = []
    for r in range(1, size):
        if _arrived(store, f"{base}{r}", deadline):
            store.delete_key(f"{base}{r}")
        else:
            missing.append(r)
            if not wait_all:
                break
    msg = ""
    if missing:
        who = (f"Rank {missing[0]}" if len(missing) == 1 and not wait_all else
               "Ranks " + ", ".join(str(r) for r in missing))
        msg = f"[Rank 0]: {who} failed to pass monitoredBarrier in {int(secs * 1000)} ms"
    store.set(f"{base}result", msg.encode())
    return msg


def _member(store: Any, base: str, rank: int, size: int, waited: float) -> str:
    """Another rank: check in, then rank 0's verdict ("": all arrived)."""
    store.set(f"{base}{rank}", b"")
    if not _arrived(store, f"{base}result", time.monotonic() + waited):
        return (f"Rank {rank} successfully reached monitoredBarrier, but rank 0 did not "
                f"confirm within {int(waited * 1000)} ms; check rank 0's logs for the "
                f"faulty rank")
    why = store.get(f"{base}result").decode(errors="replace")
    if why:
        store.delete_key(f"{base}{rank}")  # checked in late: rank 0 did not take it
    if store.add(f"{base}read", 1) == size - 1:  # the last to read clears the verdict
        store.delete_key(f"{base}result")
        store.delete_key(f"{base}read")
    return (f"Rank {rank} successfully reached monitoredBarrier, but rank 0 found: {why}"
            if why else "")
