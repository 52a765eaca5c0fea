"""NCCL communicator: collectives on CUDA buffers through NCCL, the unique id shared through
a torch Store, every wait bounded by a timeout (a dead peer raises). Uses gpu.arrays and
gpu.device."""

from __future__ import annotations

from typing import Any, Callable

from .. import _env
from .._buffers import op_code
from .arrays import (
    _NO_GPU_MODULE,
    CudaBuffer,
    CudaUnavailable,
    _gpu,
    _is_torch_tensor,
    _torch,
    as_cuda_buffer,
    current_stream,
)
from .device import cuda_status, load_nccl, require_cuda_device


def exchange_unique_id(store: Any, rank: int, key: str,
                       make_id: Callable[[], bytes] | None = None) -> bytes:
    """Rank 0 creates the NCCL unique id and publishes it under ``key``; the others read it
    (torch Store.get blocks until it is set, up to the store's timeout)."""
    if rank == 0:
        uid = bytes(make_id() if make_id is not None else _gpu.nccl_unique_id())
        store.set(key, uid)
        return uid
    uid = bytes(store.get(key))
    if len(uid) != 128:
        raise ValueError(f"NCCL unique id under {key!r} has {len(uid)} bytes, expected 128")
    return uid


class GpuWork:
    """Handle of an async NCCL collective. Keeps its buffers alive until completed."""

    def __init__(self, cwork: Any, keep: tuple, after: Callable[[], None] | None = None):
        self._w = cwork
        self._keep = keep
        self._after = after

    def wait(self, timeout: float | None = None) -> bool:
        """Block the host until the collective finished on the GPU. Returns False if still
        running after ``timeout`` seconds; raises if it failed or passed the communicator's
        timeout (the communicator is then aborted)."""
        if timeout is not None:
            from .._env import check_seconds

            timeout = check_seconds("Work.wait(timeout)", timeout, allow_zero=True)
        done = self._w.wait(timeout)
        if done:
            self._finish()
        return done

    def synchronize(self, stream: int | None = None) -> None:
        """Make ``stream`` (default: the current stream) wait for the collective, without
        blocking the host -- what torch's Work.wait() does for NCCL."""
        self._w.synchronize_stream(current_stream() if stream is None else int(stream))

    def is_completed(self) -> bool:
        done = bool(self._w.is_completed())
        if done:
            self._finish()
        return done

    def _finish(self) -> None:
        if self._after is not None:
            after, self._after = self._after, None
            after()
        self._keep = ()


