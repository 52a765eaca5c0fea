"""CUDA modules in ringreduce's DistributedDataParallel: which device the module is on,
torch-compatible device_ids/output_device checks, and the stream ordering of gradients.

Ordering contract: a gradient is written by autograd on the stream current in its hook; the
hook copies it into the bucket on that stream and records an event there (GradEvents.record).
When the bucket is launched, the launching stream waits for every recorded event before the
all-reduce is issued (GradEvents.wait_all): the staged path then copies the bucket to the host
on that stream and synchronizes it, the NCCL path enqueues on it. Finalize waits for every
bucket's Work (host-blocking for both paths) before writing gradients back, so the optimizer
sees finished gradients.
"""

from __future__ import annotations

from typing import Any

import torch


def module_device(named_params: list) -> torch.device | None:
    """The one CUDA device of the parameters, or None for CPU modules. Raises for a mix."""
    devs = {p.device for _, p in named_params}
    if not devs or devs == {torch.device("cpu")}:
        return None
    if len(devs) > 1:
        raise NotImplementedError(
            f"parameters are on several devices ({', '.join(sorted(map(str, devs)))}); "
            f"ringreduce DistributedDataParallel takes single-device modules: put the whole "
            f"module on one device (module.to(f'cuda:{{local_rank}}'))")
    dev = devs.pop()
    if dev.type != "cuda":
        raise NotImplementedError(
            f"parameters are on {dev}; ringreduce reduces CPU and CUDA modules only")
    return dev


def _index(d: Any) -> int | None:
    if d is None:
        return None
    if isinstance(d, int):
        return d
    d = torch.device(d)
    return d.index if d.index is not None else torch.cuda.current_device()


def check_device_args(device: torch.device | None, device_ids: Any,
                      output_device: Any) -> tuple:
    """(device_ids, output_device) as torch's DDP stores them; raises like torch does."""
    if device is None:
        # torch's test is truthiness (`if device_ids or output_device`): output_device=0
        # passes on a CPU module there, so it does here.
        if device_ids not in (None, []) or output_device not in (None, 0):
            raise ValueError(
                "device_ids and output_device must be None for CPU modules (as torch DDP "
                f"requires), got device_ids={device_ids!r}, output_device={output_device!r}")
        return None, None
    if device_ids not in (None, []):
        ids = list(device_ids)
        if len(ids) != 1 or _index(ids[0]) != device.index:
            raise ValueError(
                f"device_ids must be None or [{device.index}] for a module on {device} (one "
                f"device per process, as torch DDP requires), got {device_ids!r}")
    if output_device is not None and _index(output_device) != device.index:
        raise ValueError(f"output_device must be None or {device.index} for a module on "
                         f"{device}, got {output_device!r}")
    return [device.index], device.index


def require_cuda_comm(device: torch.device) -> None:
    """Raise a clear error unless CUDA gradients can be reduced (NCCL or staging)."""
    from ..gpu import device, staging

    ok, why = staging.stager_status(True)
    if ok:
        return
    nccl_ok, nccl_why = device.nccl_available()
    if not nccl_ok:
        nccl_why, why = " ".join(nccl_why.split()), " ".join(why.split())  # one line
        raise RuntimeError(
            f"DistributedDataParallel: the module is on {device} but neither NCCL ({nccl_why}) "
            f"nor staging through host memory ({why}) is usable here; keep the module on the "
            f"CPU or fix the CUDA set-up")


class GradEvents:
    """Per bucket, the CUDA events recorded where its gradients were copied in."""

    def __init__(self, nbuckets: int):
        self.events: list = [[] for _ in range(nbuckets)]

    def record(self, b: int) -> None:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        self.events[b].append(ev)

    def wait_all(self, b: int) -> None:
        stream = torch.cuda.current_stream()
        for ev in self.events[b]:
            stream.wait_event(ev)
        self.events[b] = []
