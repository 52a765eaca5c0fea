"""Functions that run inside ranks (started by _spawn.run_world) for tests/test_ddp_faults.py:
DDP under faults -- uneven inputs with and without join(), ranks whose models differ, and a
rank SIGKILLed in the middle of backward.

Models and data are pure functions of (seed, rank, step), so the test process can replay
the schedule in one process (tests/test_ddp_faults.py computes the references itself).
Workers return final parameters as nested lists (JSON keeps floats exact).
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

import ringreduce as rr
from ringreduce.ddp import DistributedDataParallel as DDP
from ringreduce.ddp import hooks

B = 4  # per-rank batch
LR = 0.1
TINY_CAP_MB = 0.0002  # ~210 bytes: three or more buckets for the small models below


# ---------------------------------------------------------------------------- models, data


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 16)
        self.l3 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))


class Mixed(nn.Module):
    """BatchNorm buffers, and a branch `c` used only on some (rank, step)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.b = nn.Linear(16, 4)
        self.c = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        h = torch.tanh(self.bn(self.a(x)))
        return self.b(h) + self.c(h) if use_c else self.b(h)


MODELS: dict[str, Callable[[], nn.Module]] = {"mlp": MLP, "mixed": Mixed}


def init_model(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[kind]()


def batch(rank: int, step: int, micro: int = 0, seed: int = 0) -> tuple:
    """Rank-dependent data: rank r's micro-batch `micro` of step `step`."""
    g = torch.Generator().manual_seed(100000 * seed + 1000 * rank + 10 * step + micro)
    return torch.randn(B, 8, generator=g), torch.randn(B, 4, generator=g)


def uses_c(rank: int, step: int) -> bool:
    return (rank + step) % 2 == 0


def num_batches(rank: int, world: int, variant: str) -> int:
    if variant == "zero":  # rank 0 has nothing at all: it shadows from the first forward
        return 0 if rank == 0 else 2 + rank
    return 3 + 2 * rank


def params_list(m: nn.Module) -> list:
    return [p.detach().double().tolist() for p in m.parameters()]


def buffers_list(m: nn.Module) -> list:
    return [b.detach().double().tolist() for b in m.buffers()]


# ---------------------------------------------------------------------------- join()


def join_train(rank: int, world: int, kind: str = "mlp", variant: str = "uneven",
               divide_by_initial_world_size: bool = True, micro: int = 1,
               hook: str | None = None, metric_between: bool = False, **ddp_kw: Any) -> dict:
    """Train on this rank's 3+2r batches inside model.join(); plain SGD. Every step has
    `micro` micro-batches (all but the last under no_sync()) and, for the mixed model, an
    extra torch.no_grad() forward (evaluation) that must be shadowed too. metric_between:
    a torch.no_grad() forward between the last forward and its backward (a metric), which
    changes nothing: no collective, the backward's all-reduce still happens."""
    model = init_model(kind, seed=0 if rank == 0 else 1 + rank)  # DDP broadcasts rank 0's
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB, **ddp_kw)
    if hook is not None:
        ddp.register_comm_hook(None, getattr(hooks, hook))
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    n = num_batches(rank, world, variant)
    with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size) as j:
        for s in range(n):
            opt.zero_grad(set_to_none=True)
            for m in range(micro):
                x, y = batch(rank, s, m)
                kw = {"use_c": uses_c(rank, s)} if kind == "mixed" else {}
                if m < micro - 1:
                    with ddp.no_sync():
                        F.mse_loss(ddp(x, **kw), y).backward()
                else:
                    out = ddp(x, **kw)
                    if metric_between:
                        with torch.no_grad():
                            ddp(batch(rank, s, 8)[0])
                    F.mse_loss(out, y).backward()
            opt.step()
            if kind == "mixed":
                with torch.no_grad():
                    ddp(batch(rank, s, 9)[0])
    t = torch.full((2,), rank + 1.0)  # rank-dependent: a stale or partial sum shows
    rr.allreduce(t)  # the communicator still works and is in step
    return {"params": params_list(model), "buffers": buffers_list(model),
            "iterations": j.iterations, "shadowed": j.shadowed,
            "buckets": len(ddp.reducer.buckets), "comm_ok": bool((t == world * (world + 1) / 2).all())}


