"""Shared set-up of the GPU tests (test_gpu.py, test_gpu_kernels.py): paths, what this
machine has (CUDA build, device, nvcc), skip markers and a subprocess helper."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ringreduce import gpu
from ringreduce.gpu import arrays as gpu_arrays

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"

_HAS_MODULE = gpu_arrays._gpu is not None
_CUDA_OK, _CUDA_REASON = gpu.cuda_status()
_NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None
)

# Every build has the gpu submodule (csrc/bindings/module.cc registers it, CUDA or not): its
# absence is a defect, not a missing resource to skip for (test_gpu.py asserts it).
# The module-level skip condition of device tests; the reason (shown with -rs) says what is
# missing: no CUDA build, no driver, or no device.
needs_gpu = pytest.mark.skipif(not _CUDA_OK, reason=_CUDA_REASON)

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
OPS = ["sum", "avg", "prod", "min", "max"]
TAGS = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
        "int8": "i8", "uint8": "u8", "int32": "i32", "int64": "i64"}


def _py(code: str, env: dict | None = None, timeout: float = 60,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=e, timeout=timeout, cwd=str(cwd), check=False)

