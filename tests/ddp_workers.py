"""Functions that run inside ranks (started by _spawn.run_world) for test_ddp.py and
test_backend.py. Each runs many scenarios in one launch, catching each scenario's error, so
the suite starts few processes.

Every scenario compares N-rank training with a single-process reference that each rank
computes itself on the concatenated global batch (the inputs are a pure function of the
seed), and returns max |difference| numbers the parent checks against tolerances.
"""

from __future__ import annotations

import copy
import dataclasses
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
TINY_CAP_MB = 0.0005  # ~512 bytes: several buckets even for the small test models


# ---------------------------------------------------------------------------- models, data


class MLP(nn.Module):
    def __init__(self, with_f64: bool = False, hidden: int = 16) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.l3 = nn.Linear(hidden, 4)
        # A float64 parameter: buckets never mix dtypes.
        self.scale = nn.Parameter(torch.ones(4, dtype=torch.float64)) if with_f64 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))
        return y * self.scale.float() if self.scale is not None else y


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class Branchy(nn.Module):
    """`c` is used only when asked (rank/step dependent); `never` is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.c = nn.Linear(16, 4)
        self.never = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        out = self.b(h)
        return out + self.c(h) if use_c else out


class TwoPaths(nn.Module):
    """y = p(x) + q(x); which path is computed first decides the gradient-ready order."""

    def __init__(self) -> None:
        super().__init__()
        self.p1, self.p2 = nn.Linear(8, 8), nn.Linear(8, 4)
        self.q1, self.q2 = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, q_first: bool = False) -> torch.Tensor:
        if q_first:
            q = self.q2(torch.tanh(self.q1(x)))
            p = self.p2(torch.tanh(self.p1(x)))
        else:
            p = self.p2(torch.tanh(self.p1(x)))
            q = self.q2(torch.tanh(self.q1(x)))
        return p + q


def batch(step: int, world: int, shape: tuple = (8,), seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn((world * B,) + shape, generator=g), torch.randn(world * B, 4, generator=g)


def shard(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * B:(rank + 1) * B]


def maxdiff(a: nn.Module, b: nn.Module) -> float:
    return max(float((x.detach().double() - y.detach().double()).abs().max())
               for x, y in zip(a.parameters(), b.parameters()))


def bufdiff(a: nn.Module, b: nn.Module) -> float:
    return max([float((x.double() - y.double()).abs().max())
                for x, y in zip(a.buffers(), b.buffers())] or [0.0])


def make(model_fn: Callable[[], nn.Module], seed: int = 0) -> tuple:
    """A model (different init per rank, to check the broadcast from rank 0) and the
    reference: rank 0's initial weights."""
    torch.manual_seed(seed)
    ref = model_fn()
    torch.manual_seed(seed + 17 * rr.get_rank())
    model = model_fn()
    return model, ref


def sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


# ---------------------------------------------------------------------------- scenarios


def sc_plain(rank: int, world: int, steps: int = 4, **ddp_kw: Any) -> dict:
    with_f64 = ddp_kw.pop("with_f64", False)
    set_to_none = ddp_kw.pop("set_to_none", True)
    hook = ddp_kw.pop("hook", None)
    hidden = ddp_kw.pop("hidden", 16)
    model, ref = make(lambda: MLP(with_f64, hidden))
    ddp = DDP(model, **ddp_kw)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad(set_to_none=set_to_none)
        F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
    out = {"diff": maxdiff(model, ref), "buckets": len(ddp.reducer.buckets),
           "in_place": ddp.reducer.stats.in_place, "overlap": ddp.reducer.overlap,
           "early": ddp.reducer.stats.early}
    if ddp_kw.get("gradient_as_bucket_view"):
        bufs = [(b.buffer.data_ptr(), b.buffer.data_ptr() + b.buffer.numel() * b.buffer.element_size())
                for b in ddp.reducer.buckets]
        out["grads_are_views"] = all(
            p.grad is not None and any(lo <= p.grad.data_ptr() < hi for lo, hi in bufs)
            for p in model.parameters())
    return out


