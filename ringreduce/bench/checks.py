"""Buffers for one case, filled with rank-dependent values, and what every rank must get back.

Rank r's input element i is a hash of (r, i) mapped to 1..4: small integers, so sums and
products are exact in every dtype, and -- being different for every rank and position, not
periodic -- a block that went to the wrong place or rank shows up as wrong (with
((r + i) % 4) + 1, every sum over 4 ranks was 10 and 2 ranks' sums repeated every 4
elements: a rotated result or swapped blocks passed).
Floating-point results are compared with a tolerance of a few ulps of the dtype (the
reduction order and avg's division may round differently); integers must match exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .cli import DTYPES
from .metrics import Case

# uint16/32/64 came with torch 2.3 (pyproject allows 2.1): the CLI refuses what is missing
TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES if hasattr(torch, name)}


_PATTERN_STEP = 1 << 20  # elements mixed at a time: int64 temporaries of 8 MiB, not 8x count


def pattern(rank: int, count: int, dtype: torch.dtype = torch.int64, start: int = 0,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """Rank `rank`'s input elements start..start+count-1 (1..4; a 32-bit mix of rank and
    index) as `dtype` (into `out` if given), mixed in steps: whole-size int64 temporaries
    took 2 GiB more than a 64 MiB int8 buffer."""
    out = torch.empty(count, dtype=dtype) if out is None else out
    for lo in range(0, count, _PATTERN_STEP):
        hi = min(count, lo + _PATTERN_STEP)
        out[lo:hi] = _mix(rank, start + lo, start + hi)
    return out


def _patterns(ranks: Iterable[int], count: int, dtype: torch.dtype,
              start: int = 0) -> torch.Tensor:
    """The ranks' pattern() blocks (each `count` from `start`) one after another, written in
    place (torch.cat of whole patterns held n + 1 buffers at once)."""
    ranks = list(ranks)
    out = torch.empty(count * len(ranks), dtype=dtype)
    for i, r in enumerate(ranks):
        pattern(r, count, dtype, start, out[i * count:(i + 1) * count])
    return out


def _mix(rank: int, lo: int, hi: int) -> torch.Tensor:
    """pattern()'s elements lo..hi-1, as int64."""
    m = 0xFFFFFFFF
    x = (torch.arange(lo, hi, dtype=torch.int64) * 0x9E3779B1 + rank * 0x85EBCA77
         + 0x165667B1) & m
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & m
    x = x ^ (x >> 12)
    return (x >> 7) % 4 + 1


def _reduced(count: int, redop: str, world: int, dtype: torch.dtype,
             start: int = 0) -> torch.Tensor:
    """Every rank's pattern() of `count` from `start` reduced (_reduce), step by step: its
    temporaries are a step long, not the buffer's length in int64 or float64."""
    out = torch.empty(count, dtype=dtype)
    for lo in range(0, count, _PATTERN_STEP):
        hi = min(count, lo + _PATTERN_STEP)
        out[lo:hi] = _reduce((_mix(r, start + lo, start + hi) for r in range(world)), redop,
                             world, dtype)
    return out


def _reduce(parts: Iterable[torch.Tensor], redop: str, world: int,
            dtype: torch.dtype) -> torch.Tensor:
    """Reference reduction in float64 (floats) or int64 (integers), cast once at the end.
    `parts` is consumed one tensor at a time, so only two temporaries of their size live."""
    floating = dtype.is_floating_point
    it = iter(parts)
    acc = next(it).to(torch.float64 if floating else torch.int64)
    for p in it:
        p = p.to(acc.dtype)
        if redop in ("sum", "avg"):
            acc = acc + p
        elif redop == "prod":
            acc = acc * p
        elif redop == "min":
            acc = torch.minimum(acc, p)
        elif redop == "max":
            acc = torch.maximum(acc, p)
        else:
            raise ValueError(f"unknown reduce op {redop!r}")
    if redop == "avg":
        acc = acc / world if floating else torch.div(acc, world, rounding_mode="trunc")
    return acc.to(dtype)


