"""GPU support: CUDA array adapters, CUDA and NCCL availability, and an NCCL communicator.

What this module gives the rest of ringreduce (and what user code may call):

* :func:`is_cuda_array` / :func:`as_cuda_buffer` -- turn a torch CUDA tensor, a CuPy array
  (``__cuda_array_interface__``) or any DLPack producer on a CUDA device into a
  :class:`CudaBuffer` (device pointer, element count, dtype, device index, stream), with
  every check done before any byte moves and errors that say what to do.
* :func:`cuda_status` / :func:`cuda_available` -- is there a CUDA build and a device?
* :func:`nccl_candidates` / :func:`load_nccl` / :func:`nccl_available` -- find and dlopen
  ``libnccl.so.2`` (``RINGREDUCE_NCCL_PATH``, the ``nvidia-nccl-cu12``/``-cu13`` wheels, the
  system library), nothing of NCCL is needed at build time.
* :func:`select_backend` -- which path a collective on ``x`` should take.
* :class:`NcclCommunicator` -- collectives on CUDA buffers through NCCL, the unique id shared
  through a torch Store, every wait bounded by a timeout (a dead peer raises).

Nothing here touches the CUDA driver at import time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import _C
from ._buffers import DTYPE_CODES, check_torch_tensor, op_code

# The compiled GPU module (csrc/bindings/gpu.cc), or None in an extension built before it.
_gpu = getattr(_C, "gpu", None)

#: Environment variable naming libnccl.so.2 or the directory that holds it.
ENV_NCCL_PATH = "RINGREDUCE_NCCL_PATH"
NCCL_SONAME = "libnccl.so.2"

_SUPPORTED = ", ".join(DTYPE_CODES)
_NO_GPU_MODULE = (
    "this ringreduce._C has no GPU module (it was built from sources older than the GPU "
    "path); reinstall ringreduce"
)


def _exc(name: str) -> type:
    if _gpu is not None and hasattr(_gpu, name):
        return getattr(_gpu, name)
    return type(name, (_C.RingReduceError,), {"__module__": __name__})


#: No CUDA build, no driver or no device. A RingReduceError (so also a RuntimeError).
CudaUnavailable = _exc("CudaUnavailable")
#: NCCL could not be found or loaded, or is too old.
NcclUnavailable = _exc("NcclUnavailable")
#: An NCCL call failed (async errors included; the communicator was aborted).
NcclError = _exc("NcclError")
#: A CUDA runtime call failed.
CudaError = _exc("CudaError")


# ---------------------------------------------------------------------------------------
# CUDA arrays -> (pointer, count, dtype, device, stream)
# ---------------------------------------------------------------------------------------


@dataclass
class CudaBuffer:
    """A validated, contiguous CUDA buffer, as the C++ core takes it."""

    obj: Any  # what keeps the memory alive: the tensor/array (and a DLPack capsule)
    ptr: int
    count: int
    dtype: str
    code: int
    shape: tuple
    device: int | None  # None when the producer did not say (plain CAI objects)
    stream: int  # cudaStream_t as an int; 0 = legacy default stream

    @property
    def nbytes(self) -> int:
        return self.count * _ITEMSIZE[self.dtype]


_ITEMSIZE = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
    "int8": 1, "uint8": 1, "int32": 4, "int64": 8,
}

# __cuda_array_interface__ typestr (without byte order) -> our dtype name.
_TYPESTR = {
    "f4": "float32", "f8": "float64", "f2": "float16",
    "i1": "int8", "u1": "uint8", "i4": "int32", "i8": "int64",
}

# DLPack (type code, bits) -> our dtype name. Codes: 0 int, 1 uint, 2 float, 4 bfloat.
_DLPACK_DTYPES = {
    (2, 32): "float32", (2, 64): "float64", (2, 16): "float16", (4, 16): "bfloat16",
    (0, 8): "int8", (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64",
}
_KDL_CUDA = 2
_KDL_CUDA_HOST = 3
_KDL_CUDA_MANAGED = 13


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return None
    return torch


def _is_torch_tensor(x: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda_array(x: Any) -> bool:
    """True for torch CUDA tensors, ``__cuda_array_interface__`` objects (CuPy, Numba, ...)
    and DLPack producers on a CUDA device. Never raises."""
    if _is_torch_tensor(x):
        return x.device.type == "cuda"
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return True
        dev = getattr(x, "__dlpack_device__", None)
        if dev is not None:
            return int(dev()[0]) in (_KDL_CUDA, _KDL_CUDA_MANAGED)
    except Exception:  # noqa: BLE001 - a broken producer is simply "not a CUDA array"
        return False
    return False


def _c_contiguous_strides(shape: Sequence[int], itemsize: int) -> list:
    strides, acc = [], itemsize
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(int(dim), 1)
    return list(reversed(strides))


def _check_c_contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int,
                        what: str) -> None:
    """strides in bytes (None = C-contiguous). Size-1 dimensions may have any stride."""
    if strides is None:
        return
    if any(int(d) == 0 for d in shape):
        return  # empty: nothing to move
    want = _c_contiguous_strides(shape, itemsize)
    for dim, got, exp in zip(shape, strides, want):
        if int(dim) != 1 and int(got) != exp:
            raise ValueError(
                f"{what}: CUDA array is not C-contiguous (strides {tuple(strides)} bytes for "
                f"shape {tuple(shape)}); pass a contiguous copy (e.g. cupy.ascontiguousarray(x)) "
                f"and copy the result back"
            )


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def current_stream(device: int | None = None) -> int:
    """The caller's current CUDA stream as an int: torch's current stream when torch has
    CUDA initialised, else CuPy's when CuPy is imported, else 0 (the legacy default stream)."""
    torch = _torch()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        dev = torch.cuda.current_device() if device is None else device
        return int(torch.cuda.current_stream(dev).cuda_stream)
    cupy = _imported("cupy")
    if cupy is not None:
        try:
            return int(cupy.cuda.get_current_stream().ptr)
        except Exception:  # noqa: BLE001 - no device: fall back to the default stream
            return 0
    return 0