def join_throw(rank: int, world: int) -> dict:
    """throw_on_early_termination=True: rank 0 (3 batches) runs out first; every rank
    raises at the same iteration; the communicator stays usable."""
    model = init_model("mlp")
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    done, msg, typ = 0, None, None
    try:
        with ddp.join(throw_on_early_termination=True):
            for s in range(num_batches(rank, world, "uneven")):
                opt.zero_grad()
                x, y = batch(rank, s)
                F.mse_loss(ddp(x), y).backward()
                opt.step()
                done += 1
    except RuntimeError as e:
        msg, typ = str(e), type(e).__name__
    t = torch.full((2,), rank + 1.0)  # rank-dependent: a stale or partial sum shows
    rr.allreduce(t)
    # Training outside join() afterwards works (all ranks, one even step).
    x, y = batch(rank, 50)
    F.mse_loss(ddp(x), y).backward()
    return {"done": done, "msg": msg, "type": typ, "comm_ok": bool((t == world * (world + 1) / 2).all())}


def join_disagree(rank: int, world: int) -> dict:
    """The last rank runs its second forward under torch.no_grad(), the others with grad:
    an error on every rank (with 3 ranks also on rank 0, which joined after one batch),
    not a hang."""
    model = init_model("mlp")
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    n = 1 if rank == 0 and world > 2 else 3
    msg = None
    try:
        with ddp.join():
            for s in range(n):
                x, y = batch(rank, s)
                if s == 1 and rank == world - 1:
                    with torch.no_grad():
                        ddp(x)
                else:
                    F.mse_loss(ddp(x), y).backward()
    except RuntimeError as e:
        msg = str(e)
    return {"msg": msg}


# ---------------------------------------------------------------------------- models differ


def _differ(rank: int, world: int, kind: str) -> nn.Module:
    odd = rank == world - 1
    torch.manual_seed(0)
    if kind == "shape":
        return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 5 if odd else 4))
    if kind == "count":
        layers = [nn.Linear(8, 8), nn.Linear(8, 4)] + ([nn.Linear(4, 4)] if odd else [])
        return nn.Sequential(*layers)
    if kind == "dtype":
        m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
        return m.double() if odd else m
    if kind == "buffer":
        m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
        m.register_buffer("stats", torch.zeros(6 if odd else 3))
        return m
    if kind == "extra_buffer":
        m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
        if odd:
            m.register_buffer("extra", torch.zeros(2))
        return m
    raise ValueError(kind)


def models_differ(rank: int, world: int) -> dict:
    out = {}
    for kind in ("shape", "count", "dtype", "buffer", "extra_buffer"):
        try:
            DDP(_differ(rank, world, kind))
            out[kind] = {"type": None, "msg": None}
        except Exception as e:  # noqa: BLE001 - reported to the parent
            out[kind] = {"type": type(e).__name__, "msg": str(e)}
    t = torch.full((2,), rank + 1.0)  # rank-dependent: a stale or partial sum shows
    rr.allreduce(t)
    out["comm_ok"] = bool((t == world * (world + 1) / 2).all())
    return out


def join_suite(rank: int, world: int) -> dict:
    """Every clean (non-poisoning) scenario in one launch: {name: result or {"error"}}."""
    torch.set_num_threads(1)
    scenarios: dict[str, Callable[[], Any]] = {
        "initial": lambda: join_train(rank, world),
        "active": lambda: join_train(rank, world, divide_by_initial_world_size=False),
        "zero": lambda: join_train(rank, world, variant="zero"),
        "hook_view": lambda: join_train(rank, world, hook="allreduce_hook",
                                        gradient_as_bucket_view=True),
        "mixed": lambda: join_train(rank, world, kind="mixed", micro=2,
                                    find_unused_parameters=True),
        "static": lambda: join_train(rank, world, variant="zero", static_graph=True),
        "between": lambda: join_train(rank, world, metric_between=True),
        "throw": lambda: join_throw(rank, world),
        "differ": lambda: models_differ(rank, world),
        "disagree": lambda: join_disagree(rank, world),
    }
    out = {}
    for name, fn in scenarios.items():
        try:
            out[name] = fn()
        except Exception:  # noqa: BLE001 - reported per scenario
            out[name] = {"error": traceback.format_exc()}
        if name == "disagree":
            break  # that error leaves the schedule unknown: nothing after it
    return out


# ---------------------------------------------------------------------------- faults


def _exc_info(e: BaseException, where: str, step: int) -> dict:
    return {"type": type(e).__name__, "msg": str(e), "where": where, "step": step,
            "notes": list(getattr(e, "__notes__", [])),
            "t_err": time.time(), "is_rr": isinstance(e, rr.RingReduceError),
            "peer_rank": getattr(e, "peer_rank", None)}


