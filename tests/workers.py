"""Functions that run inside ranks (started by _spawn.run_world), each batching many cases
into one process launch so the suite stays fast.

Every expectation is computed locally from rank-dependent inputs: each rank can generate
every other rank's input (pattern() is a pure function of dtype, op, rank, index), so it
knows the exact answer without trusting the library. Matrix workers do not stop at the
first wrong answer: they collect failure messages per family and a digest of every result,
and the parent compares the digests across ranks (results must be bit-identical).

Buffers, inputs and reference answers live in tests/matrix_data.py (shared with the other
worker modules, which also import them from here).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable

import numpy as np
import torch
from matrix_data import (  # noqa: F401 - re-exported to the other worker modules
    _ES,
    BITWISE,
    DTYPES,
    FLOATS,
    GUARD,
    OPS,
    SENTINEL,
    Buf,
    compare_close,
    compare_exact,
    container_for,
    digest,
    pattern,
    rand_bytes,
    raw_bytes,
    reduce_np,
    refused,
    round_to,
    storage_np,
    tdtype,
    values,
)

import ringreduce as rr
from ringreduce import _env, _state

MAX_FAILS = 25  # per family, so one systematic bug does not flood the report


# ---------------------------------------------------------------------- recorder


class Recorder:
    """Runs cases, keeps failure messages and result digests per family. After a
    RingReduceError the communicator is unusable, so the remaining cases are skipped."""

    def __init__(self) -> None:
        self.fails: dict[str, list[str]] = {}
        self.digests: dict[str, dict[str, str]] = {}
        self.counts: dict[str, int] = {}
        self.extra: dict[str, Any] = {}
        self.fatal: str | None = None

    def case(self, family: str, name: str, fn: Callable[[], tuple[list[str], str | None]]
             ) -> None:
        fails = self.fails.setdefault(family, [])
        self.digests.setdefault(family, {})
        self.counts[family] = self.counts.get(family, 0) + 1
        if self.fatal is not None:
            return
        try:
            errs, dig = fn()
        except rr.RingReduceError as e:
            self.fatal = f"{family}/{name}: {type(e).__name__}: {e}"
            fails.append(self.fatal)
            return
        except Exception as e:  # noqa: BLE001 - a wrong exception is a failed case
            errs, dig = [f"raised {type(e).__name__}: {e}"], None
        if errs and len(fails) < MAX_FAILS:
            fails.extend(f"{name}: {m}" for m in errs)
        if dig is not None:
            self.digests[family][name] = dig

    def result(self) -> dict:
        return {"fails": self.fails, "digests": self.digests, "counts": self.counts,
                "extra": self.extra, "fatal": self.fatal}


# ----------------------------------------------------------------------- allreduce


def allreduce_case(rank: int, world: int, dtype: str, op: str, algo: str, n: int,
                   container: str, shape: tuple | None = None, salt: int = 0,
                   inputs: list[np.ndarray] | None = None):
    def run():
        ins = inputs or [pattern(dtype, op, r, n, salt) for r in range(world)]
        exp = reduce_np(dtype, op, ins, world)
        b = Buf(dtype, container, n, shape, vals=ins[rank])
        ret = rr.allreduce(b.view, op=op, algo=algo)
        errs = [] if ret is None else [f"sync allreduce returned {ret!r}, expected None"]
        if shape is not None and tuple(b.view.shape) != tuple(shape):
            errs.append(f"shape changed to {tuple(b.view.shape)}")
        errs += compare_exact(values(b.view).reshape(-1), exp, "result")
        errs += b.guard_errors()
        return errs, digest(b.view)
    return run


def half_roundings(dtype: str, world: int, algo: str) -> int:
    """How often an all-reduce rounds each float16/bfloat16 result element (1 for other
    dtypes): once over shared memory or with RINGREDUCE_HALF_WIRE=32; over TCP with 16-bit
    partials on the wire once per hop: n-1 (ring), ceil(log2 n) (tree); "auto" over TCP may
    pick either, so the ring's count bounds it."""
    if dtype not in ("float16", "bfloat16") or world == 1 or _env.tunables().half_wire == 32:
        return 1
    if algo == "auto" and _state.current().comm.plan == "shm":
        return 1
    return (world - 1).bit_length() if algo == "tree" else world - 1