def sc_batchnorm(rank: int, world: int, steps: int = 4) -> dict:
    model, ref = make(ConvBN)
    ddp = DDP(model, broadcast_buffers=True, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world, (3, 8, 8))
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
        # Reference: each rank's shard normalised with its own batch statistics (as DDP
        # does); the running statistics are rank 0's (broadcast before every forward).
        ropt.zero_grad()
        start = {k: v.clone() for k, v in ref.state_dict().items() if "bn." in k}
        after0 = None
        for r in range(world):
            ref.load_state_dict(start, strict=False)
            (F.mse_loss(ref(shard(x, r)), shard(y, r)) / world).backward()
            if r == 0:
                after0 = {k: v.clone() for k, v in ref.state_dict().items() if "bn." in k}
        ref.load_state_dict(after0, strict=False)
        ropt.step()
    out = {"diff": maxdiff(model, ref)}
    if rank == 0:
        out["buf_diff"] = bufdiff(model, ref)
    # One more forward: every rank gets rank 0's buffers.
    ddp(shard(batch(99, world, (3, 8, 8))[0], rank))
    return out


def sc_no_sync(rank: int, world: int, steps: int = 3, micro: int = 3, **ddp_kw: Any) -> dict:
    model, ref = make(MLP)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB, **ddp_kw)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        opt.zero_grad()
        ropt.zero_grad()
        for m in range(micro):
            x, y = batch(10 * s + m, world)
            if m < micro - 1:
                with ddp.no_sync():
                    F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
            else:
                F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
            F.mse_loss(ref(x), y).backward()
        opt.step()
        ropt.step()
    return {"diff": maxdiff(model, ref)}


def sc_unused(rank: int, world: int, steps: int = 4, **ddp_kw: Any) -> dict:
    """`c` used by some ranks only (varies per step; on the last step by none); `never`
    by none. find_unused_parameters=True."""
    model, ref = make(Branchy)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=TINY_CAP_MB, **ddp_kw)
    opt, ropt = sgd(ddp), sgd(ref)

    def uses_c(r: int, s: int) -> bool:
        return s < steps - 1 and (r + s) % 2 == 0

    c_grad_none = []
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank), use_c=uses_c(rank, s)), shard(y, rank)).backward()
        c_grad_none.append(model.c.weight.grad is None)
        opt.step()
        ropt.zero_grad()
        loss = sum(F.mse_loss(ref(shard(x, r), use_c=uses_c(r, s)), shard(y, r))
                   for r in range(world)) / world
        loss.backward()
        ropt.step()
    return {"diff": maxdiff(model, ref), "never_grad_none": model.never.weight.grad is None,
            "c_grad_none": c_grad_none,
            "c_expected_none": [not any(uses_c(r, s) for r in range(world))
                                for s in range(steps)]}


def sc_static_graph(rank: int, world: int, steps: int = 4) -> dict:
    model, ref = make(Branchy)
    ddp = DDP(model, static_graph=True, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
    return {"diff": maxdiff(model, ref), "never_grad_none": model.never.weight.grad is None}


def sc_hook_order(rank: int, world: int, steps: int = 3) -> dict:
    """A user hook sees GradBucket objects; buckets are launched in index order."""
    model, ref = make(MLP)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    seen: list = []

    def hook(state: Any, bucket: hooks.GradBucket) -> torch.futures.Future:
        assert bucket.buffer().numel() == sum(p.numel() for p in bucket.parameters())
        assert [g.shape for g in bucket.gradients()] == [p.shape for p in bucket.parameters()]
        seen.append((bucket.index(), bucket.is_last()))
        return hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
    nb = len(ddp.reducer.buckets)
    expect = [(i, i == nb - 1) for i in range(nb)] * steps
    return {"diff": maxdiff(model, ref), "order_ok": seen == expect, "buckets": nb}


def sc_rebuild(rank: int, world: int, steps: int = 3) -> dict:
    """Rank 0 computes path q first, the others p first: their gradient-ready orders
    differ; after iteration 1 every rank must use rank 0's order."""
    model, ref = make(TwoPaths)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB / 4)
    initial = ddp.bucket_parameter_names()
    # Rank 0's observed order, measured on a plain copy with hooks.
    probe = copy.deepcopy(ref)
    order: list = []
    names = {id(p): n for n, p in probe.named_parameters()}
    hs = [p.register_post_accumulate_grad_hook(lambda p: order.append(names[id(p)]))
          for p in probe.parameters()]
    probe(torch.randn(2, 8), q_first=True).sum().backward()
    for h in hs:
        h.remove()
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank), q_first=rank == 0), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
    return {"diff": maxdiff(model, ref), "initial": initial,
            "after": ddp.bucket_parameter_names(), "rank0_order": order}


