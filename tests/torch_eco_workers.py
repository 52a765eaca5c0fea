"""Stock torch.distributed features run on a backend given by name: the same function runs
on "gloo" and on "ringreduce" and tests/test_torch_ecosystem.py compares what they return.
Each check returns plain numbers computed from rank-dependent inputs (or the error text)."""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist


def _mesh2d(rank: int, world: int, _: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=mesh.get_group("tp"))
    u = torch.full((5,), float(rank + 1))
    dist.all_reduce(u, group=mesh.get_group("dp"), op=dist.ReduceOp.MAX)
    return [t.tolist(), u.tolist()]


def _funcol(rank: int, world: int, _: str) -> Any:
    import torch.distributed._functional_collectives as fc

    t = torch.arange(6, dtype=torch.float32) * (rank + 1)
    ar = fc.all_reduce(t, "sum", dist.group.WORLD)
    ag = fc.all_gather_tensor(t, 0, dist.group.WORLD)
    rs = fc.reduce_scatter_tensor(torch.arange(2.0 * world) + rank, "sum", 0, dist.group.WORLD)
    return [ar.tolist(), ag.tolist(), rs.tolist()]


def _fsdp2(rank: int, world: int, _: str, hybrid: bool = False) -> Any:
    """FSDP2 on a 1-D mesh, or (hybrid) HSDP on a 2-D one: replicate across 2 groups, shard
    within each (fully_shard needs the 2-D mesh's dimension names)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 5))
    mesh = (init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
            if hybrid else init_device_mesh("cpu", (world,)))
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    before = [p.full_tensor().clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        loss = m(torch.randn(8, 16, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = [p.full_tensor() for p in m.parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(after, before))
    return {"params": [a.flatten().tolist() for a in after], "moved": moved}


def _zero(rank: int, world: int, _: str) -> Any:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        opt.zero_grad()
        ddp(torch.randn(4, 8, generator=g)).pow(2).sum().backward()
        opt.step()
    return [p.flatten().tolist() for p in m.parameters()]


def _objects(rank: int, world: int, _: str) -> Any:
    got = [None] * world
    dist.all_gather_object(got, {"rank": rank, "name": "r" * rank})
    lst = [rank * 10, "x"]
    dist.broadcast_object_list(lst, src=world - 1)
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(world)] if rank == 0 else None,
                             src=0)
    return [got, lst, out]


def _checkpoint(rank: int, world: int, tmp: str) -> Any:
    import torch.distributed.checkpoint as dcp

    d = os.path.join(tmp, "dcp")
    sd = {"w": torch.arange(7.0) * 3, "step": torch.tensor(5)}
    dcp.save(sd, checkpoint_id=d)
    back = {"w": torch.zeros(7), "step": torch.tensor(0)}
    dcp.load(back, checkpoint_id=d)
    return [back["w"].tolist(), int(back["step"])]


def _p2p_batch(rank: int, world: int, _: str) -> Any:
    send = torch.full((4,), float(rank))
    recv = torch.empty(4)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return recv.tolist()


def _compiled_ddp(rank: int, world: int, _: str) -> Any:
    """torch.compile of a torch DDP model (BatchNorm: DDP broadcasts buffers inside the
    compiled forward): the weights after 4 steps, and the frames dynamo compiled -- the
    model's only. Before, dynamo traced ringreduce's Python that DDP's C++ called there (34
    recompiles, a 6 s first step)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    step = torch.compile(ddp, backend="eager")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for s in range(4):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(s * 10 + rank))
        step(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    frames = dict(torch._dynamo.utils.counters["frames"])
    return {"w0": [float(p.sum()) for p in model.parameters()], "frames": frames}


def _fp8_p2p(rank: int, world: int, _: str) -> Any:
    """float8 send/recv around the ring (pipelines send fp8 activations): only bytes move
    (ringreduce refused the dtype; gloo's send/recv take it)."""
    x = torch.full((5,), 0.5 * (rank + 1)).to(torch.float8_e4m3fn)
    y = torch.zeros(5, dtype=torch.float8_e4m3fn)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, (rank + 1) % world),
                                   dist.P2POp(dist.irecv, y, (rank - 1) % world)])
    for q in reqs:
        q.wait()
    return y.float().tolist()


