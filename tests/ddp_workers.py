"""Functions that run inside ranks (started by _spawn.run_world) for test_ddp.py (the torch
backend's are in backend_workers.py; both take their models and data from ddp_models.py). Each runs many scenarios in one launch, catching each scenario's error, so
the suite starts few processes.

Every scenario compares N-rank training with a single-process reference that each rank
computes itself on the concatenated global batch (the inputs are a pure function of the
seed), and returns max |difference| numbers the parent checks against tolerances.
"""

from __future__ import annotations

import copy
import dataclasses
import traceback
from typing import Any

import ddp_models
import torch
import torch.nn.functional as F
from ddp_models import MLP, Branchy, ConvBN, TwoPaths, batch, bufdiff, make, maxdiff, sgd, shard
from torch import nn

import ringreduce as rr
from ringreduce.ddp import DistributedDataParallel as DDP
from ringreduce.ddp import hooks

TINY_CAP_MB = 0.0005  # ~512 bytes: several buckets even for the small test models


# ---------------------------------------------------------------------------- scenarios


def _step(ddp: nn.Module, opt: Any, ref: nn.Module, ropt: Any, x: torch.Tensor,
          y: torch.Tensor, rank: int, set_to_none: bool = True) -> None:
    """One SGD step of the wrapped model on this rank's shard and of the reference on the
    whole batch."""
    opt.zero_grad(set_to_none=set_to_none)
    F.mse_loss(ddp(shard(x, rank)), shard(y, rank)).backward()
    opt.step()
    ropt.zero_grad()
    F.mse_loss(ref(x), y).backward()
    ropt.step()


def sc_plain(rank: int, world: int, steps: int = 4, **ddp_kw: Any) -> dict:
    with_f64 = ddp_kw.pop("with_f64", False)
    set_to_none = ddp_kw.pop("set_to_none", True)
    hook = ddp_kw.pop("hook", None)
    hidden = ddp_kw.pop("hidden", 16)
    grad_hook = ddp_kw.pop("grad_hook", None)
    model, ref = make(lambda: MLP(with_f64, hidden))
    ddp = DDP(model, **ddp_kw)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    if grad_hook is not None:  # the user's, after wrapping: runs before the bucket's reduce
        for p in (*model.parameters(), *ref.parameters()):
            p.register_post_accumulate_grad_hook(grad_hook)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        _step(ddp, opt, ref, ropt, *batch(s, world), rank, set_to_none)
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


def _conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 4)).to(
        memory_format=torch.channels_last)


def sc_grad_view_layout(rank: int, world: int, steps: int = 3) -> dict:
    """gradient_as_bucket_view with a channels_last convolution: the gradients (views of
    the buckets) have their parameters' strides, as torch's (they were contiguous)."""
    model, ref = make(_conv_net)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB, gradient_as_bucket_view=True)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world, shape=(3, 8, 8))
        _step(ddp, opt, ref, ropt, x.contiguous(memory_format=torch.channels_last), y, rank,
              set_to_none=False)
    return {"diff": maxdiff(model, ref),
            "strides": [(p.stride(), p.grad.stride()) for p in model.parameters()]}


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


