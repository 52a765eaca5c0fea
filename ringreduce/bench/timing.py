"""Timing one case of one library on this rank (shared by the sweep and --tune).

A barrier, the warm-up iterations, a barrier, then each timed iteration bracketed by
perf_counter, back to back; then, with -c N, N more iterations whose results are verified,
each from freshly reset inputs after a barrier -- outside the timed ones, as nccl-tests
checks, so that -c does not change what is timed (it reset and re-synchronised before every
timed iteration: caches and pacing differed from a run without it; found by a helper).
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
    times = []
    clock = time.perf_counter
    for _ in range(args.iters):
        t0 = clock()
        run(case, b, redop, root)
        times.append(clock() - t0)
    wrong = 0
    for _ in range(int(args.check)):
        b.reset()
        lib.barrier()
        run(case, b, redop, root)
        wrong += count_wrong(b.out, b.expected)
    return times, wrong
