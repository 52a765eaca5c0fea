"""`ringreduce-bench --tune`: fit the cost model's alpha (us per message) and beta (ns per
byte) to measured all-reduce times and print the ring/tree crossover they imply.

The model (csrc/collectives/cost_model.cc) is linear in alpha and beta for a fixed algorithm,
world size and message size, so instead of restating its formulas here the fit asks the
model itself: t = t0 + alpha * da + beta * db, where t0, da, db come from
_C.predict_allreduce at (alpha, beta) = (0, 0), (1, 0) and (0, 1). Small messages with the
tree pin alpha, large ones with the ring pin beta; the least-squares fit weighs each point
by 1/t so that microsecond and millisecond points count alike.
"""

from __future__ import annotations

import sys
from argparse import Namespace

import numpy as np

from .. import _C
from .anchors import RingReduce
from .checks import make_buffers
from .cli import format_size
from .metrics import make_case, median
from .outfile import write_json
from .timing import measure

TREE_SIZES = (8, 64, 512, 4096)
RING_SIZES = (1 << 20, 4 << 20, 16 << 20, 64 << 20)
ALGO_CODE = {"ring": 1, "tree": 2}
# csrc/core/params.h's, i.e. bench/alpha_beta.json's (tests/test_bench.py checks so)
DEFAULTS = {k: _C.COST_MODEL[k] for k in ("alpha_us", "beta_ns_per_byte")}


def _coeffs(algo: str, world: int, size: int) -> tuple[float, float, float]:
    def p(a: float, b: float) -> float:
        return _C.predict_allreduce(ALGO_CODE[algo], world, size,
                                    {"alpha_us": a, "beta_ns_per_byte": b})

    t0 = p(0.0, 0.0)
    return t0, p(1.0, 0.0) - t0, p(0.0, 1.0) - t0


def fit(points: list[tuple[str, int, float]], world: int) -> dict:
    """alpha_us, beta_ns_per_byte fitted to (algo, bytes, seconds) points; both >= 0."""
    rows, rhs = [], []
    for algo, size, t in points:
        t0, da, db = _coeffs(algo, world, size)
        rows.append([da / t, db / t])
        rhs.append((t - t0) / t)
    a_mat, y = np.array(rows), np.array(rhs)
    (alpha, beta), *_ = np.linalg.lstsq(a_mat, y, rcond=None)
    if beta <= 0:  # bandwidth too noisy to see: keep alpha's column only
        beta = 1e-3
        alpha = float(np.linalg.lstsq(a_mat[:, :1], y - a_mat[:, 1] * beta, rcond=None)[0][0])
    if alpha < 0:
        alpha = 0.0
        beta = float(np.linalg.lstsq(a_mat[:, 1:], y, rcond=None)[0][0])
    return {"alpha_us": float(alpha), "beta_ns_per_byte": float(max(beta, 1e-3))}


def crossover(world: int, opts: dict, limit: int = 1 << 40) -> int | None:
    """Smallest size the cost model sends to the ring (0: always ring, None: never)."""

    def ring(b: int) -> bool:
        return _C.choose_allreduce(world, b, opts) == ALGO_CODE["ring"]

    if ring(1):
        return 0
    if not ring(limit):
        return None
    lo, hi = 1, limit  # tree at lo, ring at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ring(mid) else (mid, hi)
    return hi


def _cross_text(world: int, opts: dict) -> str:
    c = crossover(world, opts)
    if c is None:
        return "tree always"
    return "ring always" if c == 0 else f"ring from {format_size(c)}"


def run(args: Namespace, me: RingReduce, rank: int, world: int) -> int:
    """Measure, fit and report (rank 0); every rank returns the exit code."""
    if world < 2:
        if rank == 0:
            print("ringreduce-bench --tune needs at least 2 ranks (use -n 2)", file=sys.stderr)
        return 2
    targs = Namespace(**{**vars(args), "redop": "sum", "root": 0, "check": False})
    points = []
    for algo, sizes in (("tree", TREE_SIZES), ("ring", RING_SIZES)):
        lib = RingReduce(algo)
        for s in sizes:
            case = make_case("allreduce", s, "float32", world)
            b = make_buffers(case, "float32", rank, world, "sum", 0, False)
            times, _ = measure(lib, case, b, targs)
            t = me.allreduce_np(np.array(times), "max")
            points.append((algo, case.size, median([float(x) for x in t])))
    if rank != 0:
        return 0
    res = fit(points, world)
    print(f"# ringreduce-bench --tune: {world} ranks, ring and tree over tcp (what the cost model "
          f"describes), float32 sum, median of {args.iters} iterations")
    print(f"#{'algo':>6} {'size':>8} {'measured(us)':>13} {'model(us)':>10}")
    for algo, size, t in points:
        t0, da, db = _coeffs(algo, world, size)
        model = t0 + res["alpha_us"] * da + res["beta_ns_per_byte"] * db
        print(f" {algo:>6} {format_size(size):>8} {t * 1e6:13.1f} {model * 1e6:10.1f}")
    print(f"# alpha = {res['alpha_us']:.3f} us per message, beta = "
          f"{res['beta_ns_per_byte']:.4f} ns per byte ({1 / res['beta_ns_per_byte']:.2f} GB/s)")
    for label, opts in (("fitted", res), ("defaults", DEFAULTS)):
        xs = "  ".join(f"{n} ranks: {_cross_text(n, opts)}" for n in sorted({world, 2, 4, 8, 16}))
        print(f"# ring/tree crossover ({label} alpha {opts['alpha_us']:.3g} us, beta "
              f"{opts['beta_ns_per_byte']:.3g} ns/B): {xs}")
    if args.tune_out:
        write_json(args.tune_out, res, indent=1)
        print(f"# wrote {args.tune_out}; use it with RINGREDUCE_TUNING_FILE={args.tune_out}")
    return 0