def _warned_all_used(fn: Any, *args: Any, **kw: Any) -> dict:
    """fn's result, with how often DDP warned that find_unused_parameters found nothing."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn(*args, **kw)
    return {**out, "warned": sum("but this forward used every parameter" in str(w.message)
                                 for w in seen)}


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


def sc_static_graph_rank_branch(rank: int, world: int, steps: int = 3) -> dict:
    """static_graph with `c` used on rank 0 only, every step (a static graph per rank, as
    torch allows): rank 1 failed step 2 ("did not receive a gradient": only parameters
    unused on every rank were pre-marked). The reference averages every rank's gradient."""
    model, ref = make(Branchy)
    ddp = DDP(model, static_graph=True, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        F.mse_loss(ddp(shard(x, rank), use_c=rank == 0), shard(y, rank)).backward()
        opt.step()
        ropt.zero_grad()
        for r in range(world):
            (F.mse_loss(ref(shard(x, r), use_c=r == 0), shard(y, r)) / world).backward()
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


def sc_static_graph_changed(rank: int, world: int) -> dict:
    """static_graph=True whose graph changes after the first iteration, both ways (`c`
    unused, then used; used, then unused): torch's "training graph has changed" on every
    rank after the backward's collectives (found by a helper: a mid-backward 'marked ready
    twice ... Use static_graph=True' on some ranks, a mismatch on the others)."""
    msgs = []
    for first in (False, True):
        model, _ = make(Branchy)
        ddp = DDP(model, static_graph=True, bucket_cap_mb=TINY_CAP_MB)
        x, y = batch(0, world)
        try:
            for use_c in (first, not first):
                F.mse_loss(ddp(shard(x, rank), use_c=use_c), shard(y, rank)).backward()
            msgs.append(None)
        except RuntimeError as e:
            msgs.append(str(e))
    t = torch.full((3,), rank + 1.0)
    rr.allreduce(t)
    return {"msgs": msgs, "comm_ok": bool((t == world * (world + 1) / 2).all())}


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
    t = torch.full((3,), rank + 1.0)
    rr.allreduce(t)
    return {"msg": msg, "comm_ok": bool((t == world * (world + 1) / 2).all())}


def sc_shape_mismatch(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 17 if rank == world - 1 else 16))
    try:
        DDP(model)
    except ValueError as e:
        return {"msg": str(e)}
    return {"msg": None}


def sc_option_mismatch(rank: int, world: int) -> dict:
    """The last rank is given other arguments (one at a time): a ValueError naming the
    argument on every rank, not a CollectiveMismatch at the first bucket (or, for
    broadcast_buffers, "the model differs ... 0 buffers")."""
    out = {}
    for name, mine, other in [("bucket_cap_mb", 25, 1), ("find_unused_parameters", False, True),
                              ("broadcast_buffers", True, False)]:
        try:
            DDP(nn.Linear(4, 4), **{name: other if rank == world - 1 else mine})
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    return out


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


def sc_reentrant_checkpoint(rank: int, world: int, steps: int = 3, model_fn: Any = None,
                            **ddp_kw: Any) -> dict:
    """The end of the nested backward is not the end of backward (it was: 'a.weight did
    not receive a gradient'; with static_graph 'o.bias was marked ready twice'). With a
    layer under two checkpoints and static_graph (Recheckpointed, found by a helper): 'm.bias
    was marked ready twice', or alone, the second gradient silently left local."""
    model, ref = make(model_fn or ddp_models.CheckpointedHead)
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


def sc_no_grad_forward_before_backward(rank: int, world: int, steps: int = 3,
                                       no_sync: bool = False) -> dict:
    """A forward under torch.no_grad() (a metric, a validation batch) -- or, with no_sync,
    one inside no_sync() whose output is dropped -- between the training forward and its
    backward: the backward still averages the gradients, as torch's (it did not: each rank
    kept its own, no error; the no_sync() case found by a helper)."""
    model, ref = make(MLP)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    opt, ropt = sgd(ddp), sgd(ref)
    for s in range(steps):
        x, y = batch(s, world)
        opt.zero_grad()
        loss = F.mse_loss(ddp(shard(x, rank)), shard(y, rank))
        with ddp.no_sync() if no_sync else torch.no_grad():
            ddp(batch(50 + s, world)[0][:2 + rank])  # a different batch on each rank
        loss.backward()
        opt.step()
        ropt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ropt.step()
    return {"diff": maxdiff(model, ref)}


def _agreed(t: torch.Tensor) -> bool:
    """Whether `t` is the same on every rank."""
    t = t.detach().double().flatten()
    lo, hi = t.clone(), t.clone()
    rr.allreduce(lo, op="min")
    rr.allreduce(hi, op="max")
    return bool(torch.equal(lo, hi))


def sc_bn_forwards_between(rank: int, world: int, steps: int = 3) -> dict:
    """BatchNorm, broadcast_buffers=True: a first forward under inference_mode() (a sanity
    check before training: its staging buffer became an inference tensor, and the next
    sync failed), then two forwards before one backward (two views of a batch: the
    buffer sync bumped the running stats' versions, "modified by an inplace operation").
    Gradients and buffers agree across ranks."""
    torch.manual_seed(3)
    model = ConvBN()
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    with torch.inference_mode():
        ddp(shard(batch(90, world, (3, 8, 8))[0], rank))
    grads_agree = True
    for s in range(steps):
        x, y = batch(s, world, (3, 8, 8))
        ddp.zero_grad()
        y1 = ddp(shard(x, rank))
        y2 = ddp(shard(x, rank).flip(-1))
        (F.mse_loss(y1, shard(y, rank)) + y2.pow(2).mean()).backward()
        grads_agree &= all(_agreed(p.grad) for p in model.parameters())
    ddp.eval()
    with torch.no_grad():
        ddp(shard(x, rank))  # every rank gets rank 0's running stats (eval: kept as they are)
    return {"grads_agree": grads_agree, "buffers_agree": all(_agreed(b) for b in model.buffers())}


class _Ema(nn.Module):
    """Reassigns its buffer in forward (an exponential moving average of its inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.register_buffer("ema", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ema = 0.5 * self.ema + 0.5 * x.mean(0)
        return self.lin(x)


def sc_reassigned_buffer(rank: int, world: int, steps: int = 3) -> dict:
    """A buffer the module reassigns is still broadcast from rank 0 before each forward
    (it was not: the wrapper kept the construction's tensor, and the ranks drifted apart)."""
    ddp = DDP(_Ema())
    ema0 = torch.zeros(8)  # rank 0's after each step
    diff = 0.0
    for s in range(steps):
        x = batch(s, world)[0]
        ddp(shard(x, rank)).sum().backward()
        want = 0.5 * ema0 + 0.5 * shard(x, rank).mean(0)
        diff = max(diff, float((ddp.module.ema - want).abs().max()))
        ema0 = 0.5 * ema0 + 0.5 * shard(x, 0).mean(0)
    return {"diff": diff}


def sc_unused_on_one_rank_first(rank: int, world: int) -> dict:
    """A parameter used on the last rank only, in the very first iteration, without
    find_unused_parameters: the other ranks get the actionable error, the last trains on,
    and the communicator stays in step (the first iteration's bucket rebuild was skipped by
    the ranks with the error only: a mismatch at everyone's next call)."""
    model, _ = make(Branchy)
    model.never.requires_grad_(False)  # (not reduced)
    ddp = DDP(model, bucket_cap_mb=TINY_CAP_MB)
    x, y = batch(0, world)
    msg = None
    try:
        F.mse_loss(ddp(shard(x, rank), use_c=rank == world - 1), shard(y, rank)).backward()
    except RuntimeError as e:
        msg = str(e)
    t = torch.full((3,), rank + 1.0)
    rr.allreduce(t)
    return {"msg": msg, "comm_ok": bool((t == world * (world + 1) / 2).all())}


def _future_hook(state: Any, bucket: Any) -> Any:
    """A custom comm hook written as for torch (work.get_future()), on the rr wrapper."""
    buf = bucket.buffer().div_(rr.get_world_size())
    work = rr.allreduce(buf, async_op=True)
    fut = work.get_future()
    assert fut.wait()[0] is buf and work.wait()  # the value is [the output], wait() still works
    return fut


def _halve_grad(p: torch.Tensor) -> None:
    p.grad = p.grad * 0.5


def _halve_grad_in_place(p: torch.Tensor) -> None:
    p.grad.mul_(0.5)


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
    # A post-accumulate-grad hook registered after wrapping that scales the gradient in
    # place, or replaces it: the average is of what the hook left, as torch's (the reducer's
    # own hook ran first: the all-reduce raced with the first, missed the second).
    "grad_hook_in_place": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB,
                                                grad_hook=_halve_grad_in_place),
    "grad_hook_new": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB,
                                           grad_hook=_halve_grad),
    "batchnorm": sc_batchnorm,
    "grad_view_layout": sc_grad_view_layout,
    "no_sync": lambda r, w: sc_no_sync(r, w),
    "no_sync_view": lambda r, w: sc_no_sync(r, w, gradient_as_bucket_view=True),
    "unused": lambda r, w: sc_unused(r, w),
    "unused_view": lambda r, w: sc_unused(r, w, gradient_as_bucket_view=True),
    "static_graph": sc_static_graph,
    # find_unused_parameters=True, every parameter used: warns once (as torch); one unused: not
    "find_unused_all_used": lambda r, w: {
        "mlp": _warned_all_used(sc_plain, r, w, find_unused_parameters=True),
        "branchy": _warned_all_used(sc_unused, r, w)},
    "static_graph_rank_branch": sc_static_graph_rank_branch,
    "hook_order": sc_hook_order,
    "rebuild": sc_rebuild,
    "unused_error": sc_unused_error,
    "static_graph_changed": sc_static_graph_changed,
    "shape_mismatch": sc_shape_mismatch,
    "option_mismatch": sc_option_mismatch,
    "state_dict": sc_state_dict,
    "nosync_unused": lambda r, w: sc_nosync_unused(r, w),
    "nosync_unused_view": lambda r, w: sc_nosync_unused(r, w, gradient_as_bucket_view=True),
    "buffers_not_broadcast": sc_buffers_not_broadcast,
    "dataclass_output": sc_dataclass_output,
    "future_hook": lambda r, w: sc_plain(r, w, bucket_cap_mb=TINY_CAP_MB, hook=_future_hook),
    "reentrant_checkpoint": lambda r, w: sc_reentrant_checkpoint(r, w),
    "reentrant_checkpoint_static": lambda r, w: sc_reentrant_checkpoint(r, w, static_graph=True),
    "checkpointed_twice_static": lambda r, w: sc_reentrant_checkpoint(
        r, w, 4, ddp_models.Recheckpointed, static_graph=True),
    "checkpointed_twice_around_static": lambda r, w: sc_reentrant_checkpoint(
        r, w, 4, lambda: ddp_models.Recheckpointed(around=True), static_graph=True),
    "unused_but_unsynced": sc_unused_but_unsynced,
    "forward_without_backward": sc_forward_without_backward,
    "failed_backward_sticks": sc_failed_backward_sticks,
    "copies": sc_copies,
    "forward_sync_buffers_false": sc_forward_sync_buffers_false,
    "no_grad_forward_before_backward": sc_no_grad_forward_before_backward,
    "no_sync_forward_before_backward": lambda r, w: sc_no_grad_forward_before_backward(
        r, w, no_sync=True),
    "bn_forwards_between": sc_bn_forwards_between,
    "reassigned_buffer": sc_reassigned_buffer,
    "unused_on_one_rank_first": sc_unused_on_one_rank_first,
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


