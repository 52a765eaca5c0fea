"""Sizes, counts and bandwidth formulas, following nccl-tests (doc/PERFORMANCE.md).

* ``size`` is the byte count nccl-tests prints: the buffer of allreduce, broadcast and
  reduce, the whole *gathered output* of allgather and gather (n blocks), the whole *input*
  of reduce_scatter and scatter (n blocks), and each rank's whole buffer of alltoall (n
  blocks, one per peer). ``count`` is what nccl-tests prints in its count column: the
  count argument of the call (its ``paramcount``) -- size / element size for allreduce,
  broadcast and reduce, one rank's block (size / element size / n) for the blocked ones.
* algbw = size / time; busbw = algbw * factor, with factor 2(n-1)/n for allreduce, (n-1)/n
  for allgather, reduce_scatter, gather, scatter and alltoall, 1 for broadcast and reduce.
  busbw is comparable to the hardware's bandwidth whatever the number of ranks. Barrier
  moves no data: time only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import _C

ELEMENT_SIZE: dict[str, int] = dict(_C.DTYPE_SIZES)


# Collectives that take a reduction op / a root; the others' rows give none (JSON null,
# CSV empty, "-" in the table), as nccl-tests prints "none" / -1 for them.
REDUCING = ("allreduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
# Collectives whose size is n blocks (one per rank): rounded to a multiple of n elements.
BLOCKED = ("allgather", "reduce_scatter", "gather", "scatter", "alltoall")
# Per rank (in_count, out_count) of a blocked collective of `count` elements, k = count / n.
_IN_OUT = {"allgather": lambda c, k: (k, c), "gather": lambda c, k: (k, c),
           "reduce_scatter": lambda c, k: (c, k), "scatter": lambda c, k: (c, k),
           "alltoall": lambda c, k: (c, c)}


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw for `op` on `world` ranks (nccl-tests)."""
    n = max(1, int(world))
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in BLOCKED:
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    if op == "barrier":
        return 0.0
    raise ValueError(f"unknown collective {op!r}")


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes per second, as nccl-tests)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw_gbps(op: str, world: int, size_bytes: int, seconds: float) -> float:
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, world)


def median(xs: list[float]) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = len(s) // 2
    return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): the smallest value with at least q% of the
    samples at or below it; with 20 samples p99 is the maximum."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return s[k - 1]


@dataclass(frozen=True)
class Case:
    """One message size of one collective, rounded as nccl-tests rounds it."""

    op: str
    size: int  # bytes, nccl-tests convention (see module docstring)
    count: int  # elements in `size`
    in_count: int  # elements each rank passes in
    out_count: int  # elements each rank gets out

    blocks: int = 1  # n for the blocked collectives (one block per rank)

    @property
    def param_count(self) -> int:
        """nccl-tests' count column: the call's count argument (one block when blocked)."""
        return self.count // self.blocks


def make_case(op: str, requested: int, dtype: str, world: int) -> Case:
    """Round `requested` bytes down to whole elements (and whole blocks of n for the
    blocked collectives), at least one element per rank."""
    es, n = ELEMENT_SIZE[dtype], max(1, world)
    if op == "barrier":
        return Case(op, 0, 0, 0, 0)
    count = max(1, requested // es)
    if op in BLOCKED:
        count = max(n, count // n * n)
        return Case(op, count * es, count, *_IN_OUT[op](count, count // n), blocks=n)
    if op in ("allreduce", "broadcast", "reduce"):
        return Case(op, count * es, count, count, count)
    raise ValueError(f"unknown collective {op!r}")


def combinations(ops: list[str], dtypes: list[str],
                 redops: list[str]) -> list[tuple[str, str, str]]:
    """(collective, dtype, reduction) triples a sweep measures, in order: every dtype of
    every collective but barrier (which moves no data: once, with the first dtype), every
    reduction of the REDUCING ones only (the others carry the first, which they ignore)."""
    out = []
    for op in ops:
        for dtype in dtypes[:1] if op == "barrier" else dtypes:
            for redop in redops if op in REDUCING else redops[:1]:
                out.append((op, dtype, redop))
    return out


def combo_key(op: str, dtype: str | None, redop: str | None) -> tuple:
    """(op, type, redop) with what the collective does not take as None (as in the JSON)."""
    return (op, dtype if op != "barrier" else None, redop if op in REDUCING else None)


def make_cases(op: str, sizes: list[int], dtype: str, world: int) -> list[Case]:
    """Cases for a sweep, duplicates (after rounding) dropped; barrier runs once."""
    if op == "barrier":
        return [make_case(op, 0, dtype, world)]
    seen, out = set(), []
    for s in sizes:
        c = make_case(op, s, dtype, world)
        if c.size not in seen:
            seen.add(c.size)
            out.append(c)
    return out


@dataclass
class Row:
    """Result of one library at one size: per-iteration times (max over ranks)."""

    op: str
    lib: str
    size: int
    count: int
    dtype: str | None  # None (JSON null): barrier's; redop/root: None where the op takes none
    redop: str | None
    root: int | None
    algo: str
    world: int
    times: list[float] = field(default_factory=list)  # seconds
    wrong: int | None = None  # None: not checked

    @property
    def key(self) -> tuple:
        """(op, type, redop), None where the collective takes none: which rows of different
        libraries measured the same thing (with the size)."""
        return combo_key(self.op, self.dtype, self.redop)

    @property
    def time_us(self) -> float:
        return median(self.times) * 1e6

    @property
    def p99_us(self) -> float:
        return percentile(self.times, 99) * 1e6

    @property
    def algbw(self) -> float:
        return algbw_gbps(self.size, median(self.times)) if self.op != "barrier" else 0.0

    @property
    def busbw(self) -> float:
        return busbw_gbps(self.op, self.world, self.size, median(self.times)) \
            if self.op != "barrier" else 0.0

    def as_dict(self, with_times: bool = True) -> dict:
        _, dtype, redop = self.key
        d = {"op": self.op, "library": self.lib, "size": self.size, "count": self.count,
             "type": dtype, "redop": redop,
             "root": self.root if self.op in ROOTED else None, "algo": self.algo,
             "world_size": self.world, "time_us": self.time_us, "p99_us": self.p99_us,
             "algbw_gbps": self.algbw, "busbw_gbps": self.busbw, "wrong": self.wrong,
             "iters": len(self.times)}
        if with_times:
            d["times_us"] = [t * 1e6 for t in self.times]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Row:
        return cls(op=d["op"], lib=d["library"], size=d["size"], count=d["count"],
                   dtype=d["type"], redop=d["redop"], root=d["root"], algo=d["algo"],
                   world=d["world_size"], times=[t * 1e-6 for t in d.get("times_us", [])],
                   wrong=d.get("wrong"))