def _train_until_error(rank: int, ddp: DDP, opt: torch.optim.Optimizer, steps: int,
                       on_step: Callable[[int], None] | None = None) -> dict | None:
    """Train for `steps` steps; return what was raised (and where), or None."""
    for s in range(steps):
        if on_step is not None:
            on_step(s)
        where = "forward"
        try:
            opt.zero_grad()
            x, y = batch(rank, s)
            loss = F.mse_loss(ddp(x), y)
            where = "backward"
            loss.backward()
            where = "step"
            opt.step()
        except Exception as e:  # noqa: BLE001
            return _exc_info(e, where, s)
    return None


def kill_in_backward(rank: int, world: int, victim: int, stamp_file: str) -> dict:
    """At step 3 the victim SIGKILLs itself from a gradient hook on the first layer (its
    gradient is computed last), after the buckets of the later layers were launched. The
    others report the error they got, where and when, and what the next collective says."""
    model = init_model("mlp")
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    assert len(ddp.reducer.buckets) >= 3

    def die(_grad: torch.Tensor) -> None:
        launched = len(ddp.reducer.stats.launch_times)
        with open(stamp_file + ".tmp", "w") as f:
            f.write(f"{time.time()!r} {launched}")
        os.replace(stamp_file + ".tmp", stamp_file)
        os.kill(os.getpid(), signal.SIGKILL)

    def on_step(s: int) -> None:
        if s == 3 and rank == victim:
            model.l1.weight.register_hook(die)

    info = _train_until_error(rank, ddp, opt, 1000, on_step)
    if info is None:
        return {"type": None, "msg": "no error"}
    try:
        rr.allreduce(torch.ones(2))
        info["after"] = None
    except Exception as e:  # noqa: BLE001
        info["after"] = f"{type(e).__name__}: {e}"
    return info


def uneven_without_join(rank: int, world: int, stamp_file: str) -> dict:
    """Rank r has 3+2r batches and no join(): rank 0 runs out first, returns, and the spawn
    helper calls rr.destroy() and exits. The others must raise an error naming rank 0."""
    model = init_model("mlp")
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    n = num_batches(rank, world, "uneven")
    info = _train_until_error(rank, ddp, opt, n)
    if rank == 0:
        with open(stamp_file + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(stamp_file + ".tmp", stamp_file)
        return {"type": None, "done": n, "error": info}
    return info or {"type": None, "msg": f"no error after {n} batches"}


def torch_ddp_peer_killed(rank: int, world: int, victim: int) -> dict:
    """Stock torch DDP on the "ringreduce" backend; the victim SIGKILLs itself before step
    3's backward. Before, the survivors' reducer took the failed Future's exception object
    for the gradient tensors and segfaulted; now backward raises, naming the dead rank."""
    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    out: dict = {"error": None}
    for step in range(10):
        if step == 3 and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            ddp(torch.randn(4, 16)).sum().backward()
        except Exception as e:  # noqa: BLE001
            out.update(error=f"{type(e).__name__}: {e}", step=step,
                       secs=time.monotonic() - t0)
            break
        time.sleep(0.2)  # the victim dies while the others start step 3's backward
    dist.destroy_process_group()
    return out


def torch_ddp_ctrl_c_in_backward(rank: int, world: int) -> dict:
    """Stock torch DDP on the "ringreduce" backend: rank 0 gets SIGINT 1 s into a backward()
    whose all-reduce waits for the other ranks (3 s late). It raised "RuntimeError: Cannot
    extract tensors from value: KeyboardInterrupt" (a Python callback converted the future's
    value on the main thread, where the pending handler ran); gloo raises KeyboardInterrupt
    once backward() returns, the step's gradients all-reduced. The same here now."""
    import threading

    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
    for _ in range(3):  # buckets rebuilt: the next forward has no collective
        ddp(torch.randn(4, 16)).sum().backward()
    ddp.zero_grad()
    loss = ddp(torch.full((4, 16), float(rank + 1))).sum()
    if rank == 0:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    else:
        time.sleep(3.0)
    out: dict = {"error": None}
    try:
        loss.backward()
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt is the point
        out["error"] = f"{type(e).__name__}: {e}"
    out["grad"] = ddp.module.bias.grad.tolist()
    dist.destroy_process_group()
    return out
