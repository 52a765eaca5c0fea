"""DDP communication hooks, with torch's signature: ``hook(state, bucket) -> Future``.

A hook receives a GradBucket whose flat buffer holds the bucket's local gradients (not yet
divided by the world size) and returns a torch.futures.Future whose value is the reduced
flat tensor (or a one-element list holding it) with the same number of elements. The
wrapper copies that value back into the bucket. Hooks are called in bucket-index order on
every rank, so any collectives they issue are matched across ranks.

Built-ins: allreduce_hook (what the wrapper does without a hook), fp16_compress_hook and
bf16_compress_hook (halve the bytes on the wire: over TCP the partial sums travel as 16 bits
too, each hop adding in fp32 and rounding once; RINGREDUCE_HALF_WIRE=32 sends fp32 partials
and rounds once, for 1.5x the ring's bytes).
A hook of your own returns ``rr.allreduce(t, async_op=True, group=bucket._group)
.get_future()`` (or ``allreduce_future(t, op, group)``), as torch's return
``dist.all_reduce(t, async_op=True).get_future()``; torch's own hooks work too when a torch
process group is initialised (e.g. with the "ringreduce" backend).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .. import api
from .._futures import future_of

__all__ = [
    "GradBucket",
    "allreduce_future",
    "allreduce_hook",
    "bf16_compress_hook",
    "fp16_compress_hook",
    "noop_hook",
]

CommHook = Callable[[Any, "GradBucket"], torch.futures.Future]


class GradBucket:
    """What a comm hook sees of one bucket (the API of torch.distributed.GradBucket)."""

    def __init__(self, index: int, buffer: torch.Tensor, gradients: list, parameters: list,
                 is_last: bool, world_size: int, group: Any = None):
        self._index = index
        self._buffer = self._first = buffer  # _first: the buffer the gradients view
        self._gradients = gradients
        self._parameters = parameters
        self._is_last = is_last
        self._world_size = world_size
        self._group = group  # the DDP wrapper's process_group (None: the world)

    def index(self) -> int:
        """Bucket index: 0 is the first bucket reduced in backward."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat 1-D buffer of the bucket's gradients."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the bucket's buffer: buffer() returns `buffer` from now on, in its dtype,
        as torch's (fp16_compress_wrapper swaps in a float16 copy and reduces that). The
        gradients take the hook's result, whatever buffer() is by then."""
        if not isinstance(buffer, torch.Tensor):
            raise TypeError(f"set_buffer takes a tensor, got {type(buffer).__name__}")
        self._buffer = buffer

    def gradients(self) -> list:
        """Per-parameter views into buffer(), shaped like the parameters -- of the buffer
        set_buffer() put in, too, as torch's (fp16_compress_wrapper(powerSGD_hook) reads
        both: the views of the float32 buffer were stale there; the review)."""
        if not self._gradients or self._buffer is self._first:
            return list(self._gradients)
        base = self._first.storage_offset()
        return [self._buffer[g.storage_offset() - base:][:g.numel()].view(g.shape)
                for g in self._gradients]

    def parameters(self) -> list:
        """The parameters whose gradients are in this bucket, in bucket order."""
        return list(self._parameters)

    def is_last(self) -> bool:
        """True for the last bucket reduced in this iteration."""
        return self._is_last

    def world_size(self) -> int:
        return self._world_size


def _div_world(state: Any, bucket: GradBucket) -> int:
    ws = getattr(state, "world_size", None)
    if ws is None and hasattr(state, "size"):
        try:
            ws = state.size()  # a torch ProcessGroup passed as state, as torch's hooks take
        except TypeError:
            ws = None
    return int(ws) if ws else bucket.world_size()


def allreduce_future(tensor: torch.Tensor, op: str = "sum",
                     group: Any = None) -> torch.futures.Future:
    """Start an async ringreduce all-reduce of `tensor` (in place, over `group`: default the
    world) and return a Future whose value is ``[tensor]`` -- the building block for custom
    DDP comm hooks, like ``dist.all_reduce(t, async_op=True).get_future()`` with torch's
    process groups."""
    return future_of(api.allreduce(tensor, op=op, async_op=True, group=group), [tensor])


def _group(state: Any, bucket: GradBucket) -> Any:
    """The group a built-in hook reduces over: `state` when it is a ringreduce Group (as
    torch's hooks take a process group), else the DDP wrapper's."""
    from .._state import Group

    return state if isinstance(state, Group) else bucket._group


def allreduce_hook(state: Any, bucket: GradBucket) -> torch.futures.Future:
    """Average the bucket over ranks (in place)."""
    buf = bucket.buffer()
    buf.div_(_div_world(state, bucket))
    return allreduce_future(buf, "sum", _group(state, bucket))


def _compress_hook(dtype: torch.dtype) -> CommHook:
    def hook(state: Any, bucket: GradBucket) -> torch.futures.Future:
        buf = bucket.buffer()
        compressed = buf.to(dtype).div_(_div_world(state, bucket))
        fut = allreduce_future(compressed, "sum", _group(state, bucket))

        def decompress(f: torch.futures.Future) -> torch.Tensor:
            buf.copy_(f.value()[0])
            return buf

        return fut.then(decompress)

    hook.__name__ = f"{str(dtype).replace('torch.', '')}_compress_hook"
    return hook


fp16_compress_hook = _compress_hook(torch.float16)
fp16_compress_hook.__doc__ = """Send the bucket as float16: cast, divide by the world size,
all-reduce, cast back into the bucket. Halves the bytes on the wire; tolerance ~1e-3."""
bf16_compress_hook = _compress_hook(torch.bfloat16)
bf16_compress_hook.__doc__ = """Send the bucket as bfloat16 (fp32's range, 8 bits of
mantissa): cast, divide by the world size, all-reduce, cast back into the bucket."""


def noop_hook(state: Any, bucket: GradBucket) -> torch.futures.Future:
    """No communication: each rank keeps its local gradients (for measuring overhead)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut
