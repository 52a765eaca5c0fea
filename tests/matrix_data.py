"""Buffers, rank-dependent inputs and numpy reference answers for the collective workers
(tests/workers.py, tests/error_workers.py, tests/wire_workers.py, tests/fuzz_workers.py).

pattern() is a pure function of (dtype, op, rank, index), so every rank can compute every
other rank's input and hence the exact answer without trusting the library.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np
import torch

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
          "bool", "int16", "uint16", "uint32", "uint64"]
FLOATS = ("float32", "float64", "float16", "bfloat16")
BITWISE = ("band", "bor", "bxor")
OPS = ["sum", "avg", "prod", "min", "max", *BITWISE]
GUARD = 5  # elements of sentinel on each side of every buffer handed to the library
SENTINEL = 0x5A

_ES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
       "int32": 4, "int64": 8, "bool": 1, "int16": 2, "uint16": 2, "uint32": 4, "uint64": 8}


def refused(dtype: str, op: str) -> bool:
    """Combinations the library must refuse before any byte moves: bitwise ops on floats,
    avg on bool (avg on integers is exact: see reduce_np)."""
    return (op in BITWISE and dtype in FLOATS) or (op == "avg" and dtype == "bool")


# ---------------------------------------------------------------------------- buffers


def tdtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def storage_np(dtype: str) -> np.dtype:
    """The numpy dtype holding values of `dtype` exactly (bfloat16 values live in float32)."""
    return np.dtype(np.float32 if dtype == "bfloat16" else dtype)


def raw_bytes(x: Any) -> bytes:
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(x).tobytes()


def values(x: Any) -> np.ndarray:
    """x's values as a numpy array of storage_np(dtype) (a copy)."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()
    return np.array(x, copy=True)


def digest(x: Any) -> str:
    return hashlib.sha256(raw_bytes(x)).hexdigest()[:32]


class Buf:
    """A tensor/array view of n elements with GUARD sentinel elements on each side, so
    writes outside the buffer are caught. `view` is what the library gets (it has a
    non-zero storage offset / is a slice, as real model buffers often are)."""

    def __init__(self, dtype: str, container: str, n: int, shape: tuple | None = None,
                 vals: np.ndarray | None = None, raw: np.ndarray | None = None):
        self.dtype, self.container, self.n, self.es = dtype, container, n, _ES[dtype]
        total = n + 2 * GUARD
        if container == "numpy":
            if dtype == "bfloat16":
                raise ValueError("numpy has no bfloat16")
            self.base = np.empty(total, dtype=dtype)
            self.base.view(np.uint8)[:] = SENTINEL
            v = self.base[GUARD:GUARD + n]
            if raw is not None:
                v.view(np.uint8)[:] = raw
            elif vals is not None:
                v[...] = vals.astype(dtype)
        else:
            self.base = torch.empty(total, dtype=tdtype(dtype))
            self.base.view(torch.uint8).fill_(SENTINEL)
            v = self.base[GUARD:GUARD + n]
            if raw is not None:
                v.view(torch.uint8).copy_(torch.from_numpy(np.ascontiguousarray(raw)))
            elif vals is not None:
                v.copy_(torch.from_numpy(np.ascontiguousarray(vals)).to(tdtype(dtype)))
        self.view = v.reshape(shape) if shape is not None else v

    def guard_errors(self) -> list[str]:
        b = raw_bytes(self.base)
        g = GUARD * self.es
        errs = []
        if any(c != SENTINEL for c in b[:g]):
            errs.append("wrote before the start of the buffer")
        if any(c != SENTINEL for c in b[len(b) - g:]):
            errs.append("wrote past the end of the buffer")
        return errs


def rand_bytes(seed: list, n_bytes: int, dtype: str | None = None) -> np.ndarray:
    """Random bytes; for bool only 0 and 1 (other bytes are not valid bools to torch)."""
    b = np.random.default_rng(seed).integers(0, 256, n_bytes, dtype=np.uint8)
    return b & np.uint8(1) if dtype == "bool" else b


# ----------------------------------------------------------------- inputs and answers

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)