@dataclass
class Buffers:
    """Input/output tensors of one case on this rank; `out` is `inp` for in-place ops."""

    inp: torch.Tensor
    out: torch.Tensor
    initial: torch.Tensor | None  # what `inp` is reset to before each checked iteration
    expected: torch.Tensor | None  # None when not checking

    def reset(self) -> None:
        """Restore the input (in-place ops overwrite it) and clear a separate output."""
        if self.initial is not None:
            self.inp.copy_(self.initial)
        if self.out is not self.inp:
            self.out.zero_()


def make_buffers(case: Case, dtype: str, rank: int, world: int, redop: str, root: int,
                 check: bool) -> Buffers:
    """Allocate and fill this rank's buffers; with `check`, also the expected output."""
    td = TORCH_DTYPES[dtype]
    op = case.op
    if op == "barrier":
        empty = torch.empty(0, dtype=td)
        return Buffers(empty, empty, None, None)
    if op in ("broadcast", "scatter"):  # only the root's input matters
        inp = pattern(root, case.in_count, td) if rank == root \
            else torch.zeros(case.in_count, dtype=td)
    else:
        inp = pattern(rank, case.in_count, td)
    inplace = op in ("allreduce", "broadcast", "reduce")
    out = inp if inplace else torch.zeros(case.out_count, dtype=td)
    if not check:
        return Buffers(inp, out, None, None)
    initial = inp.clone() if inplace else None
    if op == "allreduce":
        exp = _reduced(case.count, redop, world, td)
    elif op == "broadcast":
        exp = pattern(root, case.count, td)
    elif op == "allgather":
        exp = _patterns(range(world), case.in_count, td)
    elif op == "reduce_scatter":
        k = case.out_count
        exp = _reduced(k, redop, world, td, start=rank * k)
    elif op in ("reduce", "gather"):  # only the root's result is defined
        if rank != root:
            return Buffers(inp, out, initial, None)
        exp = (_reduced(case.count, redop, world, td) if op == "reduce" else
               _patterns(range(world), case.in_count, td))
    elif op == "scatter":
        k = case.out_count
        exp = pattern(root, k, td, start=rank * k)
    elif op == "alltoall":
        k = case.count // world  # block `rank` of every rank p's input, in rank order
        exp = _patterns(range(world), k, td, start=rank * k)
    else:
        raise ValueError(f"unknown collective {op!r}")
    return Buffers(inp, out, initial, exp)


def count_wrong(result: torch.Tensor, expected: torch.Tensor | None) -> int:
    """Elements of `result` that differ from `expected` beyond the dtype's tolerance,
    compared a step at a time: whole-size float64 temporaries took 24x a float16 buffer's
    size, and an accepted -c run of 2 GiB per rank was killed for memory (a helper)."""
    if expected is None or result.numel() == 0:
        return 0
    if result.numel() != expected.numel():
        raise ValueError(f"the result has {result.numel()} elements, the expected result "
                         f"{expected.numel()}")
    result, expected = result.reshape(-1), expected.reshape(-1)
    wrong = 0
    for lo in range(0, result.numel(), _PATTERN_STEP):
        r, e = result[lo:lo + _PATTERN_STEP], expected[lo:lo + _PATTERN_STEP]
        if not result.dtype.is_floating_point:
            wrong += int((r != e).sum())
            continue
        r, e = r.to(torch.float64), e.to(torch.float64)
        tol = 4 * torch.finfo(result.dtype).eps * e.abs().clamp(min=1.0)
        wrong += int((~((r == e) | ((r - e).abs() <= tol))).sum())
    return wrong


def as_numpy(t: torch.Tensor) -> Any:
    """A numpy view of a CPU tensor (for mpi4py); bfloat16 has no numpy type."""
    if t.dtype == torch.bfloat16:
        raise TypeError("bfloat16 has no numpy/MPI datatype")
    return t.numpy()