def completer_threads(rank: int, world: int, n: int) -> dict:
    """Futures whose callbacks block a while (as a DDP comm hook's may): while they block,
    more completer threads run; then the role holder and its spares, none after destroy().
    Before, each came back to standby and stayed: the peak number lived on for good."""
    import threading
    import time

    def names() -> int:
        return sum(t.name == "ringreduce-completer" for t in threading.enumerate())

    xs = [torch.full((4,), float(rank + i)) for i in range(n)]
    futs = [rr.allreduce(x, async_op=True).get_future().then(lambda f: time.sleep(0.05))
            for x in xs]
    for f in futs:
        f.wait()
    ok = all(torch.equal(x, torch.full((4,), float(i * world + world * (world - 1) // 2)))
             for i, x in enumerate(xs))
    time.sleep(0.2)  # the last callbacks return
    after = names()
    rr.destroy()
    t0 = time.monotonic()
    while names() and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    return {"ok": ok, "after": after, "after_destroy": names()}


def compiled_autograd(rank: int, world: int) -> dict:
    """A backward under compiled autograd is refused with what to do; then one without it
    averages the gradients as always."""
    import torch._dynamo.compiled_autograd as ca

    torch.manual_seed(0)
    m = DDP(nn.Linear(3, 2))
    loss = m(torch.ones(2, 3) * (rank + 1)).sum()
    try:
        with ca._enable(torch.compile(backend="eager")):
            loss.backward()
        error = "no error"
    except Exception as e:  # noqa: BLE001 - whatever dynamo wraps it in
        error = f"{type(e).__name__}: {e}"
    torch._dynamo.reset()
    m.zero_grad()
    m(torch.ones(2, 3) * (rank + 1)).sum().backward()
    return {"error": error[:2000], "grad": m.module.weight.grad[0].tolist()}