def random_allreduce_case(rank: int, world: int, dtype: str, op: str, algo: str, n: int,
                          container: str, salt: int):
    """Random normal inputs compared against float64 with a bound derived from the
    accumulation precision (float32 for 16-bit types) plus one rounding to dtype per hop
    that rounds (half_roundings), each at most out_eps * sum|x|."""
    def run():
        ins = []
        for r in range(world):
            x = np.random.default_rng([salt, r]).standard_normal(n)
            ins.append(round_to(dtype, x))
        a = np.stack([x.astype(np.float64) for x in ins])
        exp = a.sum(axis=0) / (world if op == "avg" else 1)
        acc_eps = np.finfo(np.float64 if dtype == "float64" else np.float32).eps
        out_eps = {"float32": 2.0 ** -23, "float64": 2.0 ** -52, "float16": 2.0 ** -10,
                   "bfloat16": 2.0 ** -7}[dtype]
        hops = half_roundings(dtype, world, algo) - 1  # roundings before the final one
        scale = np.abs(a).sum(axis=0) / (world if op == "avg" else 1)
        tol = ((world * acc_eps + hops * out_eps) * scale + out_eps * np.abs(exp) + 1e-300)
        if dtype == "float16":
            tol = tol + (hops + 1) * 2.0 ** -24  # subnormal spacing
        b = Buf(dtype, container, n, vals=ins[rank])
        rr.allreduce(b.view, op=op, algo=algo)
        got = values(b.view).astype(np.float64)
        return (compare_close(got, exp, tol, "random") + b.guard_errors()), digest(b.view)
    return run


