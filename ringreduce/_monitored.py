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
    """Whether `key` is set by `deadline` (monotonic)."""
    left = deadline - time.monotonic()
    if left <= 0:
        return bool(store.check([key]))
    try:
        store.wait([key], timedelta(seconds=left))
    except RuntimeError:  # torch's DistStoreError on a timeout (a RuntimeError)
        return bool(store.check([key]))
    return True


def barrier(store: Any, rank: int, size: int, n: int, timeout: Any, wait_all: bool,
            group_timeout: float) -> None:
    """The `n`-th monitored barrier of a process group (every rank counts its calls).
    `timeout` is rank 0's; the others wait for its verdict as long as the group's
    collectives wait (`group_timeout`), and at least a few seconds longer than rank 0 --
    as gloo, lest they time out first and the job ends without rank 0's report."""
    if size <= 1:
        return
    secs = _seconds(timeout)
    ms = int(secs * 1000)
    base = f"{_KEY}{n}/"
    if rank != 0:
        store.set(f"{base}{rank}", b"")
        waited = max(group_timeout, secs + 5.0)
        if not _arrived(store, f"{base}result", time.monotonic() + waited):
            raise _error(f"Rank {rank} successfully reached monitoredBarrier, but rank 0 did "
                         f"not confirm within {int(waited * 1000)} ms; check rank 0's logs "
                         f"for the faulty rank")
        why = store.get(f"{base}result").decode(errors="replace")
        if why:
            raise _error(f"Rank {rank} successfully reached monitoredBarrier, but rank 0 "
                         f"found: {why}")
        return
    deadline = time.monotonic() + secs
    missing = []
    for r in range(1, size):
        if not _arrived(store, f"{base}{r}", deadline):
            missing.append(r)
            if not wait_all:
                break
    if missing:
        who = (f"Rank {missing[0]}" if len(missing) == 1 and not wait_all else
               "Ranks " + ", ".join(str(r) for r in missing))
        msg = f"[Rank 0]: {who} failed to pass monitoredBarrier in {ms} ms"
        store.set(f"{base}result", msg.encode())
        raise _error(msg)
    store.set(f"{base}result", b"")
    # Every rank has read round n-1's outcome (each checked in to this one after it).
    if n > 1:
        for key in [f"{_KEY}{n - 1}/{r}" for r in range(1, size)] + [f"{_KEY}{n - 1}/result"]:
            store.delete_key(key)
