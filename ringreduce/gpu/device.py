"""CUDA and NCCL availability: the build, the devices, finding and loading libnccl.so.2
(nothing of NCCL is needed at build time). Uses gpu.arrays only."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .arrays import _NO_GPU_MODULE, CudaUnavailable, NcclUnavailable, _gpu

#: Environment variable naming libnccl.so.2 or the directory that holds it.
ENV_NCCL_PATH = "RINGREDUCE_NCCL_PATH"
NCCL_SONAME = "libnccl.so.2"




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
    from .._env import tunables

    explicit = (tunables(environ).nccl_path or "").strip()
    if explicit:
        return [os.path.expanduser(explicit)]
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
    ok, reason = cuda_status()  # the device first: with none, NCCL would not help
    if not ok:
        return False, reason
    try:
        info = load_nccl()
    except NcclUnavailable as e:
        return False, str(e)
    return True, f"NCCL {info['version']} from {info['path']}"