def special_float_inputs(dtype: str, op: str, world: int, n: int) -> list[np.ndarray]:
    """pattern() plus NaN and +-inf planted by different ranks at different indices."""
    ins = [pattern(dtype, op, r, n, 3).astype(np.float64) for r in range(world)]
    for j, idx in enumerate(sorted({0, n // 2, n - 1})):
        ins[j % world][idx] = np.nan
    if n > 6:
        ins[(1 % world)][3] = np.inf
        ins[(2 % world)][5] = -np.inf
    return [x.astype(storage_np(dtype)) for x in ins]


def once_rounded_inputs(dtype: str, world: int, n: int) -> list[np.ndarray]:
    """One big value and (world-1) ones per element, the big one on a different rank per
    element: exact sum 2^k + world - 1 needs one rounding; rounding partial sums to 16 bits
    would lose the ones (2^k + 1 rounds to 2^k at spacing 2)."""
    big = 256.0 if dtype == "bfloat16" else 2048.0
    i = np.arange(n)
    return [np.where(i % world == r, big, 1.0).astype(storage_np(dtype)) for r in range(world)]


def _digest_only(run: Callable[[], tuple[list[str], str | None]]):
    """Keep only a case's digest and guard checks (for results without a reference)."""
    def wrapped():
        errs, dig = run()
        return [e for e in errs if "buffer" in e], dig
    return wrapped


def family_allreduce(rec: Recorder, rank: int, world: int, algo: str) -> None:
    fam = f"allreduce_{algo}"
    sizes = sorted({0, 1, max(world - 1, 0), world, world + 1, 1001, 20011})
    k = 0
    for dtype in DTYPES:
        for op in OPS:
            if refused(dtype, op):
                k += 1
                rec.case(fam, f"{dtype}/{op}/refused", refused_case(
                    rank, world, dtype, op, "allreduce", container_for(dtype, k)))
                continue
            for n in sizes:
                k += 1
                c = container_for(dtype, k)
                shape = (7, 143) if n == 1001 and k % 3 == 0 else (() if n == 1 and k % 4 == 0
                                                                      else None)
                rec.case(fam, f"{dtype}/{op}/n={n}/{c}/{shape}",
                         allreduce_case(rank, world, dtype, op, algo, n, c, shape, salt=k))
    # Both containers for one middle size, every dtype and op.
    for dtype in DTYPES:
        for op in OPS:
            for c in ("numpy", "torch"):
                if (c == "numpy" and dtype == "bfloat16") or refused(dtype, op):
                    continue
                rec.case(fam, f"{dtype}/{op}/n=37/{c}",
                         allreduce_case(rank, world, dtype, op, algo, 37, c, salt=5))
    # Chunk boundaries at the 4 KiB segment: chunks of exactly one segment, and one more.
    for n in (world * 1024, world * 1024 + 1, world * 1024 - 1):
        rec.case(fam, f"float32/sum/segment-edge n={n}",
                 allreduce_case(rank, world, "float32", "sum", algo, n, "numpy", salt=2))
    for dtype in FLOATS:
        for op in ("sum", "avg"):
            c = container_for(dtype, len(op))
            rec.case(fam, f"{dtype}/{op}/random",
                     random_allreduce_case(rank, world, dtype, op, algo, 3001, c, salt=11))
        for op in ("sum", "prod", "min", "max"):
            n = 101
            rec.case(fam, f"{dtype}/{op}/nan-inf",
                     allreduce_case(rank, world, dtype, op, algo, n, container_for(dtype, 1),
                                    inputs=special_float_inputs(dtype, op, world, n)))
    # Arbitrary bit patterns: NaN payloads, infinities, subnormals, -0.0. min/max have an
    # exact answer; for every op all ranks must end with the same bits (the parent compares
    # digests), which needs a fixed combining order even where IEEE results are unordered.
    for dtype in FLOATS:
        for op in ("min", "max", "sum", "prod"):
            n = 257
            raw = [rand_bytes([41, r, len(op)], n * _ES[dtype]) for r in range(world)]
            ins = [values(Buf(dtype, "torch", n, raw=b).view) for b in raw]
            run = allreduce_case(rank, world, dtype, op, algo, n, "torch", inputs=ins)
            if op in ("sum", "prod"):
                run = _digest_only(run)
            rec.case(fam, f"{dtype}/{op}/raw-bits", run)
    for dtype in ("float16", "bfloat16"):
        if half_roundings(dtype, world, algo) > 1:
            continue  # rounded per hop (tests/test_wire.py checks the bound and the bytes)
        for op in ("sum", "avg"):
            n = 64
            rec.case(fam, f"{dtype}/{op}/rounded-once",
                     allreduce_case(rank, world, dtype, op, algo, n, "torch",
                                    inputs=once_rounded_inputs(dtype, world, n)))


# ------------------------------------------------------------------ broadcast etc.


def broadcast_case(rank: int, world: int, dtype: str, root: int, n: int, container: str,
                   salt: int, shape: tuple | None = None):
    def run():
        es = _ES[dtype]
        src = rand_bytes([salt, root, 1], n * es, dtype)  # raw bits: NaN payloads, -0.0, ...
        mine = src if rank == root else rand_bytes([salt, rank, 2], n * es, dtype)
        b = Buf(dtype, container, n, shape, raw=mine)
        ret = rr.broadcast(b.view, src=root)
        errs = [] if ret is None else [f"sync broadcast returned {ret!r}"]
        got = raw_bytes(b.view)
        if got != src.tobytes():
            diff = next(j for j in range(len(got)) if got[j] != src[j])
            errs.append(f"bytes differ from root {root}'s, first at byte {diff}")
        return errs + b.guard_errors(), digest(b.view)
    return run


def family_broadcast(rec: Recorder, rank: int, world: int) -> None:
    sizes = sorted({0, 1, max(world - 1, 0), 1001})
    k = 0
    for root in range(world):
        for dtype in DTYPES:
            for n in sizes:
                k += 1
                c = container_for(dtype, k)
                shape = (7, 11, 13) if n == 1001 and k % 2 == 0 else None
                rec.case("broadcast", f"root={root}/{dtype}/n={n}/{c}",
                         broadcast_case(rank, world, dtype, root, n, c, k, shape))
        # > 256 KiB: the pipelined chain (for world > 2), 4 KiB segments, odd length.
        for dtype in ("float32", "int8"):
            n = 270001 if dtype == "int8" else 70001
            rec.case("broadcast", f"root={root}/{dtype}/chain n={n}",
                     broadcast_case(rank, world, dtype, root, n, container_for(dtype, root),
                                    900 + root))


def allgather_case(rank: int, world: int, dtype: str, n: int, container: str, salt: int,
                   give_out: bool, shape: tuple | None = None, alias: bool = False):
    def run():
        es = _ES[dtype]
        ins = [rand_bytes([salt, r, 3], n * es, dtype) for r in range(world)]
        want = np.concatenate(ins).tobytes()
        xshape = shape if shape is not None else (n,)
        errs: list[str] = []
        if alias:  # x is this rank's slot of out
            ob = Buf(dtype, container, n * world, (world,) + tuple(xshape), raw=np.concatenate(
                [ins[rank] if r == rank else rand_bytes([salt, r, 4], n * es, dtype)
                 for r in range(world)]))
            x = ob.view[rank]
            res = rr.allgather(x, out=ob.view)
            xb = None
        else:
            xb = Buf(dtype, container, n, shape, raw=ins[rank])
            ob = (Buf(dtype, container, n * world, (world,) + tuple(xshape),
                      raw=rand_bytes([salt, rank, 5], n * world * es, dtype)) if give_out else None)
            res = rr.allgather(xb.view, out=ob.view if ob else None)
            if xb.guard_errors() or raw_bytes(xb.view) != ins[rank].tobytes():
                errs.append("input was modified")
        if ob is not None and res is not ob.view:
            errs.append("did not return the out it was given")
        if tuple(res.shape) != (world,) + tuple(xshape):
            errs.append(f"out shape {tuple(res.shape)}, expected {(world,) + tuple(xshape)}")
        if type(res) is not type(xb.view if xb else ob.view) or \
                (isinstance(res, torch.Tensor) and res.dtype != tdtype(dtype)) or \
                (isinstance(res, np.ndarray) and str(res.dtype) != dtype):
            errs.append(f"out is {type(res).__name__} of {res.dtype}, expected {dtype}")
        got = raw_bytes(res)
        if got != want:
            bad = [r for r in range(world) if got[r * n * es:(r + 1) * n * es] != ins[r].tobytes()]
            errs.append(f"blocks of ranks {bad} are wrong")
        if ob is not None:
            errs += ob.guard_errors()
        return errs, digest(res)
    return run


def family_allgather(rec: Recorder, rank: int, world: int) -> None:
    k = 0
    for dtype in DTYPES:
        for n in sorted({0, 1, max(world - 1, 0), 1001, 5003}):
            for give_out in (False, True):
                k += 1
                c = container_for(dtype, k)
                rec.case("allgather", f"{dtype}/n={n}/{c}/out={give_out}",
                         allgather_case(rank, world, dtype, n, c, k, give_out))
    for c in ("numpy", "torch"):
        rec.case("allgather", f"2d/{c}",
                 allgather_case(rank, world, "float32", 6, c, 77, True, shape=(2, 3)))
        rec.case("allgather", f"alias/{c}",
                 allgather_case(rank, world, "int32", 9, c, 78, True, alias=True))
        rec.case("allgather", f"0-d/{c}",
                 allgather_case(rank, world, "float64", 1, c, 79, False, shape=()))


def reduce_scatter_case(rank: int, world: int, dtype: str, op: str, k: int, container: str,
                        salt: int, give_out: bool, two_d: bool = False):
    def run():
        total = world * k
        ins = [pattern(dtype, op, r, total, salt) for r in range(world)]
        exp = reduce_np(dtype, op, ins, world)[rank * k:(rank + 1) * k]
        xshape = (world, k) if two_d else None
        xb = Buf(dtype, container, total, xshape, vals=ins[rank])
        before = raw_bytes(xb.view)
        oshape = (1, k) if two_d else None
        ob = Buf(dtype, container, k, oshape, raw=rand_bytes([salt, rank], k * _ES[dtype], dtype)) \
            if give_out else None
        res = rr.reduce_scatter(xb.view, out=ob.view if ob else None, op=op)
        errs = []
        if ob is not None and res is not ob.view:
            errs.append("did not return the out it was given")
        want_shape = (1, k) if two_d else (k,)
        if tuple(res.shape) != want_shape:
            errs.append(f"out shape {tuple(res.shape)}, expected {want_shape}")
        errs += compare_exact(values(res).reshape(-1), exp, "block")
        if raw_bytes(xb.view) != before:
            errs.append("input was modified")
        errs += xb.guard_errors() + (ob.guard_errors() if ob else [])
        return errs, None  # blocks differ per rank by design
    return run


def reduce_scatter_in_place_case(rank: int, world: int, dtype: str, op: str, k: int, c: str):
    def run():  # out is this rank's own block of x (NCCL-style in-place)
        ins = [pattern(dtype, op, r, world * k, 8) for r in range(world)]
        exp = reduce_np(dtype, op, ins, world)[rank * k:(rank + 1) * k]
        xb = Buf(dtype, c, world * k, vals=ins[rank])
        out = xb.view[rank * k:(rank + 1) * k]
        res = rr.reduce_scatter(xb.view, out=out, op=op)
        return (compare_exact(values(res), exp, "in-place block") + xb.guard_errors()), None
    return run


def family_reduce_scatter(rec: Recorder, rank: int, world: int) -> None:
    j = 0
    for dtype in DTYPES:
        for op in OPS:
            if refused(dtype, op):
                j += 1
                rec.case("reduce_scatter", f"{dtype}/{op}/refused", refused_case(
                    rank, world, dtype, op, "reduce_scatter", container_for(dtype, j)))
                continue
            for k in (0, 1, 3, 1001, 2000):
                j += 1
                c = container_for(dtype, j)
                rec.case("reduce_scatter", f"{dtype}/{op}/k={k}/{c}",
                         reduce_scatter_case(rank, world, dtype, op, k, c, j, j % 3 == 0))
    for dtype, op, k in (("float32", "sum", 1001), ("bfloat16", "avg", 300), ("int64", "min", 7)):
        for c in ("numpy", "torch"):
            if c == "numpy" and dtype == "bfloat16":
                continue
            rec.case("reduce_scatter", f"in-place/{dtype}/{op}/{c}",
                     reduce_scatter_in_place_case(rank, world, dtype, op, k, c))
    for c in ("numpy", "torch"):
        rec.case("reduce_scatter", f"2d/{c}",
                 reduce_scatter_case(rank, world, "float32", "sum", 10, c, 5, False, True))
        rec.case("reduce_scatter", f"2d-out/{c}",
                 reduce_scatter_case(rank, world, "int64", "max", 10, c, 6, True, True))


SMALL_SHAPES = [(3, 4), (0,), (1,), (1001,), (2, 3, 5), ()]
# Above shared memory's one-round size: the pieces are read and written in place, and the
# pipeline's slices start and end inside pieces and span several of them.
LARGE_SHAPES = [(70001,), (3,), (0,), (33333,), (129, 257), (5,), (40000,)]


def coalesced_case(rank: int, world: int, dtype: str, op: str, algo: str, container: str,
                   salt: int, async_op: bool = False, shapes: list = SMALL_SHAPES):

    def run():
        bufs, exps = [], []
        for t, shp in enumerate(shapes):
            n = int(np.prod(shp)) if shp else 1
            ins = [pattern(dtype, op, r, n, salt + t) for r in range(world)]
            exps.append(reduce_np(dtype, op, ins, world))
            bufs.append(Buf(dtype, container, n, shp, vals=ins[rank]))
        w = rr.allreduce_coalesced([b.view for b in bufs], op=op, algo=algo, async_op=async_op)
        errs = []
        if async_op:
            if not isinstance(w, rr.Work):
                return [f"async returned {type(w).__name__}, not Work"], None
            if w.wait() is not True:
                errs.append("wait() did not return True")
        elif w is not None:
            errs.append(f"sync call returned {w!r}")
        for t, (b, e) in enumerate(zip(bufs, exps)):
            if tuple(b.view.shape) != shapes[t]:
                errs.append(f"tensor {t}: shape {tuple(b.view.shape)}")
            errs += compare_exact(values(b.view).reshape(-1), e, f"tensor {t} {shapes[t]}")
            errs += [f"tensor {t}: {m}" for m in b.guard_errors()]
        dig = hashlib.sha256(b"".join(raw_bytes(b.view) for b in bufs)).hexdigest()[:32]
        return errs, dig
    return run


def family_coalesced(rec: Recorder, rank: int, world: int) -> None:
    j = 0
    for dtype in ("float32", "bfloat16", "float16", "int32", "uint8", "float64", "bool",
                  "uint64"):
        for op in ("sum", "avg", "max", "bxor"):
            if refused(dtype, op):
                j += 1
                rec.case("coalesced", f"{dtype}/{op}/refused", refused_case(
                    rank, world, dtype, op, "coalesced", container_for(dtype, j)))
                continue
            for algo in ("ring", "tree", "auto"):
                j += 1
                c = container_for(dtype, j)
                rec.case("coalesced", f"{dtype}/{op}/{algo}/{c}",
                         coalesced_case(rank, world, dtype, op, algo, c, j * 10, j % 4 == 0))
    for dtype, op, algo in (("float32", "sum", "auto"), ("bfloat16", "avg", "auto"),
                            ("int32", "max", "auto"), ("float64", "avg", "ring")):
        j += 1
        c = container_for(dtype, j)
        rec.case("coalesced", f"large {dtype}/{op}/{algo}/{c}",
                 coalesced_case(rank, world, dtype, op, algo, c, j * 10, j % 2 == 0,
                                shapes=LARGE_SHAPES))
    rec.case("coalesced", "same tensor twice", lambda: _coalesced_alias(rank, world))
    rec.case("coalesced", "empty list", lambda: (
        [] if rr.allreduce_coalesced([]) is None else ["empty list returned non-None"], None))


def _coalesced_alias(rank: int, world: int):
    """The same array passed twice reduces as two inputs (as a concatenation would)."""
    x = np.full(50000, rank + 1, np.float32)
    y = np.arange(7, dtype=np.float32) * (rank + 1)
    rr.allreduce_coalesced([x, y, x])
    tot = world * (world + 1) / 2
    errs = compare_exact(x, np.full(50000, tot, np.float32), "x") + compare_exact(
        y, np.arange(7, dtype=np.float32) * tot, "y")
    return errs, hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()[:32]


# --------------------------------------------------------------------------- async


def family_async(rec: Recorder, rank: int, world: int) -> None:
    def queued():
        errs: list[str] = []
        n = 1001
        i = np.arange(n)
        # Order matters: sum then prod of the same buffer gives S**world, prod then sum not.
        xs = [((i + r) % 3 + 1).astype(np.float64) for r in range(world)]
        s = np.sum(xs, axis=0)
        want_x = s ** world
        x = Buf("float64", "numpy", n, vals=xs[rank])
        y_root = world - 1
        y_src = rand_bytes([7, y_root], 4 * 300)
        y = Buf("int32", "torch", 300, raw=y_src if rank == y_root else rand_bytes([8, rank], 1200))
        g_ins = [rand_bytes([9, r], 2 * 50) for r in range(world)]
        g = Buf("float16", "torch", 50, raw=g_ins[rank])
        rs_ins = [pattern("int64", "sum", r, world * 7, 4) for r in range(world)]
        rs = Buf("int64", "numpy", world * 7, vals=rs_ins[rank])
        cl = [Buf("bfloat16", "torch", m, vals=pattern("bfloat16", "max", rank, m, m))
              for m in (5, 0, 17)]
        cl_want = [reduce_np("bfloat16", "max", [pattern("bfloat16", "max", r, m, m)
                                                 for r in range(world)], world)
                   for m in (5, 0, 17)]
        works = {
            "allreduce-sum": rr.allreduce(x.view, op="sum", algo="ring", async_op=True),
            "broadcast": rr.broadcast(y.view, src=y_root, async_op=True),
            "allreduce-prod": rr.allreduce(x.view, op="prod", algo="tree", async_op=True),
            "allgather": rr.allgather(g.view, async_op=True),
            "barrier": rr.barrier(async_op=True),
            "reduce_scatter": rr.reduce_scatter(rs.view, op="sum", async_op=True),
            "coalesced": rr.allreduce_coalesced([b.view for b in cl], op="max", async_op=True),
        }
        for name, w in works.items():
            if not isinstance(w, rr.Work):
                errs.append(f"{name}: async_op=True returned {type(w).__name__}, not Work")
        for name, w in reversed(list(works.items())):  # wait in reverse order
            if w.wait() is not True:
                errs.append(f"{name}: wait() returned False without a timeout")
            if not w.is_completed():
                errs.append(f"{name}: is_completed() False after wait()")
        errs += compare_exact(values(x.view), want_x, "allreduce sum then prod (order!)")
        if raw_bytes(y.view) != y_src.tobytes():
            errs.append("broadcast result wrong")
        ag = works["allgather"].result()
        if tuple(ag.shape) != (world, 50) or raw_bytes(ag) != np.concatenate(g_ins).tobytes():
            errs.append("allgather result() wrong")
        rs_out = works["reduce_scatter"].result()
        errs += compare_exact(values(rs_out), reduce_np("int64", "sum", rs_ins, world)
                              [rank * 7:(rank + 1) * 7], "reduce_scatter result()")
        for b, want in zip(cl, cl_want):
            errs += compare_exact(values(b.view), want, "coalesced")
        for b in (x, y, g, rs, *cl):
            errs += b.guard_errors()
        return errs, digest(x.view)

    def many_then_sync():
        # 20 queued async all-reduces, then a sync one: when it returns, all queued ones
        # (submitted earlier) must have completed, in order.
        errs = []
        bufs = [Buf("int32", "numpy", 333, vals=pattern("int32", "sum", rank, 333, t))
                for t in range(20)]
        works = [rr.allreduce(b.view, op="sum", async_op=True) for b in bufs]
        last = Buf("int32", "torch", 10, vals=pattern("int32", "max", rank, 10, 99))
        rr.allreduce(last.view, op="max")
        not_done = [t for t, w in enumerate(works) if not w.is_completed()]
        if not_done:
            errs.append(f"async works {not_done} not completed after a later sync collective")
        for t, (b, w) in enumerate(zip(bufs, works)):
            w.wait()
            want = reduce_np("int32", "sum", [pattern("int32", "sum", r, 333, t)
                                              for r in range(world)], world)
            errs += compare_exact(values(b.view), want, f"work {t}")
        errs += compare_exact(values(last.view), reduce_np(
            "int32", "max", [pattern("int32", "max", r, 10, 99) for r in range(world)], world),
            "sync after async")
        return errs, None

    def wait_timeout():
        # The last rank joins 1 s late: a short wait(timeout) on the others returns False.
        errs = []
        late = world - 1
        if rank == late:
            time.sleep(1.0)
        x = Buf("float32", "torch", 100, vals=pattern("float32", "sum", rank, 100, 1))
        w = rr.allreduce(x.view, async_op=True)
        if rank != late and world > 1:
            if w.wait(timeout=0.05) is not False:
                errs.append("wait(timeout=0.05) did not return False while a peer was late")
            if w.is_completed():
                errs.append("is_completed() True while a peer was late")
            if w.exception() is not None or w.is_success():
                errs.append("exception() / is_success() while running: "
                            f"{w.exception()!r} / {w.is_success()}")
        if w.wait() is not True:
            errs.append("wait() did not return True")
        if w.exception() is not None or not w.is_success():
            errs.append(f"exception() / is_success() after success: {w.exception()!r} / "
                        f"{w.is_success()}")
        if w.wait(timeout=0.01) is not True:
            errs.append("a second wait() on a finished Work did not return True")
        errs += compare_exact(values(x.view), reduce_np(
            "float32", "sum", [pattern("float32", "sum", r, 100, 1) for r in range(world)],
            world), "late allreduce")
        return errs, digest(x.view)

    def future_after_wait():
        # A Future taken before wait() is done once wait() returns, and a Work has one
        # Future (both failed before: found by a helper).
        import torch

        errs = []
        for i in range(50):
            u = torch.full((3,), float(rank + i))
            w = rr.allreduce(u, async_op=True)
            f = w.get_future()
            w.wait()
            if not f.done() or w.get_future() is not f:
                errs.append(f"iteration {i}: Future done={f.done()} after wait(), "
                            f"same Future: {w.get_future() is f}")
                break
            if not torch.equal(f.value()[0], torch.full((3,), float(sum(range(world)) + i * world))):
                errs.append(f"iteration {i}: Future value {f.value()}")
                break
            # Taken after wait() returned: done at once, too, with the value (it was handed
            # out not done, its value() an INTERNAL ASSERT of torch's; a helper).
            w = rr.allreduce(u, async_op=True)
            w.wait()
            f = w.get_future()
            want = torch.full((3,), float(world * (sum(range(world)) + i * world)))
            if not f.done() or not torch.equal(f.value()[0], want):
                errs.append(f"iteration {i}: a Future taken after wait(): done={f.done()}, "
                            f"value {f.value() if f.done() else None}")
                break
        return errs, None

    rec.case("async", "future after wait", future_after_wait)
    rec.case("async", "queued mixed collectives", queued)
    rec.case("async", "20 async then sync", many_then_sync)
    rec.case("async", "wait timeout", wait_timeout)


def family_barrier(rec: Recorder, rank: int, world: int) -> None:
    stamps = []

    def run():
        for k in range(3):
            time.sleep(0.1 * ((rank + k) % world))  # a different rank arrives last each time
            t_in = time.time()
            if k == 1:
                w = rr.barrier(async_op=True)
                w.wait()
            else:
                rr.barrier()
            stamps.append((t_in, time.time()))
        return [], None

    rec.case("barrier", "staggered", run)
    rec.extra["barrier_stamps"] = stamps


def family_basics(rec: Recorder, rank: int, world: int) -> None:
    def run():
        errs = []
        if rr.get_rank() != rank or rr.get_world_size() != world or not rr.is_initialized():
            errs.append(f"get_rank/get_world_size/is_initialized: {rr.get_rank()} "
                        f"{rr.get_world_size()} {rr.is_initialized()}")
        try:
            rr.init()
            errs.append("a second init() did not raise")
        except RuntimeError as e:
            if "destroy" not in str(e):
                errs.append(f"second init(): unhelpful message {e}")
        return errs, None
    rec.case("basics", "rank/world/init twice", run)


def family_large(rec: Recorder, rank: int, world: int) -> None:
    """Messages of several MiB with algo="auto": over shared memory they take the chunked,
    pipelined path through more chunks than it has slots (512 KiB chunks, 4 slots), with
    odd tails; over TCP thousands of 4 KiB segments."""
    for dtype, op, n in (("float32", "sum", 1_000_003), ("bfloat16", "avg", 700_001),
                         ("int8", "max", 3_000_017), ("float64", "prod", 400_009)):
        rec.case("large", f"allreduce {dtype}/{op}/n={n}",
                 allreduce_case(rank, world, dtype, op, "auto", n, container_for(dtype, n),
                                salt=n % 97))
    rec.case("large", "broadcast 3 MB", broadcast_case(rank, world, "uint8", world - 1,
                                                       3_000_001, "numpy", 31))
    # All-gather and reduce-scatter: over shared memory the pipelined slot path (more chunks
    # than slots, odd tails; reduce-scatter's chunk is split into n-1 pieces per slot).
    for dtype, n in (("float32", 700_001), ("int8", 2_100_007)):
        rec.case("large", f"allgather {dtype}/n={n}",
                 allgather_case(rank, world, dtype, n, container_for(dtype, n), n % 89, True))
    rec.case("large", "allgather alias", allgather_case(rank, world, "int32", 300_007, "torch",
                                                         41, True, alias=True))
    for dtype, op, k in (("float32", "sum", 500_003), ("bfloat16", "avg", 400_009),
                         ("int8", "max", 1_100_001), ("float64", "prod", 150_001)):
        rec.case("large", f"reduce_scatter {dtype}/{op}/k={k}",
                 reduce_scatter_case(rank, world, dtype, op, k, container_for(dtype, k),
                                     k % 83, k % 2 == 1))
    rec.case("large", "reduce_scatter in-place", reduce_scatter_in_place_case(
        rank, world, "float32", "min", 400_003, "numpy"))


FAMILIES: dict[str, Callable[[Recorder, int, int], None]] = {
    "basics": family_basics,
    "allreduce_ring": lambda rec, r, w: family_allreduce(rec, r, w, "ring"),
    "allreduce_tree": lambda rec, r, w: family_allreduce(rec, r, w, "tree"),
    "allreduce_auto": lambda rec, r, w: family_allreduce(rec, r, w, "auto"),
    "broadcast": family_broadcast,
    "allgather": family_allgather,
    "reduce_scatter": family_reduce_scatter,
    "coalesced": family_coalesced,
    "async": family_async,
    "barrier": family_barrier,
    "large": family_large,
}


def matrix(rank: int, world: int, families: list[str]) -> dict:
    """Run the named families (see FAMILIES) in order; return the Recorder's findings."""
    rec = Recorder()
    t0 = time.time()
    timings = {}
    for fam in families:
        t = time.time()
        FAMILIES[fam](rec, rank, world)
        timings[fam] = round(time.time() - t, 3)
    rec.extra["timings"] = timings
    rec.extra["total_s"] = round(time.time() - t0, 3)
    return rec.result()


def big_allreduce(rank: int, world: int, container: str, algo: str) -> dict:
    """16 MiB float32 ring sum with the default 512 KiB segments; integer-valued inputs so
    the answer is exact."""
    n = 4 * 1024 * 1024
    i = np.arange(n, dtype=np.int64)
    x = ((i % 1000) + 3 * rank).astype(np.float32)
    want = (world * (i % 1000) + 3 * world * (world - 1) // 2).astype(np.float32)
    buf = torch.from_numpy(x) if container == "torch" else x
    t = time.time()
    rr.allreduce(buf, op="sum", algo=algo)
    el = time.time() - t
    got = values(buf)
    errs = compare_exact(got, want, f"16 MiB {algo} sum")
    return {"errs": errs, "digest": digest(buf), "seconds": el}


def refused_case(rank: int, world: int, dtype: str, op: str, collective: str, container: str):
    """A combination the library refuses: ValueError naming the problem, buffer untouched."""
    def run():
        n = 5
        b = Buf(dtype, container, n * world, vals=pattern(dtype, "sum", rank, n * world))
        before = raw_bytes(b.base)
        try:
            if collective == "allreduce":
                rr.allreduce(b.view, op=op)
            elif collective == "coalesced":
                rr.allreduce_coalesced([b.view], op=op)
            else:
                rr.reduce_scatter(b.view, op=op)
        except ValueError as e:
            want = "bitwise" if op in BITWISE else "not defined"
            errs = [] if want in str(e) else [f"ValueError does not say '{want}': {e}"]
        else:
            errs = [f"{dtype} {op} was accepted; it must be refused"]
        if raw_bytes(b.base) != before:
            errs.append("the buffer changed although the call was refused")
        return errs, None
    return run
