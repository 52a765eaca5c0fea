"""Rooted and personalised collectives: reduce, gather, scatter, all_to_all.

Each runs natively in the C++ core and moves the minimum bytes: reduce on a binomial tree
(each rank sends once; the shared-memory all-reduce when every rank shares a host), gather
and scatter directly between the root and each rank, all_to_all as a pairwise exchange
(each block crosses the wire once). `dst`/`src` are world ranks, as in torch; `group=`
selects a group (default: the world).
"""

from __future__ import annotations

from typing import Any

import numpy as _np

from . import _buffers, _state
from ._buffers import as_buffer, op_code
from ._work import Work, _finish


def _host_only(what: str, *xs: Any) -> None:
    for x in xs:
        if x is None or type(x) is _np.ndarray:
            continue
        if isinstance(x, _buffers.torch_tensor_type()):  # (a sparse CSR tensor's
            cuda = x.is_cuda  # __cuda_array_interface__ raises RuntimeError, not AttributeError)
        else:
            cuda = getattr(x, "is_cuda", False) or hasattr(x, "__cuda_array_interface__")
        if cuda:
            raise ValueError(f"{what}: CUDA buffers are not supported by this collective yet; "
                             f"copy to the host (.cpu()) or use torch.distributed with NCCL")


def reduce(x: Any, dst: int, op: Any = "sum", group: Any = None,
           async_op: bool = False) -> Work | None:
    """Reduce `x` over the group's ranks into `x` on world rank `dst` (in place there);
    the other ranks' `x` is left as it was. op: as for allreduce."""
    g = _state.resolve(group, "reduce()")
    root = g.group_rank(dst, "reduce dst")
    _host_only("reduce(x)", x)
    b = as_buffer(x, "reduce(x)")
    opc = op_code(op)
    _buffers.check_reduction(b, opc)
    if g.comm is None:
        return _finish(None, (), async_op=async_op)
    return _finish(g.comm.reduce(b.ptr, b.count, b.code, opc, root, async_op), (x,),
                   async_op=async_op)


def gather(x: Any, dst: int, out: Any = None, group: Any = None,
           async_op: bool = False) -> Any:
    """Gather every rank's `x` on world rank `dst` into `out` of shape (size, *x.shape)
    (allocated there when None). Returns `out` on dst and None elsewhere (a Work whose
    result() is that when async)."""
    g = _state.resolve(group, "gather()")
    root = g.group_rank(dst, "gather dst")
    _host_only("gather", x, out)
    b = as_buffer(x, "gather(x)", writable=False)
    if g.rank == root:
        if out is None:
            out = _buffers.empty_like_shape(x, (g.world_size,) + b.shape)
        o = as_buffer(out, "gather(out)")
        if o.count != b.count * g.world_size or o.dtype != b.dtype:
            raise ValueError(
                f"gather: out must hold size * x.numel() = {b.units() * g.world_size} elements "
                f"of {b.dtype}, got {o.units()} of {o.dtype}")
        optr = o.ptr
    else:
        out, optr = None, 0
    if g.comm is None:
        _copy_into(out, x)
        return Work(None, result=out) if async_op else out
    cw = g.comm.gather(b.ptr, optr, b.count, b.code, root, async_op)
    if async_op:
        return Work(cw, (x, out), result=out)
    return out


def scatter(out: Any, src: int, x: Any = None, group: Any = None,
            async_op: bool = False) -> Any:
    """World rank `src` splits `x` (shape (size, *out.shape), needed on src only) and rank
    r of the group receives block r into `out`. Returns `out` (a Work when async)."""
    g = _state.resolve(group, "scatter()")
    root = g.group_rank(src, "scatter src")
    _host_only("scatter", out, x)
    o = as_buffer(out, "scatter(out)")
    if g.rank == root:
        if x is None:
            raise ValueError("scatter: the source rank must pass x (shape (size, *out.shape))")
        b = as_buffer(x, "scatter(x)", writable=False)
        if b.count != o.count * g.world_size or b.dtype != o.dtype:
            raise ValueError(
                f"scatter: x must hold size * out.numel() = {o.units() * g.world_size} elements "
                f"of {o.dtype}, got {b.units()} of {b.dtype}")
        ob = _buffers.overlap(b, o)
        if ob and o.ptr != b.ptr + root * ob:  # peers would read what the root writes
            raise ValueError(
                f"scatter: out overlaps x in memory other than as x's own block {root} (the "
                "source's); pass a separate out, or that block (x[rank]) to scatter in place")
        iptr = b.ptr
    else:
        iptr = 0
    if g.comm is None:
        _copy_into(out, x.reshape(out.shape) if x is not None else out)
        return Work(None, result=out) if async_op else out
    cw = g.comm.scatter(iptr, o.ptr, o.count, o.code, root, async_op)
    if async_op:
        return Work(cw, (x, out), result=out)
    return out