def pattern(dtype: str, op: str, rank: int, n: int, salt: int = 0) -> np.ndarray:
    """Rank r's input: exact in `dtype`, chosen so that float sums/products of up to 17
    ranks are exact even in 16-bit floats (so results can be compared bit for bit), while
    integers cover the full range (so sums and products wrap)."""
    i = np.arange(n, dtype=np.int64) + salt * 7919
    r = rank
    if dtype in FLOATS:
        if op in ("sum", "avg"):
            v = (((i * 7 + r * 13) % 17) - 8) / 4.0  # quarters in [-2, 2]
        elif op == "prod":
            table = np.array([1.0, -1.0, 2.0, -0.5, 0.5, 1.0, -2.0, 1.0, 0.25, 0.0])
            v = table[(i * 3 + r * 7 + (i // 10)) % 10]
        else:
            v = (((i * 31 + r * 17) % 101) - 50) * 0.5
        return v.astype(storage_np(dtype))
    if dtype == "bool":
        u = i.astype(np.uint64) * _M1 + np.uint64(r + 1) * _M2
        return ((u >> np.uint64(40)) & np.uint64(1)).astype(np.bool_)
    if op == "prod":  # small factors, still enough to wrap
        if dtype in ("int16", "uint16"):
            return ((i * 3 + r * 5) % 61 - (30 if dtype == "int16" else 0)).astype(dtype)
        if dtype == "uint32":
            return ((i * 7919 + r * 104729) % 65536).astype(np.uint32)
        if dtype == "uint64":
            return ((i * 7919 + r * 104729) % (1 << 21)).astype(np.uint64)
        if dtype == "int8":
            return ((i * 3 + r * 5) % 7 - 3).astype(np.int8)
        if dtype == "uint8":
            return ((i * 3 + r * 5) % 7).astype(np.uint8)
        if dtype == "int32":
            return ((i * 7919 + r * 104729) % 65536 - 32768).astype(np.int32)
        return ((i * 7919 + r * 104729) % (1 << 21) - (1 << 20)).astype(np.int64)
    u = i.astype(np.uint64) * _M1 + np.uint64(r + 1) * _M2
    if dtype in ("int64", "uint64"):
        return u.view(dtype).copy()
    return (u >> np.uint64(32)).astype(dtype)  # C cast: keeps the low bits (wraps)


def reduce_np(dtype: str, op: str, inputs: list[np.ndarray], world: int) -> np.ndarray:
    """The reference reduction, in storage_np(dtype): floats in float64 then rounded once,
    integers in their own type with wrap-around, avg on integers = the exact mean (of the
    unbounded sum) rounded toward zero, as NCCL's. (Over TCP the library may round 16-bit partial sums once per hop; the
    pattern() inputs keep every partial sum exact, so the answer is the same.)"""
    if dtype in FLOATS:
        a = np.stack([x.astype(np.float64) for x in inputs])
        with np.errstate(all="ignore"):
            if op in ("sum", "avg"):
                res = a.sum(axis=0)
                if op == "avg":
                    res = res / world
            elif op == "prod":
                res = a.prod(axis=0)
            elif op == "min":
                res = a.min(axis=0)
            else:
                res = a.max(axis=0)
        return round_to(dtype, res)
    if dtype == "bool":  # or, and, xor (as torch's NCCL backend reduces bool)
        fn = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or,
              "prod": np.logical_and, "min": np.logical_and, "band": np.logical_and,
              "bxor": np.logical_xor}[op]
        return functools.reduce(fn, inputs).astype(np.bool_)
    fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
          "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or,
          "bxor": np.bitwise_xor}[op]
    with np.errstate(all="ignore"):
        res = functools.reduce(fn, inputs)
    if op == "avg":  # Python ints: no wrap-around; int() rounds the quotient toward zero
        total = sum(x.astype(object) for x in inputs)
        exact = [_trunc_div(int(t), world) for t in total]
        return np.array(exact, dtype=object).astype(dtype)
    return res.astype(dtype)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


def round_to(dtype: str, x64: np.ndarray) -> np.ndarray:
    """Round float64 values to `dtype` (round to nearest even); bfloat16 as float32."""
    if dtype == "bfloat16":
        # float64 -> float32 -> bfloat16: double rounding is harmless here (24 >= 2*8+2).
        return torch.from_numpy(x64.astype(np.float32)).to(torch.bfloat16).float().numpy()
    return x64.astype(dtype)


def compare_exact(got: np.ndarray, exp: np.ndarray, what: str) -> list[str]:
    if got.shape != exp.shape:
        return [f"{what}: shape {got.shape}, expected {exp.shape}"]
    if got.dtype.kind == "f":
        bad = ~((got == exp) | (np.isnan(got) & np.isnan(exp)))
    else:
        bad = got != exp
    if not bad.any():
        return []
    idx = np.flatnonzero(bad.reshape(-1))
    g, e = got.reshape(-1), exp.reshape(-1)
    k = int(idx[0])
    return [(f"{what}: {idx.size} of {got.size} elements wrong; first at [{k}]: "
            f"got {g[k]!r}, expected {e[k]!r}")]


def compare_close(got64: np.ndarray, exp64: np.ndarray, tol: np.ndarray, what: str) -> list[str]:
    err = np.abs(got64 - exp64)
    bad = ~(err <= tol)
    if not bad.any():
        return []
    k = int(np.flatnonzero(bad)[0])
    return [(f"{what}: {int(bad.sum())} of {got64.size} elements outside tolerance; first at "
            f"[{k}]: got {got64[k]!r}, expected {exp64[k]!r} (tol {tol[k]:.3g})")]


def container_for(dtype: str, k: int) -> str:
    return "torch" if dtype == "bfloat16" or k % 2 else "numpy"
