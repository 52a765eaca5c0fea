"""GPU support: CUDA array adapters, CUDA and NCCL availability, an NCCL communicator, and the
routing of CUDA inputs in ringreduce's collectives.

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

Modules, each importing only those above it: ``arrays`` (CUDA arrays, the GPU module and
its errors) <- ``device`` (availability, loading NCCL) <- ``nccl`` (NcclCommunicator) <-
``staging`` (pinned host buffers) <- ``route`` (which path a collective takes; the staged
path). Nothing here touches the CUDA driver at import time.
"""

from __future__ import annotations

from .arrays import (
    CudaBuffer,
    CudaError,
    CudaUnavailable,
    NcclError,
    NcclUnavailable,
    as_cuda_buffer,
    current_stream,
    is_cuda_array,
)
from .device import (
    ENV_NCCL_PATH,
    NCCL_SONAME,
    built_with_cuda,
    cuda_available,
    cuda_build_info,
    cuda_status,
    load_nccl,
    nccl_available,
    nccl_candidates,
    require_cuda_device,
)
from .nccl import GpuWork, NcclCommunicator, exchange_unique_id
from .route import select_backend

__all__ = [
    "ENV_NCCL_PATH",
    "NCCL_SONAME",
    "CudaBuffer",
    "CudaError",
    "CudaUnavailable",
    "GpuWork",
    "NcclCommunicator",
    "NcclError",
    "NcclUnavailable",
    "as_cuda_buffer",
    "built_with_cuda",
    "cuda_available",
    "cuda_build_info",
    "cuda_status",
    "current_stream",
    "exchange_unique_id",
    "is_cuda_array",
    "load_nccl",
    "nccl_available",
    "nccl_candidates",
    "require_cuda_device",
    "select_backend",
]
