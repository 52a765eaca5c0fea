"""CUDA options of ringreduce-bench and the DDP wrapper's CUDA checks, as far as a machine
without a GPU can check them: clear one-line errors before anything is spawned or moved."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from gpu_common import _CUDA_OK

from ringreduce.bench import cli
from ringreduce.ddp import _cuda

no_gpu = pytest.mark.skipif(_CUDA_OK or torch.cuda.is_available(),
                            reason="a CUDA device is present: the no-device errors cannot show")


@no_gpu
@pytest.mark.parametrize("extra", [["--device", "cuda"], ["--device", "cuda", "--compare", "nccl"]])
def test_bench_cuda_without_device_fails_fast(extra):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ringreduce.bench", "-n", "2", "-e", "64", *extra],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ringreduce-bench: error: no CUDA device: ")
    assert p.stdout == ""
    assert time.monotonic() - t0 < 30  # nothing was spawned (no rank, no timeout)


def test_bench_cuda_options_parse():
    a = cli.parse_args(["--device", "cuda", "--compare", "nccl"])
    assert a.device == "cuda" and a.compare == ["nccl"]
    assert cli.parse_args([]).device == "cpu"
    assert cli.cuda_problem(cli.parse_args([])) is None


def test_bench_compare_nccl_needs_cuda(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--compare", "nccl"])
    assert e.value.code == 2
    assert "--compare nccl needs --device cuda" in capsys.readouterr().err


class _P:
    def __init__(self, dev):
        self.device = torch.device(dev)


def test_ddp_module_device_and_device_args():
    assert _cuda.module_device([("w", _P("cpu"))]) is None
    assert _cuda.module_device([]) is None
    assert _cuda.module_device([("w", _P("cuda:1")), ("b", _P("cuda:1"))]) == torch.device("cuda:1")
    with pytest.raises(NotImplementedError, match="several devices"):
        _cuda.module_device([("w", _P("cuda:0")), ("b", _P("cpu"))])
    with pytest.raises(NotImplementedError, match="CPU and CUDA modules only"):
        _cuda.module_device([("w", _P("meta"))])
    dev = torch.device("cuda:1")
    assert _cuda.check_device_args(dev, None, None) == ([1], 1)
    assert _cuda.check_device_args(dev, [1], 1) == ([1], 1)
    assert _cuda.check_device_args(dev, [torch.device("cuda:1")], "cuda:1") == ([1], 1)
    with pytest.raises(ValueError, match=r"device_ids must be None or \[1\]"):
        _cuda.check_device_args(dev, [0], None)
    with pytest.raises(ValueError, match=r"device_ids must be None or \[1\]"):
        _cuda.check_device_args(dev, [1, 2], None)
    with pytest.raises(ValueError, match="output_device must be None or 1"):
        _cuda.check_device_args(dev, None, 0)
    with pytest.raises(ValueError, match="must be None for CPU modules"):
        _cuda.check_device_args(None, [0], None)
    assert _cuda.check_device_args(None, [], None) == (None, None)


@no_gpu
def test_ddp_cuda_module_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="neither NCCL .* nor staging through host memory"):
        _cuda.require_cuda_comm(torch.device("cuda:0"))
