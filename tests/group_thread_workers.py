"""Rank-side code of tests/test_groups.py for groups made from several threads of a rank."""

from __future__ import annotations

import threading
import time

import numpy as np
from _spawn import await_flags, raise_flag

import ringreduce as rr
from ringreduce import groups


def racing_creations(rank: int, world: int) -> dict:
    """Rank 0 calls new_group on a second thread while its first thread's new_group waits
    for the last rank (late until then): the second call is refused at once (the two threads'
    groups could be numbered differently on other ranks); the first one's group works."""
    out: dict = {}
    if rank == world - 1:  # late until rank 0's racer has its answer (not a fixed time)
        await_flags(["raced"], 20)
    if rank == 0:
        def second() -> None:
            deadline = time.monotonic() + 20  # until the first thread is in new_group()
            while not groups._CREATING and time.monotonic() < deadline:
                time.sleep(0.005)
            t0 = time.monotonic()
            try:
                rr.new_group()
                out["second"] = "made"
            except RuntimeError as e:
                out["second"], out["secs"] = str(e), time.monotonic() - t0
            finally:
                raise_flag("raced")
        t = threading.Thread(target=second, name="racer")
        t.start()
    g = rr.new_group()
    x = np.full(3, float(rank + 1))
    rr.allreduce(x, group=g)
    out["sum"] = x.tolist()
    if rank == 0:
        t.join()
    g.destroy()
    return out