def sc_unused_error(rank: int, world: int) -> dict:
    """An unused parameter without find_unused_parameters: an actionable error on every
    rank, not a hang; the communicator stays usable."""
    model, _ = make(Branchy)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    x, y = batch(0, world)
    msg = None
    try:
        F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
    except RuntimeError as e:
        msg = str(e)
    t = torch.ones(3)
    rr.allreduce(t)
    return {"msg": msg, "comm_ok": bool((t == world).all())}


def sc_shape_mismatch(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 17 if rank == world - 1 else 16))
    try:
        DDP(model)
    except ValueError as e:
        return {"msg": str(e)}
    return {"msg": None}


def sc_state_dict(rank: int, world: int) -> dict:
    model, _ = make(ConvBN)
    ddp = DDP(model)
    keys = list(ddp.state_dict())
    expect = ["module." + k for k in model.state_dict()]
    # Rank 0's weights were broadcast at construction.
    w = model.conv.weight.detach().clone()
    rr.broadcast(w, src=0)
    return {"keys_ok": keys == expect, "synced": bool(torch.equal(w, model.conv.weight))}


def sc_nosync_unused(rank: int, world: int, micro: int = 2, **ddp_kw: Any) -> dict:
    """Gradients accumulated under no_sync(), then a synchronised step in which `c` is
    unused on the odd ranks (find_unused_parameters): those ranks contribute the gradient
    they accumulated (torch does), not zeros; every rank ends with the average of all."""
    model, ref = make(Branchy)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=TINY_CAP_MB, **ddp_kw)
    x, y = batch(0, world)
    xs, ys = [shard(x, r) for r in range(world)], [shard(y, r) for r in range(world)]
    with ddp.no_sync():
        for _ in range(micro):
            F.mse_loss(ddp(xs[rank]), ys[rank]).backward()
    F.mse_loss(ddp(xs[rank], use_c=rank % 2 == 0), ys[rank]).backward()
    # Reference: the sum over ranks of what each accumulated, divided by the world size.
    for r in range(world):
        for _ in range(micro):
            (F.mse_loss(ref(xs[r]), ys[r]) / world).backward()
        (F.mse_loss(ref(xs[r], use_c=r % 2 == 0), ys[r]) / world).backward()
    diff = max((p.grad - q.grad).abs().max().item() for p, q in
               zip(model.parameters(), ref.parameters()) if q.grad is not None)
    return {"diff": diff}


def sc_buffers_not_broadcast(rank: int, world: int) -> dict:
    """broadcast_buffers=False: rank-local buffers are left alone, at construction too
    (torch's init sync copies only parameters then)."""
    model, _ = make(ConvBN)
    with torch.no_grad():
        model.bn.running_mean.fill_(float(rank + 1))
    ddp = DDP(model, broadcast_buffers=False)
    kept = model.bn.running_mean.tolist()
    ddp(torch.randn(2, 3, 8, 8))  # no broadcast before the forward either
    moved = model.bn.running_mean.tolist()
    return {"kept": kept, "moved": moved,
            "params": [p.detach().sum().item() for p in model.parameters()]}


@dataclasses.dataclass
class _Out:
    pred: torch.Tensor
    extra: Any = None


class DataclassOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Branchy()

    def forward(self, x: torch.Tensor, use_c: bool = True) -> _Out:
        return _Out(self.inner(x, use_c), {"note": "not a tensor"})


def sc_dataclass_output(rank: int, world: int, steps: int = 3) -> dict:
    """A forward that returns a dataclass (as many HF models do), with
    find_unused_parameters: the graph is found through its fields (torch's _find_tensors)."""
    model, ref = make(DataclassOut)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank)).pred, shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x).pred, y).backward()
        ropt.step()
    return {"diff": maxdiff(model, ref)}


# ---------------------------------------------------------------- found by a helper's hunt


