"""Rank-side workers of tests/test_fuzz.py: a real job initialises while the test process
throws fuzzed handshakes at its listening ports.

The last rank holds the job in its init window: once the addresses are exchanged (every
lower rank is then in its accept loop, waiting for it), it publishes all listener addresses
to `outdir/addrs.json` for the attacker and waits for `outdir/go` before it connects. The
inputs and reference answers of the checked all-reduces come from tests/workers.py.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
from workers import compare_exact, pattern, reduce_np

import ringreduce as rr

# (dtype, op, element count): rank-dependent inputs, answers computed with numpy.
CHECKS = [("float32", "sum", 10_007), ("int64", "sum", 1_000), ("int32", "prod", 333),
          ("float64", "max", 1), ("float32", "avg", 4_096)]


def hold_init_for_attacker(rank: int, world: int, outdir: str, hold_s: float) -> dict:
    """init() with the last rank parked between the address exchange and its connects until
    the attacker writes `outdir/go` (at most `hold_s`), then checked all-reduces."""
    from ringreduce import _rendezvous

    exchange = _rendezvous.exchange
    held = {"s": 0.0}

    def exchange_then_hold(*args: Any, **kwargs: Any) -> Any:
        peers = exchange(*args, **kwargs)
        if rank == world - 1:
            tmp = os.path.join(outdir, "addrs.json.tmp")
            with open(tmp, "w") as f:
                json.dump({"tcp": list(peers.addrs)}, f)
            os.replace(tmp, os.path.join(outdir, "addrs.json"))
            t0 = time.monotonic()
            go = os.path.join(outdir, "go")
            while not os.path.exists(go) and time.monotonic() - t0 < hold_s:
                time.sleep(0.01)
            held["s"] = time.monotonic() - t0
        return peers

    _rendezvous.exchange = exchange_then_hold
    try:
        t0 = time.monotonic()
        rr.init()
        init_s = time.monotonic() - t0
    finally:
        _rendezvous.exchange = exchange
    errors: list[str] = []
    for salt, (dtype, op, n) in enumerate(CHECKS):
        x = pattern(dtype, op, rank, n, salt)
        rr.allreduce(x, op=op)
        want = reduce_np(dtype, op, [pattern(dtype, op, r, n, salt) for r in range(world)], world)
        errors += compare_exact(np.asarray(x), want, f"allreduce {dtype} {op} n={n}")
    rr.destroy()  # a goodbye (the harness leaves with os._exit): a rank still in the last
    # all-reduce would take a silent close for a crash (test_hardening's flood test, CI)
    return {"errors": errors, "init_s": init_s, "held_s": held["s"]}
