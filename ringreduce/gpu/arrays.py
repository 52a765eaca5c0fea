"""CUDA arrays -> (pointer, count, dtype, device, stream): torch CUDA tensors, CuPy arrays
(``__cuda_array_interface__``) and DLPack producers; the GPU module handle and its errors.
The bottom of ringreduce.gpu: imports nothing from it."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _C
from .._buffers import DTYPE_CODES, check_torch_tensor

# The compiled GPU module (csrc/bindings/gpu.cc), or None in an extension built before it.
_gpu = getattr(_C, "gpu", None)


_SUPPORTED = ", ".join(DTYPE_CODES)
_NO_GPU_MODULE = (
    "this ringreduce._C has no GPU module (it was built from sources older than the GPU "
    "path); reinstall ringreduce"
)


def _exc(name: str) -> type:
    if _gpu is not None and hasattr(_gpu, name):
        return getattr(_gpu, name)
    return type(name, (_C.RingReduceError,), {"__module__": "ringreduce.gpu"})


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


# The dtypes of GPU buffers (those NCCL reduces) and their sizes.
_ITEMSIZE = dict(_C.DTYPE_SIZES)  # every dtype of the core (bool, 16-bit and unsigned too)

# __cuda_array_interface__ typestr (without byte order) -> our dtype name.
_TYPESTR = {
    "f4": "float32", "f8": "float64", "f2": "float16", "b1": "bool",
    "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32", "u4": "uint32",
    "i8": "int64", "u8": "uint64",
}

# DLPack (type code, bits) -> our dtype name. Codes: 0 int, 1 uint, 2 float, 4 bfloat.
_DLPACK_DTYPES = {  # kDLBool (6) is one byte per element
    (2, 32): "float32", (2, 64): "float64", (2, 16): "float16", (4, 16): "bfloat16",
    (0, 8): "int8", (1, 8): "uint8", (0, 16): "int16", (1, 16): "uint16", (0, 32): "int32",
    (1, 32): "uint32", (0, 64): "int64", (1, 64): "uint64", (6, 8): "bool",
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
    if order == ">" and code_str not in ("i1", "u1", "b1"):
        raise ValueError(f"{what}: big-endian CUDA arrays ({typestr}) are not supported")
    name = _TYPESTR.get(code_str)
    if name is None:
        raise ValueError(
            f"{what}: CUDA array typestr {typestr!r} is not supported; use one of "
            f"{_SUPPORTED} (for bfloat16 pass a torch tensor)"
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


