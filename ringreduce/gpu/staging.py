"""Staging CUDA buffers through pinned host memory, so the CPU (TCP/shm) collectives can
reduce them.

Contract of one staged collective (see route.staged):
  1. copy every device input into a pinned host buffer on the caller's stream (torch: the
     current stream of the tensor's device; other arrays: the stream their
     ``__cuda_array_interface__`` names, or the current CuPy stream),
  2. synchronize those streams (the host bytes are final; earlier work on the stream, e.g.
     the kernel that produced a gradient, is finished too),
  3. run the CPU collective on the host buffer,
  4. copy the result back on the same stream(s) and synchronize them again, so the pinned
     buffer can go back to the pool without a pending copy still reading it.

A Stager hides how steps 1, 2 and 4 are done: :class:`TorchStager` for torch tensors
(pinned torch tensors, ``copy_(non_blocking=True)`` under ``torch.cuda.stream``), and
:class:`RuntimeStager` for CuPy/Numba/DLPack arrays (``cudaHostAlloc`` and
``cudaMemcpyAsync`` through ringreduce._C.gpu). Tests swap in a CPU fake (memmove), which is
how the orchestration is checked on machines without a GPU.

Thread safety: a pool belongs to one group and is used from the threads that call
collectives; take/give hold a lock.
"""

from __future__ import annotations

import threading
from typing import Any

from . import arrays, device

_ITEMSIZE = arrays._ITEMSIZE


class HostBuf:
    """Pinned host memory: ``ptr`` (int), ``count`` elements of ``dtype``; ``obj`` owns it."""

    __slots__ = ("count", "dtype", "obj", "ptr")

    def __init__(self, obj: Any, ptr: int, dtype: str, count: int):
        self.obj, self.ptr, self.dtype, self.count = obj, ptr, dtype, count


class _PinnedBlock:
    """cudaHostAlloc'ed bytes, freed when collected."""

    def __init__(self, nbytes: int):
        self.ptr = int(arrays._gpu.host_alloc_pinned(max(int(nbytes), 1)))

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr and arrays._gpu is not None:
            arrays._gpu.host_free_pinned(ptr)


class Stager:
    """How CUDA buffers of one kind move to and from pinned host memory (interface)."""

    name = "?"

    def stream_of(self, b: arrays.CudaBuffer) -> Any:
        """The stream the copies of ``b`` are ordered on (taken at call time)."""
        raise NotImplementedError

    def alloc(self, dtype: str, count: int, device: int | None) -> HostBuf:
        raise NotImplementedError

    def to_host(self, host: HostBuf, offset: int, b: arrays.CudaBuffer, stream: Any) -> None:
        """Enqueue b -> host[offset : offset + b.count] (elements) on ``stream``."""
        raise NotImplementedError

    def to_device(self, b: arrays.CudaBuffer, host: HostBuf, offset: int, stream: Any) -> None:
        """Enqueue host[offset : offset + b.count] -> b on ``stream``."""
        raise NotImplementedError

    def synchronize(self, stream: Any) -> None:
        raise NotImplementedError


class TorchStager(Stager):
    """torch CUDA tensors: pinned torch tensors and copies on torch's current stream."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def stream_of(self, b: arrays.CudaBuffer) -> Any:
        return self.torch.cuda.current_stream(b.device)

    def alloc(self, dtype: str, count: int, device: int | None) -> HostBuf:
        t = self.torch.empty(count, dtype=getattr(self.torch, dtype), pin_memory=True)
        return HostBuf(t, int(t.data_ptr()), dtype, count)

    def to_host(self, host: HostBuf, offset: int, b: arrays.CudaBuffer, stream: Any) -> None:
        with self.torch.cuda.stream(stream):
            host.obj[offset:offset + b.count].copy_(b.obj.detach().reshape(-1),
                                                    non_blocking=True)

    def to_device(self, b: arrays.CudaBuffer, host: HostBuf, offset: int, stream: Any) -> None:
        with self.torch.cuda.stream(stream), self.torch.no_grad():
            b.obj.view(-1).copy_(host.obj[offset:offset + b.count], non_blocking=True)

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()


class RuntimeStager(Stager):
    """Any other CUDA array (CuPy, Numba, DLPack): ringreduce._C.gpu's CUDA runtime calls on
    the array's stream (an int)."""

    name = "runtime"

    def stream_of(self, b: arrays.CudaBuffer) -> Any:
        return int(b.stream)

    def alloc(self, dtype: str, count: int, device: int | None) -> HostBuf:
        block = _PinnedBlock(count * _ITEMSIZE[dtype])
        return HostBuf(block, block.ptr, dtype, count)

    def to_host(self, host: HostBuf, offset: int, b: arrays.CudaBuffer, stream: Any) -> None:
        arrays._gpu.memcpy_async(host.ptr + offset * _ITEMSIZE[b.dtype], b.ptr, b.nbytes, stream)

    def to_device(self, b: arrays.CudaBuffer, host: HostBuf, offset: int, stream: Any) -> None:
        arrays._gpu.memcpy_async(b.ptr, host.ptr + offset * _ITEMSIZE[b.dtype], b.nbytes, stream)

    def synchronize(self, stream: Any) -> None:
        arrays._gpu.stream_synchronize(stream)


def stager_status(torch_tensor: bool) -> tuple:
    """(usable, reason): can CUDA buffers of this kind be staged here?"""
    if torch_tensor:
        import torch

        if not torch.cuda.is_available():
            return False, ("torch sees no CUDA device (torch.cuda.is_available() is False): "
                           "no CUDA device or driver, or a CPU-only torch build")
        return True, "torch CUDA runtime"
    if not device.built_with_cuda():
        return False, ("this ringreduce build has no CUDA (nvcc was not found at install time, "
                       "or RINGREDUCE_CUDA=0); reinstall with nvcc on PATH and RINGREDUCE_CUDA=1, "
                       "or pass torch CUDA tensors")
    return device.cuda_status()


def make_stager(torch_tensor: bool) -> Stager:
    """The stager for a kind of CUDA buffer. Raises CudaUnavailable with the reason when that
    kind cannot be staged here (tests replace this function with a CPU fake)."""
    ok, reason = stager_status(torch_tensor)
    if not ok:
        raise arrays.CudaUnavailable(
            f"cannot stage CUDA buffers through host memory: {reason}; move the data to the "
            f"CPU first (.cpu() / cupy.asnumpy) or fix the CUDA set-up")
    return TorchStager() if torch_tensor else RuntimeStager()


class HostPool:
    """Pinned host buffers per (dtype, count), reused across calls (pinning is slow). A
    buffer is out of the pool while a collective uses it, so concurrent async calls of the
    same size get different buffers. Keeps at most ``keep`` idle buffers per key."""

    def __init__(self, stager: Stager, keep: int = 4):
        self.stager = stager
        self.keep = keep
        self._free: dict = {}
        self._lock = threading.Lock()

    def take(self, dtype: str, count: int, device: int | None) -> HostBuf:
        with self._lock:
            idle = self._free.get((dtype, count))
            if idle:
                return idle.pop()
        return self.stager.alloc(dtype, count, device)

    def give(self, buf: HostBuf) -> None:
        with self._lock:
            idle = self._free.setdefault((buf.dtype, buf.count), [])
            if len(idle) < self.keep:
                idle.append(buf)

    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._free.values())

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