class CheckpointedHead(nn.Module):
    """o(checkpoint(tanh(a(x)))) with torch.utils.checkpoint(use_reentrant=True) around the
    last layer: its gradients arrive inside a nested backward, a's after it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.o = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.o, torch.tanh(self.a(x)), use_reentrant=True)


def sc_reentrant_checkpoint(rank: int, world: int, steps: int = 3, **ddp_kw: Any) -> dict:
    """The end of the nested backward is not the end of backward (it was: 'a.weight did
    not receive a gradient'; with static_graph 'o.bias was marked ready twice')."""
    model, ref = make(CheckpointedHead)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB, **ddp_kw)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank).requires_grad_()), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x.requires_grad_()), y).backward()
        ropt.step()
    return {"diff": maxdiff(model, ref)}


def sc_unused_but_unsynced(rank: int, world: int, steps: int = 2) -> dict:
    """find_unused_parameters: `c` gets gradients only in no_sync() micro-batches, not in
    the synchronised one: it is reduced all the same (torch's local_used_map); it was left
    as each rank's own accumulation, silently different per rank."""
    model, ref = make(Branchy)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        xs, ys = [shard(x, r) for r in range(world)], [shard(y, r) for r in range(world)]
        opt.zero_grad()
        ropt.zero_grad()
        with ddp.no_sync():
            F.mse_loss(ddp(xs[rank]), ys[rank]).backward()
        F.mse_loss(ddp(xs[rank], use_c=False), ys[rank]).backward()
        for r in range(world):
            (F.mse_loss(ref(xs[r]), ys[r]) / world).backward()
            (F.mse_loss(ref(xs[r], use_c=False), ys[r]) / world).backward()
        opt.step()
        ropt.step()
    return {"diff": maxdiff(model, ref)}


def sc_forward_without_backward(rank: int, world: int, steps: int = 3) -> dict:
    """find_unused_parameters: rank 0 alone runs an extra grad-enabled forward (logging)
    that never sees a backward: it issues no collective (it did: a mismatch on every rank)."""
    model, ref = make(Branchy)
    ddp = DDP(model, find_unused_parameters=True, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        if rank == 0:
            ddp(shard(x, rank), use_c=False).sum().item()
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank), use_c=s % 2 == 0), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x, use_c=s % 2 == 0), y).backward()
        ropt.step()
    return {"diff": maxdiff(model, ref)}


class _Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom in backward")


def sc_failed_backward_sticks(rank: int, world: int) -> dict:
    """A backward that raised after some gradients were ready: every later synchronised
    forward raises (it raised once, then training went on out of step with the peers);
    no_grad forwards (evaluation) still run."""
    model, _ = make(MLP)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    # Buckets launched at the end of backward only: the failed backward issues no collective
    # on any rank, so the suite's communicator stays in step (with overlap on some ranks
    # only, those would have launched buckets the others never match).
    ddp.reducer.overlap = False
    x, y = batch(0, world)
    errors = []
    try:
        F.mse_loss(ddp(_Boom.apply(shard(x, rank).requires_grad_())), shard(y, rank)).backward()
    except ValueError as e:
        errors.append(str(e))
    for _ in range(2):
        try:
            ddp(shard(x, rank))
        except RuntimeError as e:
            errors.append(str(e))
    with torch.no_grad():
        ddp(shard(x, rank))
    rr.barrier()  # still in step
    return {"errors": errors}


def sc_copies(rank: int, world: int, steps: int = 2) -> dict:
    """copy.deepcopy and torch.save / torch.load of the wrapper give a model that reduces
    its gradients (the copy's were silently local; saving failed on a local hook)."""
    import io

    model, ref = make(MLP)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    buf = io.BytesIO()
    torch.save(ddp, buf)
    buf.seek(0)
    out = {}
    for name, m in (("deepcopy", copy.deepcopy(ddp)),
                    ("pickled", torch.load(buf, weights_only=False))):
        r = copy.deepcopy(ref)
        opt, ropt = sgd(m), sgd(r)
        for s in range(steps):
            x, y = batch(s, world)
            opt.zero_grad()
            F.mse_loss(m(shard(x, rank)), shard(y, rank)).backward()
            opt.step()
            ropt.zero_grad()
            F.mse_loss(r(x), y).backward()
            ropt.step()
        out[name] = maxdiff(m.module, r)
    out["original_untouched"] = maxdiff(model, ref)
    return out


