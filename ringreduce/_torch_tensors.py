"""The torch backend's view of a call's tensors (ringreduce.backend): contiguous buffers
sharing the caller's memory where they can, the copies back where they cannot, and the
checks torch words its own way -- before anything moves."""

from __future__ import annotations

import ctypes
from typing import Callable

import torch


def _same_dtype(what: str, output: torch.Tensor, input: torch.Tensor) -> None:
    """In torch's names (the native API's check would name its own allgather's `out`)."""
    if output.dtype != input.dtype:
        raise ValueError(f"{what}: output is {output.dtype} but input is {input.dtype}; they "
                         f"must have the same dtype")


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A float8 tensor (torch.float8_*: no dtype of the core) as the uint8 view of its
    memory, for point-to-point messages, which only move bytes (gloo's send/recv take
    them; pipelines send fp8 activations). Other tensors as they are."""
    if t.dtype.is_floating_point and t.element_size() == 1 and t.layout is torch.strided:
        return t.view(torch.uint8)
    return t


def _inplace(t: torch.Tensor, written: bool = True
             ) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """A contiguous tensor sharing memory with `t` when possible (plus the copy-back needed
    when it is not); .detach() so in-place collectives on parameters are allowed. A tensor
    the collective writes must not have elements sharing memory (expand()): refused here,
    before anything moves (the copy-back would fail after the data moved)."""
    _usable(t, written)
    d = t.detach()
    if d.is_contiguous():
        return d, None
    tmp = d.contiguous()

    def back() -> None:
        with torch.no_grad():
            d.copy_(tmp)
    return tmp, back


def _usable(t: torch.Tensor, written: bool = True) -> None:
    """_inplace's checks alone (a coalesced call checks every pair before the first moves)."""
    if t.device.type != "cpu":
        raise ValueError(f"the ringreduce backend handles CPU tensors; got one on {t.device} "
                         f"(use nccl for CUDA tensors: init_process_group('cpu:ringreduce,"
                         f"cuda:nccl'))")
    if t.layout is not torch.strided:
        raise ValueError(f"the ringreduce backend handles dense tensors; got a {t.layout} one "
                         f"(call .to_dense() first; all_reduce takes sparse COO tensors, summed)")
    if written and not t.is_contiguous():
        _writable(t)


def _writable(t: torch.Tensor, where: str = "") -> None:
    """Refuse a tensor the collective writes whose elements share memory (expand()), before
    anything moves (the copy into it would fail after the data moved). where: which one of
    a list, for the message."""
    if torch._debug_has_internal_overlap(t) == 1:
        raise ValueError(f"the collective writes its result into a tensor{where} whose "
                         f"elements share memory (strides {tuple(t.stride())}, e.g. from "
                         f"expand()); pass a tensor with its own memory (.clone() / "
                         f".contiguous())")


def _outputs(what: str, name: str, ts: list) -> None:
    """Every tensor of an output list (all_gather's, gather's, all_to_all's) writable."""
    for i, t in enumerate(ts):
        _writable(t, f" ({what}: {name}[{i}])")


def _same_dtypes(what: str, name: str, ts: list, like: torch.Tensor, like_name: str) -> None:
    """Every tensor of a list of like's dtype (torch.cat would promote a mixed list, and the
    copy out cast it back: values changed without a word; gloo refuses it)."""
    for i, t in enumerate(ts):
        if t.dtype != like.dtype:
            raise ValueError(f"{what}: {name}[{i}] is {t.dtype} but {like_name} is "
                             f"{like.dtype}; every tensor must have the same dtype")


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst (written under no_grad) = src's elements, on this thread alone (a memmove) where
    both are contiguous of one dtype: torch's copy_ and cat spread over its OpenMP threads,
    which, with ranks oversubscribing the cores (mp.spawn leaves OMP_NUM_THREADS unset),
    took 12 ms for 1 MiB -- a list all_gather 5x slower than gloo (found by a helper)."""
    n = dst.numel() * dst.element_size()
    if (dst.dtype == src.dtype and dst.numel() == src.numel() and dst.is_contiguous()
            and src.is_contiguous() and dst.device.type == src.device.type == "cpu"
            and not (src.is_neg() or src.is_conj() or dst.is_neg() or dst.is_conj())):
        # (a lazy negative / conjugate view's memory holds the values before it: copy_
        # resolves it, a memmove would not -- found by a review)
        if n:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), n)  # releases the GIL
    else:
        with torch.no_grad():
            dst.copy_(src.reshape(dst.shape))


def _flat(ts: list) -> torch.Tensor:
    """The tensors' elements one after another (torch.cat of their flattened views, as
    _copy does it); they share the first one's dtype (checked by the callers)."""
    out = torch.empty(sum(t.numel() for t in ts), dtype=ts[0].dtype if ts else torch.float32)
    off = 0
    for t in ts:
        _copy(out[off:off + t.numel()], t.detach().reshape(-1))
        off += t.numel()
    return out


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share bytes (views of one storage may lie apart)."""
    from ._buffers import spans_overlap

    return spans_overlap(a.data_ptr(), a.numel() * a.element_size(),
                         b.data_ptr(), b.numel() * b.element_size())


def _chain(*fns: Callable[[], None] | None) -> Callable[[], None] | None:
    fs = [f for f in fns if f is not None]
    if not fs:
        return None

    def run() -> None:
        for f in fs:
            f()
    return run
