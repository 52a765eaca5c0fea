"""Rank functions of tests/test_wire.py: what all-reduce puts on the TCP wire.

Each case all-reduces rank-dependent random inputs, reads the communicator's payload byte
counter (``_C.Communicator.bytes_sent``) before and after, and reports the bytes this rank
sent, a digest of its result (the parent checks that every rank has the same bits) and the
result's distance from a float64 reference against a bound the parent derives from the
number of roundings the algorithm makes.
"""

from __future__ import annotations

import numpy as np
import workers

import ringreduce as rr
from ringreduce import _state


def _inputs(dtype: str, world: int, n: int, salt: int) -> list[np.ndarray]:
    """Every rank's input (each rank can compute all of them): normals rounded to dtype."""
    return [workers.round_to(dtype, np.random.default_rng([salt, r]).standard_normal(n))
            for r in range(world)]


def wire_cases(rank: int, world: int, cases: list[list], once_algos: list[str]) -> dict:
    """Run each [dtype, op, algo, n, salt] all-reduce (algo "reduce_scatter": a
    reduce-scatter of n = world * k elements) over TCP; report bytes, digest, error; then the
    once_rounded() check for each of once_algos.

    err_ratio: max over elements of |got - exact| / (u * sum_r |x_r|) (divided by world for
    avg), where u is the unit roundoff of dtype's storage (2^-11 float16, 2^-8 bfloat16,
    2^-24 float32): how many roundings' worth of error the result shows.
    """
    comm = _state.current().comm
    out = []
    for dtype, op, algo, n, salt in cases:
        ins = _inputs(dtype, world, n, salt)
        buf = workers.Buf(dtype, "torch", n, vals=ins[rank])
        a = np.stack([x.astype(np.float64) for x in ins])
        before = comm.bytes_sent()
        if algo == "reduce_scatter":  # n = world * k elements; this rank gets block rank
            k = n // world
            out_buf = workers.Buf(dtype, "torch", k)
            rr.reduce_scatter(buf.view, out_buf.view, op=op)
            buf, a = out_buf, a[:, rank * k:(rank + 1) * k]
        else:
            rr.allreduce(buf.view, op=op, algo=algo)
        sent = comm.bytes_sent() - before
        div = world if op == "avg" else 1
        exact = a.sum(axis=0) / div
        scale = np.abs(a).sum(axis=0) / div
        u = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}[dtype]
        got = workers.values(buf.view).astype(np.float64)
        # float16 subnormals are spaced 2^-24 apart: an absolute floor per rounding.
        floor = 2.0 ** -25 if dtype == "float16" else 0.0
        err = np.abs(got - exact)
        ratio = float(np.max(np.maximum(err - floor * (world - 1), 0) / (u * scale + 1e-300)))
        out.append({"case": [dtype, op, algo, n, salt], "sent": int(sent),
                    "digest": workers.digest(buf.view), "err_ratio": ratio,
                    "guard": buf.guard_errors(), "finite": bool(np.isfinite(got).all())})
    return {"cases": out, "once": {algo: once_rounded(rank, world, algo) for algo in once_algos}}


def once_rounded(rank: int, world: int, algo: str) -> list[str]:
    """float16/bfloat16 sums whose exact value needs one rounding (see workers.py): exact
    with float32 partials on the wire, off by up to world-1 with 16-bit partials."""
    errs: list[str] = []
    for dtype in ("float16", "bfloat16"):
        n = 64
        run = workers.allreduce_case(rank, world, dtype, "sum", algo, n, "torch",
                                     inputs=workers.once_rounded_inputs(dtype, world, n))
        errs += [f"{dtype}: {e}" for e in run()[0]]
    return errs


def large_half_inputs(world: int, n: int) -> list[np.ndarray]:
    """float16 inputs of magnitude 40960..64512 (multiples of 1024, mixed signs by element):
    any two of the same sign sum past float16's 65504, their average never does. Every
    partial sum of inputs scaled by a power of two stays exact, so the average is exact."""
    i = np.arange(n)
    sign = np.where(i % 3 == 0, -1.0, 1.0)
    return [(sign * 1024.0 * (40 + (i * 7 + r * 13) % 24)).astype(np.float16)
            for r in range(world)]


def large_half_avg(rank: int, world: int, n: int,
                   algos: tuple[str, ...] = ("ring", "tree", "reduce_scatter")) -> list[str]:
    """op=avg of large_half_inputs by each of algos (an all-reduce algorithm, or
    "reduce_scatter"): every result equals the float64 average rounded once to float16
    (reduce_np), none is inf."""
    ins = large_half_inputs(world, n)
    want = workers.reduce_np("float16", "avg", ins, world)
    errs = []
    for algo in algos:
        buf = workers.Buf("float16", "torch", n, vals=ins[rank])
        if algo == "reduce_scatter":
            k = n // world
            out = workers.Buf("float16", "torch", k)
            rr.reduce_scatter(buf.view, out.view, op="avg")
            buf, exp = out, want[rank * k:(rank + 1) * k]
        else:
            rr.allreduce(buf.view, op="avg", algo=algo)
            exp = want
        errs += [f"{algo}: {e}" for e in workers.compare_exact(workers.values(buf.view), exp, "avg")]
        errs += [f"{algo}: {e}" for e in buf.guard_errors()]
    return errs


def small_half_avg(rank: int, world: int, n: int, algo: str = "ring") -> dict:
    """op=avg of tiny positive float16 inputs (2^-20..2^-17, subnormal: gradients of ~1e-6)
    over TCP with 16-bit partials. Their grid is 2^-24 apart: a partial sum scaled by 2^-s
    rounds to steps of 2^(s-24) of the sum. Reports the largest error in units of 2^-24 and
    the result's digest."""
    ins = [np.random.default_rng([7, r]).uniform(2.0 ** -20, 2.0 ** -17, n).astype(np.float16)
           for r in range(world)]
    buf = workers.Buf("float16", "torch", n, vals=ins[rank])
    rr.allreduce(buf.view, op="avg", algo=algo)
    exact = np.stack([x.astype(np.float64) for x in ins]).mean(axis=0)
    got = workers.values(buf.view).astype(np.float64)
    return {"err_units": float(np.max(np.abs(got - exact)) / 2.0 ** -24),
            "digest": workers.digest(buf.view), "guard": buf.guard_errors()}