def sc_forward_sync_buffers_false(rank: int, world: int) -> dict:
    """forward_sync_buffers=False still syncs buffers at construction (torch 2.13), unlike
    broadcast_buffers=False; bucket_cap_mb=0 gives one bucket per parameter."""
    model, _ = make(ConvBN)
    with torch.no_grad():
        model.bn.running_mean.fill_(float(rank + 1))
    ddp = DDP(model, forward_sync_buffers=False, bucket_cap_mb=0)
    return {"synced": model.bn.running_mean.tolist(), "flag": ddp.forward_sync_buffers,
            "buckets": len(ddp.reducer.buckets), "params": len(list(model.parameters()))}


def _future_hook(state: Any, bucket: Any) -> Any:
    """A custom comm hook written as for torch (work.get_future()), on the rr wrapper."""
    buf = bucket.buffer().div_(rr.get_world_size())
    work = rr.allreduce(buf, async_op=True)
    fut = work.get_future()
    assert fut.wait()[0] is buf and work.wait()  # the value is [the output], wait() still works
    return fut


SCENARIOS: dict = {
    "plain": lambda r, w: sc_plain(r, w),
    # Buckets above shared memory's one-round size, reduced in the gradients themselves
    # (fresh gradients each step, and gradients accumulated into the same tensors).
    "plain_wide": lambda r, w: sc_plain(r, w, hidden=160, bucket_cap_mb=0.05),
    "plain_wide_keep": lambda r, w: sc_plain(r, w, hidden=160, set_to_none=False),
    "plain_tiny_buckets_f64": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB,
                                                    with_f64=True),
    "grad_as_view": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB,
                                          gradient_as_bucket_view=True, set_to_none=False),
    "grad_as_view_none": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB,
                                               gradient_as_bucket_view=True),
    "fp16_hook": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB,
                                       hook=hooks.fp16_compress_hook),
    "bf16_hook": lambda r, w: sc_plain(r, w, hook=hooks.bf16_compress_hook),
    "batchnorm": sc_batchnorm,
    "no_sync": lambda r, w: sc_no_sync(r, w),
    "no_sync_view": lambda r, w: sc_no_sync(r, w, gradient_as_bucket_view=True),
    "unused": lambda r, w: sc_unused(r, w),
    "unused_view": lambda r, w: sc_unused(r, w, gradient_as_bucket_view=True),
    "static_graph": sc_static_graph,
    "hook_order": sc_hook_order,
    "rebuild": sc_rebuild,
    "unused_error": sc_unused_error,
    "shape_mismatch": sc_shape_mismatch,
    "state_dict": sc_state_dict,
    "nosync_unused": lambda r, w: sc_nosync_unused(r, w),
    "nosync_unused_view": lambda r, w: sc_nosync_unused(r, w, gradient_as_bucket_view=True),
    "buffers_not_broadcast": sc_buffers_not_broadcast,
    "dataclass_output": sc_dataclass_output,
    "future_hook": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB, hook=_future_hook),
    "reentrant_checkpoint": lambda r, w: sc_reentrant_checkpoint(r, w),
    "reentrant_checkpoint_static": lambda r, w: sc_reentrant_checkpoint(r, w, static_graph=True),
    "unused_but_unsynced": sc_unused_but_unsynced,
    "forward_without_backward": sc_forward_without_backward,
    "failed_backward_sticks": sc_failed_backward_sticks,
    "copies": sc_copies,
    "forward_sync_buffers_false": sc_forward_sync_buffers_false,
}


def ddp_suite(rank: int, world: int, names: list | None = None) -> dict:
    """Run the named scenarios (all by default) in order; {name: result or {"error"}}."""
    torch.set_num_threads(1)
    out = {}
    for name in names or list(SCENARIOS):
        try:
            out[name] = SCENARIOS[name](rank, world)
        except Exception:  # noqa: BLE001 - reported per scenario
            out[name] = {"error": traceback.format_exc()}
    return out


# ---------------------------------------------------------------------------- torch backend


def _close(a: torch.Tensor, b: Any) -> bool:
    return bool(torch.allclose(a.double(), torch.as_tensor(b).double(), rtol=1e-6, atol=1e-6))


