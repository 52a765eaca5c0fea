"""Timing one case of one library on this rank (shared by the sweep and --tune).

A barrier, the warm-up iterations, a barrier, then each timed iteration bracketed by
perf_counter; with --check the inputs are reset and the ranks re-synchronised before every
iteration (outside the timed region) and every result is verified.
"""

from __future__ import annotations

import time
from argparse import Namespace
from typing import Any

from . import anchors
from .checks import count_wrong
from .metrics import Case


def measure(lib: anchors.Lib, case: Case, b: Any, args: Namespace) -> tuple[list[float], int]:
    """This rank's per-iteration times (seconds) and wrong-element count for one case."""
    run, redop, root = lib.run, args.redop, args.root
    lib.barrier()
    for _ in range(args.warmup):
        run(case, b, redop, root)
    lib.barrier()
    times, wrong = [], 0
    clock = time.perf_counter
    for _ in range(args.iters):
        if args.check:
            b.reset()
            lib.barrier()
        t0 = clock()
        run(case, b, redop, root)
        times.append(clock() - t0)
        if args.check:
            wrong += count_wrong(b.out, b.expected)
    return times, wrong