class NcclCommunicator:
    """Collectives on CUDA buffers through NCCL, on the caller's current stream.

    ``store`` is any torch.distributed Store (rank 0 publishes the NCCL unique id there).
    ``device`` defaults to the local rank (LOCAL_RANK, or the MPI/SLURM one) modulo the
    visible devices. ``timeout`` bounds init and every collective: past it the communicator
    is aborted and the call (or the next one) raises CollectiveTimeout naming the collective
    -- a dead peer never hangs a rank.

    Sync calls (async_op=False) only enqueue: later work on the same stream is ordered after
    them, as with torch's NCCL backend; async calls return a :class:`GpuWork`.
    """

    _generation = 0

    def __init__(self, store: Any, rank: int, world_size: int, device: int | None = None,
                 timeout: float | None = None, key_prefix: str = "ringreduce/nccl"):
        if timeout is None:  # RINGREDUCE_TIMEOUT, as for every communicator
            timeout = _env.tunables().timeout
        if _gpu is None:
            raise CudaUnavailable(_NO_GPU_MODULE)
        if device is None:
            ok, reason = cuda_status()
            if not ok:
                raise CudaUnavailable(reason)
            count = _gpu.cuda_device_status()[0]
            device = _env.local_rank() % count
        require_cuda_device(device)  # "no CUDA device" before anything NCCL
        load_nccl()
        NcclCommunicator._generation += 1
        key = f"{key_prefix}/{NcclCommunicator._generation}/unique_id"
        uid = exchange_unique_id(store, rank, key)
        self.rank, self.world_size, self.device = int(rank), int(world_size), int(device)
        self._comm = _gpu.NcclComm(uid, self.rank, self.world_size, self.device, float(timeout))

    # -- helpers --
    def _buf(self, x: Any, what: str, writable: bool = True) -> CudaBuffer:
        b = as_cuda_buffer(x, what, writable)
        dev = b.device
        if dev is None and b.count > 0:
            dev = int(_gpu.pointer_info(b.ptr)["device"])
        if b.count > 0 and dev != self.device:
            raise ValueError(
                f"{what}: buffer is on cuda:{dev} but this communicator uses cuda:{self.device}; "
                f"move it with .to('cuda:{self.device}') or create a communicator per device"
            )
        if _is_torch_tensor(x) and b.count > 0:
            # The caching allocator must not hand this memory out again before the
            # collective on b.stream finished, even if x was allocated on another stream.
            torch = _torch()
            cur = torch.cuda.current_stream(self.device)
            s = cur if cur.cuda_stream == b.stream else torch.cuda.ExternalStream(
                b.stream, device=self.device)
            x.record_stream(s)
        return b

    @staticmethod
    def _done(cwork: Any, keep: tuple, async_op: bool) -> GpuWork | None:
        return GpuWork(cwork, keep) if async_op else None

    # -- collectives --
    def allreduce(self, x: Any, op: Any = "sum", async_op: bool = False) -> GpuWork | None:
        """In-place all-reduce of ``x`` (sum, avg, prod, min, max)."""
        b = self._buf(x, "tensor")
        w = self._comm.allreduce(b.ptr, b.ptr, b.count, b.code, op_code(op), b.stream)
        return self._done(w, (b,), async_op)

    def broadcast(self, x: Any, src: int = 0, async_op: bool = False) -> GpuWork | None:
        """In-place broadcast of ``x`` from rank ``src``."""
        if not 0 <= int(src) < self.world_size:
            raise ValueError(f"src={src} out of range for world size {self.world_size}")
        b = self._buf(x, "tensor")
        w = self._comm.broadcast(b.ptr, b.ptr, b.count, b.code, int(src), b.stream)
        return self._done(w, (b,), async_op)

    def allgather(self, x: Any, out: Any, async_op: bool = False) -> GpuWork | None:
        """``out`` (world_size * x.numel() elements, same dtype) receives every rank's ``x``."""
        b = self._buf(x, "tensor", writable=False)
        o = self._buf(out, "out")
        self._check_pair(b, o, o.count, b.count * self.world_size, "out", "world_size * tensor")
        w = self._comm.allgather(b.ptr, o.ptr, b.count, b.code, b.stream)
        return self._done(w, (b, o), async_op)

    def reduce_scatter(self, x: Any, out: Any, op: Any = "sum",
                       async_op: bool = False) -> GpuWork | None:
        """``out`` receives this rank's 1/world_size block of the reduction of every ``x``."""
        b = self._buf(x, "tensor", writable=False)
        o = self._buf(out, "out")
        self._check_pair(b, o, b.count, o.count * self.world_size, "tensor", "world_size * out")
        w = self._comm.reduce_scatter(b.ptr, o.ptr, o.count, b.code, op_code(op), b.stream)
        return self._done(w, (b, o), async_op)

    def barrier(self, timeout: float | None = None) -> None:
        """Block the host until every rank reached the barrier (bounded by the timeout)."""
        w = self._comm.barrier(current_stream(self.device))
        if not w.wait(timeout):
            raise TimeoutError(f"NCCL barrier did not complete within {timeout} s")

    def _check_pair(self, a: CudaBuffer, b: CudaBuffer, got: int, want: int, got_name: str,
                    want_name: str) -> None:
        if a.dtype != b.dtype:
            raise ValueError(f"dtype mismatch: tensor is {a.dtype}, out is {b.dtype}")
        if got != want:
            raise ValueError(
                f"{got_name} has {got} elements but {want_name} is {want}; size out as "
                f"world_size ({self.world_size}) times the per-rank block"
            )

    # -- lifetime --
    @property
    def failed(self) -> bool:
        return bool(self._comm.failed)

    def abort(self, reason: str = "aborted by the user") -> None:
        """Abort now (any thread): pending and later collectives raise."""
        self._comm.abort(reason)

    def destroy(self) -> None:
        """Flush and free the communicator (bounded by the timeout; aborts past it)."""
        self._comm.destroy()