def backend_collectives(rank: int, world: int) -> dict:
    """dist.* over the "ringreduce" backend; {check: ok} (expectations from ranks' inputs)."""
    import torch.distributed as dist

    res: dict = {}

    def check(name: str, fn: Callable[[], bool]) -> None:
        try:
            res[name] = bool(fn())
        except Exception:  # noqa: BLE001
            res[name] = traceback.format_exc()

    n = world
    tri = n * (n + 1) / 2  # sum of rank+1

    def allreduce_ops() -> bool:
        ok = True
        for op, exp in [(dist.ReduceOp.SUM, tri), (dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1),
                        (dist.ReduceOp.AVG, tri / n)]:
            t = torch.full((7,), float(rank + 1))
            dist.all_reduce(t, op=op)
            ok &= _close(t, torch.full((7,), exp))
        t = torch.full((5,), rank + 1, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        fact = 1
        for i in range(1, n + 1):
            fact *= i
        return ok and bool((t == fact).all())

    def allreduce_async_future() -> bool:
        t = torch.full((1000,), float(rank + 1))
        w = dist.all_reduce(t, async_op=True)
        v = w.get_future().wait()
        w.wait()
        return w.is_completed() and _close(v[0], torch.full((1000,), tri)) and v[0] is t

    def allreduce_noncontig() -> bool:
        base = torch.zeros(4, 6)
        view = base[:, ::2]
        view.fill_(rank + 1.0)
        dist.all_reduce(view)
        return _close(view, torch.full((4, 3), tri)) and bool((base[:, 1::2] == 0).all())

    def allreduce_param_grad_enabled() -> bool:
        p = nn.Parameter(torch.full((3,), float(rank + 1)))
        dist.all_reduce(p.data)
        dist.all_reduce(p)  # torch allows a leaf that requires grad, as gloo does
        return _close(p.detach(), torch.full((3,), tri * n))

    def broadcast() -> bool:
        t = torch.arange(10.) * (rank + 1)
        dist.broadcast(t, src=n - 1)
        return _close(t, torch.arange(10.) * n)

    def all_gather() -> bool:
        outs = [torch.empty(2, 3) for _ in range(n)]
        dist.all_gather(outs, torch.full((2, 3), float(rank)))
        ok = all(_close(o, torch.full((2, 3), float(r))) for r, o in enumerate(outs))
        # async: result() and the future's value are the output tensors (a flat list, as
        # gloo's; a list of lists raised in torch's cast)
        outs = [torch.empty(4) for _ in range(n)]
        w = dist.all_gather(outs, torch.full((4,), rank + 0.5), async_op=True)
        got, fut = w.result(), w.get_future().wait()
        want = [torch.full((4,), r + 0.5) for r in range(n)]
        return ok and all(len(v) == n and all(_close(a, b) for a, b in zip(v, want))
                          for v in (got, fut))

    def all_gather_into_tensor() -> bool:
        out = torch.empty(n * 3)
        dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
        return _close(out, torch.arange(n).repeat_interleave(3).float())

    def reduce_scatter() -> bool:
        out = torch.empty(4)
        dist.reduce_scatter(out, [torch.full((4,), float(rank + 10 * i)) for i in range(n)])
        return _close(out, torch.full((4,), sum(range(n)) + 10.0 * rank * n))

    def reduce_scatter_tensor() -> bool:
        out = torch.empty(2)
        inp = torch.arange(2.0 * n) + rank
        dist.reduce_scatter_tensor(out, inp)
        exp = (torch.arange(2.0 * n) * n + sum(range(n)))[rank * 2:(rank + 1) * 2]
        return _close(out, exp)

    def barrier() -> bool:
        dist.barrier()
        w = dist.barrier(async_op=True)
        return w.wait() is not False

    def objects() -> bool:
        objs: list = [None] * n
        dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
        lst = [{"from": 0}] if rank == 0 else [None]
        dist.broadcast_object_list(lst, src=0)
        return objs == [{"rank": r, "s": "x" * r} for r in range(n)] and lst == [{"from": 0}]

    def reduce_gather_scatter() -> bool:
        t = torch.full((3,), float(rank + 1))
        dist.reduce(t, dst=0)
        ok = _close(t, torch.full((3,), tri if rank == 0 else float(rank + 1)))
        g = [torch.empty(2) for _ in range(n)] if rank == 0 else None
        w = dist.gather(torch.full((2,), float(rank)), g, dst=0, async_op=True)
        w.wait()
        if rank == 0:
            ok &= all(_close(x, torch.full((2,), float(r))) for r, x in enumerate(g))
            ok &= len(w.result()) == n and all(a is b for a, b in zip(w.result(), g))
        o = torch.empty(2)
        dist.scatter(o, [torch.full((2,), float(i)) for i in range(n)] if rank == 0 else None,
                     src=0)
        return ok and _close(o, torch.full((2,), float(rank)))

    def bad_op_message() -> bool:
        try:  # a root outside the group: a clear error (was a bare IndexError)
            dist.broadcast(torch.ones(2), group_src=n)
            return False
        except ValueError as e:
            if f"rank {n} is not a rank of this process group" not in str(e):
                return False
        try:  # bitwise on floats: refused before anything moves, saying why
            dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
        except ValueError as e:
            return "bitwise" in str(e)
        return False

    def bitwise_ops() -> bool:
        bits = torch.tensor([1 << rank, 0xFF, rank], dtype=torch.int32)
        want = {dist.ReduceOp.BAND: [0 if n > 1 else 1, 0xFF, 0],  # rank 0's 0 ANDs to 0
                dist.ReduceOp.BOR: [(1 << n) - 1, 0xFF, 0],
                dist.ReduceOp.BXOR: [(1 << n) - 1, 0xFF * (n % 2), 0]}
        for r in range(n):
            want[dist.ReduceOp.BOR][2] |= r
            want[dist.ReduceOp.BXOR][2] ^= r
        ok = True
        for op, exp in want.items():
            t = bits.clone()
            dist.all_reduce(t, op=op)
            ok &= t.tolist() == exp
        flags = torch.tensor([rank == 0, True, False])  # bool: SUM = or, PRODUCT = and
        t = flags.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        ok &= t.tolist() == [True, True, False]
        t = flags.clone()
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        return ok and t.tolist() == [n == 1, True, False]

    def premul_sum() -> bool:
        """PREMUL_SUM with a double and a tensor factor (all_reduce, reduce_scatter_tensor:
        its input must stay untouched)."""
        ok = True
        for factor in (0.5, torch.tensor([0.25])):
            op = dist._make_nccl_premul_sum(factor)
            f = float(factor) if not torch.is_tensor(factor) else float(factor[0])
            t = torch.full((6,), float(rank + 1))
            dist.all_reduce(t, op=op)
            ok &= _close(t, torch.full((6,), f * tri))
            inp = torch.arange(2.0 * n) + rank
            out = torch.empty(2)
            dist.reduce_scatter_tensor(out, inp.clone(), op=op)
            full = sum(torch.arange(2.0 * n) + r for r in range(n)) * f
            ok &= _close(out, full[2 * rank:2 * rank + 2])
        return ok

    def wait_timeout() -> bool:
        """work.wait(timeout) is honoured: the last rank arrives 1.5 s late, the others'
        0.3 s wait raises; the collective itself still completes right."""
        from datetime import timedelta

        import ringreduce as rr

        if rank == n - 1:
            time.sleep(1.5)
        t = torch.full((3,), float(rank + 1))
        w = dist.all_reduce(t, async_op=True)
        raised = False
        if rank != n - 1:
            t0 = time.monotonic()
            try:
                w.wait(timeout=timedelta(seconds=0.3))
            except rr.CollectiveTimeout as e:
                raised = "did not complete within" in str(e) and time.monotonic() - t0 < 1.2
        w.wait()
        return (raised or rank == n - 1 or n == 1) and _close(t, torch.full((3,), tri))

    def sparse_message() -> bool:
        # all_reduce of a sparse COO tensor sums like gloo's (rank r puts r + 1 at r % 3 and
        # 1 at 3, so counts of non-zeros differ by rank); other ops are refused.
        t = torch.sparse_coo_tensor(torch.tensor([[rank % 3, 3]]), torch.tensor([rank + 1.0, 1.0]),
                                    (5,))
        dist.all_reduce(t)
        want = torch.zeros(5)
        for r in range(n):
            want[r % 3] += r + 1
        want[3] = n
        ok = t.is_sparse and torch.equal(t.to_dense(), want)
        try:
            dist.all_reduce(torch.ones(3).to_sparse(), op=dist.ReduceOp.MAX)
        except ValueError as e:
            return ok and "SUM only" in str(e) and ".to_dense()" in str(e)
        return False

    for fn in (sparse_message, wait_timeout, allreduce_ops, allreduce_async_future, allreduce_noncontig,
               allreduce_param_grad_enabled, broadcast, all_gather, all_gather_into_tensor,
               reduce_scatter, reduce_scatter_tensor, barrier, objects, reduce_gather_scatter,
               bad_op_message, bitwise_ops, premul_sum):
        check(fn.__name__, fn)
    return res


_KEEP: list = []


def backend_ddp_vs_gloo(rank: int, world: int) -> dict:
    """torch DDP over "ringreduce" vs torch DDP over gloo: same data, same init."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    gloo = dist.new_group(backend="gloo")
    # torch quirk: powerSGD's callbacks run on gloo's worker threads and hold the group in
    # closures; were the last reference dropped there, ~ProcessGroupGloo would join its own
    # thread (std::system_error "Resource deadlock avoided", abort). Keep it to the end.
    _KEEP.append(gloo)
    out: dict = {}
    variants = {
        "plain": ({}, None),
        "view_small_buckets": ({"gradient_as_bucket_view": True, "bucket_cap_mb": 0.0005}, None),
        "find_unused": ({"find_unused_parameters": True}, None),
        "fp16_hook": ({}, default_hooks.fp16_compress_hook),
        # its .then() callbacks wait for further all-reduces' futures (nested waits)
        "powersgd": ({}, powerSGD.powerSGD_hook),
    }
    for name, (kw, hook) in variants.items():
        try:
            torch.manual_seed(1 + rank)  # different init per rank: DDP broadcasts rank 0's
            a = Branchy() if name == "find_unused" else MLP()
            b = copy.deepcopy(a)
            da = TorchDDP(a, **kw)
            db = TorchDDP(b, process_group=gloo, **kw)
            if name == "powersgd":
                for d, pg in ((da, dist.group.WORLD), (db, gloo)):
                    d.register_comm_hook(powerSGD.PowerSGDState(
                        process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2,
                        min_compression_rate=0.5), hook)
            elif hook is not None:
                da.register_comm_hook(dist.group.WORLD, hook)
                db.register_comm_hook(gloo, hook)
            oa, ob = sgd(da), sgd(db)
            kw_fwd = {"use_c": rank == 0} if name == "find_unused" else {}
            for s in range(5 if name == "powersgd" else 3):
                x, y = batch(s, world)
                for d, o in ((da, oa), (db, ob)):
                    o.zero_grad()
                    F.mse_loss(d(shard(x, rank), **kw_fwd), shard(y, rank)).backward()
                    o.step()
            out[name] = {"diff": maxdiff(a, b)}
        except Exception:  # noqa: BLE001
            out[name] = {"error": traceback.format_exc()}
    return out


def backend_suite(rank: int, world: int, reuse: bool) -> dict:
    """init_process_group("ringreduce"), then the checks. reuse=True: ringreduce.init()
    ran first (by the spawn helper) and the backend must reuse its communicator."""
    import torch.distributed as dist

    from ringreduce import _rendezvous, backend

    torch.set_num_threads(1)
    if reuse:
        # rr.init() holds MASTER_PORT's store; hand that store to torch too.
        store = next(iter(_rendezvous._STORES.values()))
        dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world)
    else:
        assert not rr.is_initialized()
        dist.init_process_group("ringreduce")
    pg = dist.group.WORLD
    impl = backend.impl_of(pg)
    info = {"backend": dist.get_backend(), "owns": getattr(impl, "_owns", None),
            "rr_initialized": rr.is_initialized(), "is_ours": impl is not None,
            "c10d": pg._get_backend(torch.device("cpu")).__class__.__name__
            if not isinstance(pg, backend.ProcessGroupRingReduce) else None,
            "group_name": pg.group_name}
    res = {"info": info, "collectives": backend_collectives(rank, world),
           "ddp": backend_ddp_vs_gloo(rank, world)}
    dist.destroy_process_group()
    res["info"]["rr_after_destroy"] = rr.is_initialized()
    if reuse and rr.is_initialized():
        rr.barrier()  # the user's communicator still works
    return res