def all_to_all(x: Any, out: Any = None, send_counts: Any = None, recv_counts: Any = None,
               group: Any = None, async_op: bool = False) -> Any:
    """torch's all_to_all_single: rank r sends block p of `x` (along dim 0) to rank p and
    receives rank p's block r into block p of `out`. Without counts the blocks are equal
    (x.shape[0] divisible by the group size); send_counts / recv_counts give each block's
    number of dim-0 rows (they must match what the peers send). Returns `out` (allocated
    like x when None; a Work when async)."""
    g = _state.resolve(group, "all_to_all()")
    n = g.world_size
    _host_only("all_to_all", x, out)
    b = as_buffer(x, "all_to_all(x)", writable=False)
    rows = b.shape[0] if b.shape else 1
    per_row = _row_elems(b)
    sc = _counts(send_counts, rows, n, "send_counts", "x")
    if out is None:
        rrows = sum(sc) if recv_counts is None else sum(_as_ints(recv_counts, n, "recv_counts"))
        out = _buffers.empty_like_shape(x, (rrows,) + tuple(b.shape[1:]))
    o = as_buffer(out, "all_to_all(out)")
    orows = o.shape[0] if o.shape else 1  # (n, 0): n empty rows, as x's
    rc = _counts(recv_counts, orows, n, "recv_counts", "out")
    # From the shapes, also when out has no elements: rows of 0 elements where x's have some
    # would take the peers' blocks past its end.
    if o.dtype != b.dtype or _row_elems(o) != per_row:
        raise ValueError(f"all_to_all: out must be {b.dtype} with rows of {per_row} elements "
                         f"like x; got {o.dtype} of shape {o.shape}")
    if g.rank < n and sc[g.rank] != rc[g.rank]:
        raise ValueError(f"all_to_all: this rank sends itself {sc[g.rank]} rows but expects "
                         f"{rc[g.rank]} from itself; the counts must agree")
    scount = [c * per_row for c in sc]
    rcount = [c * per_row for c in rc]
    soff = [sum(scount[:p]) for p in range(n)]
    roff = [sum(rcount[:p]) for p in range(n)]
    _check_apart(b, o)
    if g.comm is None:
        _copy_into(out, x)
        return Work(None, result=out) if async_op else out
    cw = g.comm.alltoall(b.ptr, scount, soff, o.ptr, rcount, roff, b.code, async_op)
    if async_op:
        return Work(cw, (x, out), result=out)
    return out


def _row_elems(b: Any) -> int:
    """Elements per dim-0 row of buffer `b` (reals: a complex counts 2), from its shape: also
    when it has no rows (it sends nothing, yet may receive). A 0-d buffer is one row."""
    return int(_np.prod(b.shape[1:], dtype=_np.int64)) * (2 if b.complex else 1)


def _as_ints(v: Any, n: int, name: str) -> list[int]:
    import operator

    try:  # index(): ints (numpy's, a 0-d integer tensor's) only; 2.7 is no count
        out = [operator.index(c) for c in v]
    except TypeError:
        raise TypeError(f"all_to_all: {name} must be a sequence of {n} ints, got {v!r}") from None
    if len(out) != n or any(c < 0 for c in out):
        raise ValueError(f"all_to_all: {name} needs {n} counts >= 0 (one per rank), got {out}")
    return out


def _check_apart(b: Any, o: Any) -> None:
    """all_to_all cannot run in place: blocks are written while others are still being
    sent (MPI forbids the aliasing too). Refused before anything moves."""
    if _buffers.overlap(b, o):
        raise ValueError("all_to_all: out overlaps x in memory; pass a separate out (or "
                         "None for a new one), then copy back if needed")


def _counts(v: Any, rows: int, n: int, name: str, what: str) -> list[int]:
    if v is None:
        if rows % n:
            raise ValueError(f"all_to_all: {what} has {rows} rows along dim 0, not a multiple of "
                             f"the group size {n}; pass {name} (rows per rank)")
        return [rows // n] * n
    out = _as_ints(v, n, name)
    if sum(out) != rows:
        raise ValueError(f"all_to_all: {name} {out} sum to {sum(out)} but {what} has {rows} "
                         f"rows along dim 0")
    return out


def _copy_into(dst: Any, src: Any) -> None:
    if dst is not None and dst is not src:
        _buffers.copy_flat(dst, src)