def _imported(name: str) -> Any:
    import sys

    return sys.modules.get(name)


def _from_torch(x: Any, what: str, writable: bool, stream: int | None) -> CudaBuffer:
    torch = _torch()
    if x.device.type != "cuda":
        if x.device.type == "meta":
            raise ValueError(
                f"{what}: tensor is on the meta device and has no memory; materialise it on a "
                f"GPU first (e.g. module.to_empty(device='cuda') or torch.empty_like(x, "
                f"device='cuda'))"
            )
        raise ValueError(
            f"{what}: tensor is on {x.device}, not a CUDA device; host tensors go through "
            f"ringreduce's CPU path (pass it to ringreduce.allreduce as it is)"
        )
    name, code = check_torch_tensor(x, what, writable)
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if stream is None:
        stream = int(torch.cuda.current_stream(dev).cuda_stream)
    return CudaBuffer(x, int(x.data_ptr()), x.numel(), name, code, tuple(x.shape), dev, stream)


def _from_cai(x: Any, what: str, writable: bool, stream: int | None) -> CudaBuffer:
    cai = x.__cuda_array_interface__
    if not isinstance(cai, dict):
        raise TypeError(f"{what}: __cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    for key in ("shape", "typestr", "data"):
        if key not in cai:
            raise ValueError(f"{what}: __cuda_array_interface__ lacks the required key {key!r}")
    version = int(cai.get("version", 0))
    if version < 2:
        raise ValueError(
            f"{what}: __cuda_array_interface__ version {version} is too old (need >= 2); "
            f"upgrade the array library"
        )
    if cai.get("mask") is not None:
        raise ValueError(f"{what}: masked CUDA arrays are not supported; fill the mask first")
    typestr = str(cai["typestr"])
    order, code_str = typestr[:1], typestr[1:]
    if order == ">" and code_str not in ("i1", "u1"):
        raise ValueError(f"{what}: big-endian CUDA arrays ({typestr}) are not supported")
    name = _TYPESTR.get(code_str)
    if name is None:
        raise ValueError(
            f"{what}: CUDA array typestr {typestr!r} is not supported; use float32/float64/"
            f"float16/int8/uint8/int32/int64 (for bfloat16 pass a torch tensor)"
        )
    shape = tuple(int(d) for d in cai["shape"])
    if any(d < 0 for d in shape):
        raise ValueError(f"{what}: negative dimension in shape {shape}")
    data = cai["data"]
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise ValueError(f"{what}: __cuda_array_interface__['data'] must be (pointer, read_only)")
    ptr, readonly = int(data[0] or 0), bool(data[1])
    count = _prod(shape)
    if writable and readonly:
        raise ValueError(
            f"{what}: CUDA array is read-only; the collective writes its result in place, "
            f"pass a writable copy"
        )
    if ptr == 0 and count > 0:
        raise ValueError(f"{what}: CUDA array has a null data pointer but {count} elements")
    _check_c_contiguous(shape, cai.get("strides"), _ITEMSIZE[name], what)
    if stream is None:
        # v3: the producer's stream (None: no synchronisation needed). 0 is disallowed by
        # the protocol; 1 / 2 are cudaStreamLegacy / cudaStreamPerThread, valid handles.
        s = cai.get("stream") if version >= 3 else None
        if s is not None and int(s) == 0:
            raise ValueError(f"{what}: __cuda_array_interface__ stream 0 is invalid (use 1 or 2)")
        stream = current_stream() if s is None else int(s)
    dev = getattr(getattr(x, "device", None), "id", None)  # CuPy arrays say where they live
    return CudaBuffer(x, ptr, count, name, DTYPE_CODES[name], shape,
                      int(dev) if isinstance(dev, int) else None, int(stream))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _capsule_pointer(capsule: Any, name: bytes) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype = ctypes.c_int
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if not is_valid(capsule, name):
        raise ValueError(f"expected a DLPack capsule named {name.decode()!r}")
    return int(get(capsule, name))


def _from_dlpack(x: Any, what: str, writable: bool, stream: int | None) -> CudaBuffer:
    dev_type, dev_id = (int(v) for v in x.__dlpack_device__())
    if dev_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        raise ValueError(
            f"{what}: DLPack device type {dev_type} is not a CUDA device; host arrays go "
            f"through ringreduce's CPU path"
        )
    if stream is None:
        stream = current_stream(dev_id)
    # The producer makes our stream wait for its pending work (DLPack stream protocol);
    # 0 is not allowed there, 1 is the legacy default stream that 0 means to us.
    capsule = x.__dlpack__(stream=stream if stream != 0 else 1)
    # Not renamed to "used_dltensor": the capsule stays the owner and frees the tensor when
    # it is collected, so keeping it in CudaBuffer.obj keeps the memory alive.
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if t.dtype.lanes != 1:
        raise ValueError(f"{what}: vector DLPack dtypes (lanes={t.dtype.lanes}) are not supported")
    name = _DLPACK_DTYPES.get((t.dtype.code, t.dtype.bits))
    if name is None:
        raise ValueError(
            f"{what}: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits) is not "
            f"supported; use one of {_SUPPORTED}"
        )
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides:
        strides = [int(t.strides[i]) * _ITEMSIZE[name] for i in range(t.ndim)]
        _check_c_contiguous(shape, strides, _ITEMSIZE[name], what)
    ptr = int(t.data or 0) + int(t.byte_offset)
    return CudaBuffer((x, capsule), ptr, _prod(shape), name, DTYPE_CODES[name], shape,
                      int(t.device.device_id), int(stream))


def as_cuda_buffer(x: Any, what: str = "tensor", writable: bool = True,
                   stream: int | None = None) -> CudaBuffer:
    """Validate a CUDA tensor/array for a collective and describe its memory.

    ``stream`` overrides the stream the collective is ordered on (default: the caller's
    current stream -- torch's for torch tensors, the producer's for CAI v3 objects).
    Raises TypeError/ValueError naming the argument and the fix.
    """
    if _is_torch_tensor(x):
        return _from_torch(x, what, writable, stream)
    if hasattr(x, "__cuda_array_interface__"):
        return _from_cai(x, what, writable, stream)
    if isinstance(x, np.ndarray):
        raise ValueError(  # noqa: TRY004 - the type is fine, its memory is in the wrong place
            f"{what}: numpy array is in host memory; host arrays go through ringreduce's CPU "
            f"path (pass it to ringreduce.allreduce as it is)"
        )
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        return _from_dlpack(x, what, writable, stream)
    raise TypeError(
        f"{what}: expected a torch CUDA tensor, a CuPy array or another object with "
        f"__cuda_array_interface__ / __dlpack__, got {type(x).__name__}"
    )


# ---------------------------------------------------------------------------------------
# Availability
# ---------------------------------------------------------------------------------------


def built_with_cuda() -> bool:
    """True when ringreduce._C was compiled with nvcc (CUDA kernels present)."""
    return _gpu is not None and bool(_gpu.built_with_cuda())


def cuda_build_info() -> dict:
    """{"built_with_cuda", "archs", "runtime_version"} of this build."""
    if _gpu is None:
        return {"built_with_cuda": False, "archs": "", "runtime_version": 0}
    return dict(_gpu.cuda_build_info())


def cuda_status() -> tuple:
    """(usable, reason): whether CUDA collectives can run here, and why not.

    The first call in a CUDA build loads the driver (once); nothing is initialised before.
    """
    if _gpu is None:
        return False, _NO_GPU_MODULE
    count, _driver, reason = _gpu.cuda_device_status()
    if count > 0:
        return True, f"{count} CUDA device(s)"
    return False, reason


def cuda_available() -> bool:
    """True when this build has CUDA and a CUDA device is visible."""
    return cuda_status()[0]


def require_cuda_device(device: int = 0) -> None:
    """Raise CudaUnavailable ("no CUDA device ...", with what to do) unless ``device`` exists."""
    if _gpu is None:
        raise CudaUnavailable(_NO_GPU_MODULE)
    _gpu.require_device(int(device))


def nccl_candidates(environ: dict | None = None) -> list:
    """Where to look for libnccl.so.2, in order.

    ``RINGREDUCE_NCCL_PATH`` (a file or a directory) when set -- then nothing else, so a
    wrong setting is reported instead of silently replaced; otherwise the lib/ directories
    of installed ``nvidia-nccl-cu12``/``-cu13`` wheels, then the system's ``libnccl.so.2``
    (LD_LIBRARY_PATH and the ldconfig cache).
    """
    from ._env import tunables

    explicit = (tunables(environ).nccl_path or "").strip()
    if explicit:
        return [explicit]
    out = []
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        lib = Path(loc) / "lib"
        if (lib / NCCL_SONAME).is_file() and str(lib) not in out:
            out.append(str(lib))
    out.append(NCCL_SONAME)
    return out


def load_nccl(environ: dict | None = None) -> dict:
    """dlopen NCCL (once per process) and return {"path", "version", "version_code",
    "nonblocking_init"}. Raises NcclUnavailable listing what was tried and what to do."""
    if _gpu is None:
        raise NcclUnavailable(_NO_GPU_MODULE)
    loaded = _gpu.nccl_loaded()
    if loaded is not None:
        return dict(loaded)
    return dict(_gpu.nccl_load(nccl_candidates(environ)))


def nccl_available() -> tuple:
    """(usable, reason): NCCL loads, this is a CUDA build, and a CUDA device is visible."""
    if not built_with_cuda():
        ok, reason = cuda_status()
        return False, reason if not ok else _NO_GPU_MODULE
    try:
        info = load_nccl()
    except NcclUnavailable as e:
        return False, str(e)
    ok, reason = cuda_status()
    if not ok:
        return False, reason
    return True, f"NCCL {info['version']} from {info['path']}"


def select_backend(x: Any, backend: str = "auto") -> str:
    """The path a collective on ``x`` takes on this process: "cpu" for host arrays,
    "nccl" or "staged" for CUDA arrays.

    ``backend``: "auto" (NCCL for CUDA arrays when it is usable here, else staged through
    pinned host memory), "nccl" (required), "staged"/"host" (required), or a host path name
    ("cpu", "tcp", "shm", returned for host arrays). A CUDA array that can take neither
    path raises with the reason and what to do. The collectives agree on NCCL across ranks
    first (ringreduce/_gpu_route.py); this is the local half of that decision.
    """
    from . import _gpu_route, _gpu_staging

    backend = str(backend).lower()
    if not is_cuda_array(x):
        if backend == "nccl":
            raise ValueError(
                "backend='nccl' needs CUDA tensors; this one is in host memory (move it with "
                ".cuda(), or use backend='auto')"
            )
        return "cpu" if backend in ("auto", "staged", "host") else backend
    if backend not in _gpu_route.BACKENDS:
        raise ValueError(
            f"backend={backend!r} moves host memory only; for a CUDA tensor use backend='auto', "
            f"'nccl' or 'staged', or move it to the CPU with .cpu()"
        )
    name = _gpu_route.normalize_backend(backend)
    nccl = (False, "not needed") if name == "staged" else nccl_available()
    staging = (True, "") if name == "nccl" else _gpu_staging.stager_status(_is_torch_tensor(x))
    return _gpu_route.decide(name, nccl, staging)


# ---------------------------------------------------------------------------------------
# NCCL communicator
# ---------------------------------------------------------------------------------------


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
            from ._env import check_seconds

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
    ``device`` defaults to LOCAL_RANK modulo the visible devices. ``timeout`` bounds init
    and every collective: past it the communicator is aborted and the call (or the next
    one) raises CollectiveTimeout naming the collective -- a dead peer never hangs a rank.

    Sync calls (async_op=False) only enqueue: later work on the same stream is ordered after
    them, as with torch's NCCL backend; async calls return a :class:`GpuWork`.
    """

    _generation = 0

    def __init__(self, store: Any, rank: int, world_size: int, device: int | None = None,
                 timeout: float = 600.0, key_prefix: str = "ringreduce/nccl"):
        if _gpu is None:
            raise CudaUnavailable(_NO_GPU_MODULE)
        if device is None:
            ok, reason = cuda_status()
            if not ok:
                raise CudaUnavailable(reason)
            count = _gpu.cuda_device_status()[0]
            device = int(os.environ.get("LOCAL_RANK", "0")) % count
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