def _complex32(rank: int, world: int, _: str) -> Any:
    """reduce_scatter_tensor of complex32 (pairs of float16; ringreduce refused it)."""
    re = torch.arange(2.0 * world) + rank
    x = torch.complex(re, -re).to(torch.complex32)
    out = torch.zeros(2, dtype=torch.complex32)
    dist.reduce_scatter_tensor(out, x)
    return torch.view_as_real(out.to(torch.complex64)).flatten().tolist()


CHECKS: dict[str, Callable[[int, int, str], Any]] = {
    "mesh2d": _mesh2d, "funcol": _funcol, "fsdp2": _fsdp2,
    "hsdp": lambda rank, world, tmp: _fsdp2(rank, world, tmp, hybrid=True), "zero": _zero,
    "objects": _objects, "checkpoint": _checkpoint, "p2p_batch": _p2p_batch,
    "compiled_ddp": _compiled_ddp, "fp8_p2p": _fp8_p2p, "complex32": _complex32,
}


def run_checks(rank: int, world: int, backend: str, tmp: str) -> dict:
    """init_process_group(backend), every check (errors recorded, not raised), destroy."""
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    out: dict = {"backend": dist.get_backend(),
                 "cpu_backend": type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__}
    for name, fn in CHECKS.items():
        try:
            out[name] = fn(rank, world, os.path.join(tmp, backend))
        except Exception:  # noqa: BLE001 - reported by the test
            out[name] = {"error": traceback.format_exc()[-3000:]}
    dist.destroy_process_group()
    return out


def device_map(rank: int, world: int) -> dict:
    """A device map that puts ringreduce on CPU beside another backend (on this CPU-only
    machine gloo stands in for the cuda half: torch without NCCL refuses "cuda:nccl" for
    gloo too)."""
    dist.init_process_group("cpu:ringreduce,cuda:gloo")
    pg = dist.group.WORLD
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out = {"cpu": type(pg._get_backend(torch.device("cpu"))).__name__,
           "cuda": type(pg._get_backend(torch.device("cuda"))).__name__,
           "sum": t.tolist()}
    dist.destroy_process_group()
    return out


def late_p2p(rank: int, world: int) -> list:
    """A ring of batch_isend_irecv in which rank 2 comes 1.5 s late, then
    destroy_process_group. Rank 0 -- it hosts torch's TCPStore -- is done first; the late
    ranks still make their point-to-point channels through that store, so its destroy must
    wait for theirs (before the fix the store went away under them)."""
    import time

    dist.init_process_group("ringreduce")
    if rank == 2:
        time.sleep(1.5)
    send, recv = torch.full((4,), float(rank)), torch.empty(4)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    dist.destroy_process_group()
    return recv.tolist()


def local_sync_group_after_a_leaver(rank: int, world: int) -> list | None:
    """new_group([0, 1], use_local_synchronization=True): only the members call it (rank 1
    1.5 s after rank 0); the last rank, a member of no group, is done and leaves meanwhile.
    Its normal leave failed the members' group set-up ("left the job"), where gloo runs
    it: while a group starts, only its members -- torch's global_ranks_in_group -- are
    watched (found by a helper)."""
    import time

    dist.init_process_group("ringreduce")
    out = None
    if rank < 2:
        if rank == 1:
            time.sleep(1.5)
        g = dist.new_group([0, 1], use_local_synchronization=True)
        t = torch.arange(3.0) * (rank + 1)
        dist.all_reduce(t, group=g)
        out = t.tolist()
    dist.destroy_process_group()
    return out
