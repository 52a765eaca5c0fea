"""Functions that run inside ranks (started by _spawn.run_world) for test_backend.py: the
"ringreduce" torch.distributed backend's collectives checked against expectations computed
from every rank's inputs, and torch's own DDP over it against torch DDP over gloo (same
data, same init). The models and data helpers are tests/ddp_models.py's."""

from __future__ import annotations

import copy
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.nn.functional as F
from ddp_models import MLP, Branchy, batch, maxdiff, sgd, shard
from torch import nn

import ringreduce as rr


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
        ok = _close(view, torch.full((4, 3), tri)) and bool((base[:, 1::2] == 0).all())
        # coalesced too, as gloo (refused before): a transpose and a strided slice
        a = (torch.arange(6.).reshape(2, 3) + rank).t()
        b = (torch.arange(12.) + 10 * rank)[::3]
        dist.all_reduce_coalesced([a, b])
        s = n * (n - 1) / 2
        return ok and _close(a, torch.arange(6.).reshape(2, 3).t() * n + s) and \
            _close(b, torch.arange(12.)[::3] * n + 10 * s)

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
        return _close(out, torch.arange(n).repeat_interleave(3).float()) and _refused_in_torch_names()

    def _refused_in_torch_names() -> bool:
        """A dtype mismatch is named in torch's terms (it named ringreduce's own allgather's
        `out`; found by a helper), before anything moves."""
        said = []
        for call in (lambda: dist.all_gather_into_tensor(torch.empty(n * 3, dtype=torch.float64),
                                                         torch.ones(3)),
                     lambda: dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.float64),
                                                        torch.ones(2 * n))):
            try:
                call()
            except ValueError as e:
                said.append(str(e).split(":")[0] if "output is torch.float64 but input is "
                            "torch.float32" in str(e) else str(e))
        return said == ["all_gather_into_tensor", "reduce_scatter_tensor"]

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
        except RuntimeError as e:  # as gloo's (and a ValueError, as ringreduce's own)
            return "bitwise" in str(e) and isinstance(e, ValueError)
        return False

    def bad_lists_and_expanded() -> bool:
        """Refused before anything moves, as gloo does (each rank is its own root here, so
        every rank raises): a gather_list / scatter_list of the wrong length or tensor size
        (the lists were concatenated as given: a wrong result or lost data), and an
        expand()ed output (the copy-back failed after the data moved). Each error is a
        RuntimeError, as gloo's, so `except RuntimeError` written for gloo catches it."""
        t = torch.ones(2)
        cpu_backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        cases = [
            (lambda: dist.gather(t, [torch.empty(2) for _ in range(n + 1)], dst=rank),
             f"gather_list has {n + 1} tensors"),
            (lambda: dist.gather(t, [torch.empty(3) for _ in range(n)], dst=rank),
             "gather_list[0] has 3 elements"),
            (lambda: dist.scatter(t, [torch.ones(3) for _ in range(n)], src=rank),
             "scatter_list[0] has 3 elements"),
            (lambda: dist.all_reduce(torch.ones(1).expand(4)), "share memory"),
            # output lists too (the copy out failed after the data moved; found by a helper)
            (lambda: dist.all_gather([torch.zeros(1).expand(2) for _ in range(n)], t),
             "(all_gather: tensor_list[0]) whose elements share memory"),
            (lambda: dist.all_to_all([torch.zeros(1).expand(2)] * n,
                                     [t.clone() for _ in range(n)]),
             "(all_to_all: output_tensor_list[0]) whose elements share memory"),
            (lambda: dist.gather(t, [torch.zeros(1).expand(2) for _ in range(n)], dst=rank),
             "(gather: gather_list[0]) whose elements share memory"),
            # mixed dtypes through the backend object (DTensor's, functional collectives'):
            # torch.cat promoted them and the copy out cast back -- refused, as gloo does
            (lambda: cpu_backend.alltoall([torch.empty(2, dtype=torch.int64) for _ in range(n)],
                                          [torch.ones(2, dtype=torch.int64)] * (n - 1) +
                                          [torch.full((2,), 1.5)]),
             f"input_tensor_list[{n - 1}] is torch.float32 but input_tensor_list[0] is"
             if n > 1 else "output_tensor_list[0] is torch.int64"),
            (lambda: cpu_backend.reduce_scatter([torch.empty(2)],
                                                [[torch.ones(2, dtype=torch.int64)] +
                                                 [torch.ones(2)] * (n - 1)]),
             "input_list[0] is torch.int64 but the output is torch.float32"),
        ]
        for call, words in cases:
            try:
                call()
                return False
            except ValueError as e:
                if words not in str(e) or not isinstance(e, RuntimeError):
                    return False
        x = torch.ones(1).expand(4)  # as an input only, fine
        g = [torch.empty(4) for _ in range(n)]
        dist.all_gather(g, x)
        # a broadcast's source only reads its tensor (was refused there, unlike gloo)
        b = torch.full((1,), 7.0).expand(4) if rank == n - 1 else torch.zeros(4)
        dist.broadcast(b, src=n - 1)
        return all(torch.equal(a, torch.ones(4)) for a in g) and b.tolist() == [7.0] * 4

    def coalesced_checked_first() -> bool:
        """A coalesced call (torch's _coalescing_manager, all_gather_coalesced, the backend's
        ProcessGroup's *_coalesced) checks every pair before its first collective is issued: an error in a
        later pair left the earlier one's output written (and a shorter list of outputs or
        inputs was cut off by zip without a word)."""
        from torch.distributed.distributed_c10d import _coalescing_manager

        a, b = torch.full((2 * n,), -1.0), torch.empty(3 * n + 1)
        outs = [[torch.full((2,), -1.0), torch.empty(3)] for _ in range(n)]
        outs[-1][1] = torch.empty(4)

        def managed() -> None:
            with _coalescing_manager(async_ops=True) as cm:
                dist.all_gather_into_tensor(a, torch.full((2,), float(rank)))
                dist.all_gather_into_tensor(b, torch.ones(3))
            cm.wait()
        cases = [
            (managed, "all_gather_into_tensor: output has"),
            (lambda: dist.all_gather_coalesced(outs, [torch.ones(2), torch.ones(3)]),
             "got 4 of torch.float32"),
            (lambda: pg.allgather_into_tensor_coalesced([a, torch.empty(2 * n)],
                                                        [torch.ones(2)]),
             "2 outputs but 1 inputs"),
            (lambda: pg.reduce_scatter_tensor_coalesced(
                [torch.empty(2)], [torch.ones(2 * n), torch.ones(2 * n)],
                dist.ReduceScatterOptions()), "1 outputs but 2 inputs"),
        ]
        band = dist.ReduceScatterOptions()
        band.reduceOp = dist.ReduceOp.BAND
        first = torch.full((2,), -1, dtype=torch.int32)
        cases.append((lambda: pg.reduce_scatter_tensor_coalesced(  # BAND of float: refused
            [first, torch.empty(2)], [torch.ones(2 * n, dtype=torch.int32),
                                      torch.ones(2 * n)], band), "bitwise"))
        pg = dist.group.WORLD
        for call, words in cases:
            try:
                call()
                return False
            except ValueError as e:
                if words not in str(e):
                    return False
        t = torch.ones(1)
        dist.all_reduce(t)  # after anything an error left queued
        # a lazy negative view in a list: its values, not its memory's (a memmove of the
        # lists moved +1 for -1; found by a review)
        neg = torch.tensor([1 + 1j]).conj().imag  # reads -1, memory holds +1
        got = torch.zeros(1)
        dist.scatter(got, [neg] * n if rank == 0 else None, src=0)
        return (t.item() == n and torch.equal(a, torch.full((2 * n,), -1.0))
                and all(torch.equal(o[0], torch.full((2,), -1.0)) for o in outs)
                and first.tolist() == [-1, -1] and got.tolist() == [-1.0])

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
        # An integer tensor is refused before anything moves, naming the op and the dtype
        # (before, reduce_scatter_tensor blamed `out`: "must hold 2 elements of float32").
        op = dist._make_nccl_premul_sum(0.5)
        for call in (lambda: dist.all_reduce(torch.ones(6, dtype=torch.int8), op=op),
                     lambda: dist.reduce_scatter_tensor(torch.empty(2, dtype=torch.int8),
                                                        torch.ones(2 * n, dtype=torch.int8),
                                                        op=op)):
            try:
                call()
                ok = False
            except RuntimeError as e:  # as gloo's refusal (a TypeError before)
                ok &= "PREMUL_SUM" in str(e) and "floating-point tensor, got Char" in str(e)
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
        ok = (raised or rank == n - 1 or n == 1) and _close(t, torch.full((3,), tri))
        # One Work for several collectives (coalesced all-gathers): the timeout was ignored
        # (it waited out the group's, then raised "unusable after an earlier failure").
        from torch.distributed.distributed_c10d import _coalescing_manager

        if rank == n - 1:
            time.sleep(1.5)
        outs = [torch.zeros(2 * n), torch.zeros(2 * n)]
        with _coalescing_manager(async_ops=True) as cm:
            for k, o in enumerate(outs):
                dist.all_gather_into_tensor(o, torch.full((2,), float(10 * k + rank)))
        raised = False
        if rank != n - 1:
            t0 = time.monotonic()
            try:
                cm.works[0].wait(timeout=timedelta(seconds=0.3))
            except rr.CollectiveTimeout as e:
                raised = "did not complete within" in str(e) and time.monotonic() - t0 < 1.2
        cm.wait()
        want = [torch.tensor([float(10 * k + r) for r in range(n) for _ in range(2)])
                for k in range(2)]
        return ok and (raised or rank == n - 1 or n == 1) and all(
            torch.equal(o, x) for o, x in zip(outs, want))

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

    def split_group() -> bool:
        """ProcessGroup.split_group (torch's names it; before, "does not implement
        getBackendOptions"): each rank asks for its parity's group -- [0, 2] and [1] at 3
        ranks, two groups of one at 2 -- then all-reduces in it and in the world."""
        ranks = [r for r in range(n) if r % 2 == rank % 2]
        sub = dist.group.WORLD.split_group(ranks)
        # ProcessGroup.split_group does not register the group with torch's Python registry
        # (dist.split_group does, gloo's too): use the ProcessGroup's own methods.
        ok = sub is not None and sub.size() == len(ranks) and sub.rank() == ranks.index(rank)
        t = torch.full((3,), float(rank + 1))
        sub.allreduce(t).wait()
        ok &= _close(t, torch.full((3,), float(sum(r + 1 for r in ranks))))
        # A subgroup's split takes ranks *in that subgroup*: parent = world ranks 1.. (0, 1 at
        # 2 ranks); its last member alone asks for a group of its parent rank.
        members = list(range(1, n)) if n > 2 else [0, 1]
        parent = dist.new_group(members)
        if rank in members:
            last = len(members) - 1
            sub = parent.split_group([last])
            ok &= (sub is not None and sub.size() == 1 and sub.rank() == 0) \
                if rank == members[-1] else sub is None
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t)
        return ok and _close(t, torch.full((3,), tri))

    for fn in (split_group, sparse_message, wait_timeout, allreduce_ops, allreduce_async_future, allreduce_noncontig,
               allreduce_param_grad_enabled, broadcast, all_gather, all_gather_into_tensor,
               reduce_scatter, reduce_scatter_tensor, barrier, objects, reduce_gather_scatter,
               bad_op_message, bad_lists_and_expanded, coalesced_checked_first, bitwise_ops,
               premul_sum):
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
        # ringreduce's own wrapper under torch's compression wrapper, which swaps the bucket's
        # buffer for a float16 copy (set_buffer) and reduces that: the inner hook must see it
        "rr_fp16_wrapper": ({}, default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook)),
        # ... around powerSGD, which reads buffer() and gradients(): both the float16 copy's
        "rr_fp16_powersgd": ({}, default_hooks.fp16_compress_wrapper(powerSGD.powerSGD_hook)),
    }
    seen: list = []

    def probed(state: object, bucket: object) -> object:
        seen.append(str(bucket.buffer().dtype))
        return default_hooks.allreduce_hook(state, bucket)

    for name, (kw, hook) in variants.items():
        try:
            torch.manual_seed(1 + rank)  # different init per rank: DDP broadcasts rank 0's
            a = Branchy() if name == "find_unused" else MLP()
            b = copy.deepcopy(a)
            da = (rr.DistributedDataParallel(a, **kw) if name.startswith("rr_")
                  else TorchDDP(a, **kw))
            db = TorchDDP(b, process_group=gloo, **kw)
            if name == "rr_fp16_wrapper":
                da.register_comm_hook(None, default_hooks.fp16_compress_wrapper(probed))
                db.register_comm_hook(gloo, hook)
            elif name == "rr_fp16_powersgd":
                for d, pg in ((da, None), (db, gloo)):
                    d.register_comm_hook(powerSGD.PowerSGDState(
                        process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2,
                        min_compression_rate=0.5), hook)
            elif name == "powersgd":
                for d, pg in ((da, dist.group.WORLD), (db, gloo)):
                    d.register_comm_hook(powerSGD.PowerSGDState(
                        process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2,
                        min_compression_rate=0.5), hook)
            elif hook is not None:
                da.register_comm_hook(dist.group.WORLD, hook)
                db.register_comm_hook(gloo, hook)
            oa, ob = sgd(da), sgd(db)
            kw_fwd = {"use_c": rank == 0} if name == "find_unused" else {}
            for s in range(5 if "powersgd" in name else 3):
                x, y = batch(s, world)
                for d, o in ((da, oa), (db, ob)):
                    o.zero_grad()
                    F.mse_loss(d(shard(x, rank), **kw_fwd), shard(y, rank)).backward()
                    o.step()
            out[name] = {"diff": maxdiff(a, b), "dtypes": sorted(set(seen))}
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


def env_timeout(rank: int, world: int, explicit: float | None) -> dict:
    """RINGREDUCE_TIMEOUT=2 under init_process_group("ringreduce") (timeout= given or not);
    rank 1 comes 6 s late to the first all_reduce. torch passes its 30-minute default when
    nobody gives one, which was taken over the variable: the all_reduce just waited."""
    from datetime import timedelta

    import torch.distributed as dist

    kw = {} if explicit is None else {"timeout": timedelta(seconds=explicit)}
    dist.init_process_group("ringreduce", **kw)
    if rank == 1:
        time.sleep(6.0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        out = {"error": None}
    except Exception as e:  # noqa: BLE001
        out = {"error": type(e).__name__}
    out["secs"] = time.monotonic() - t0
    return out


def set_timeout(rank: int, world: int) -> dict:
    """init_process_group("ringreduce", timeout=60 s); after a checked all-reduce and a
    send/recv on a subgroup (its channel made), each backend's _set_default_timeout (torch's
    Backend.setTimeout) lowers its timeout to 2 s. Rank 1 then comes 8 s late to an
    all-reduce on the default group, and rank 0 waits for a message rank 1 never sends on the
    subgroup's existing channel: both waits end after ~2 s (before, ringreduce ignored it and
    waited 60 s)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    assert x.tolist() == [float(sum(range(1, world + 1)))] * 5, x
    sub = dist.new_group([0, 1])
    y = torch.full((3,), float(rank))
    if rank == 1:
        dist.send(y, 0, group=sub)
    elif rank == 0:
        dist.recv(y, 1, group=sub)
        assert y.tolist() == [1.0] * 3, y
    cpu = torch.device("cpu")
    for g in (dist.group.WORLD, sub):
        if rank in dist.get_process_group_ranks(g):
            g._get_backend(cpu)._set_default_timeout(timedelta(seconds=2))
    out = {}
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.recv(y, 1, group=sub)
            out["p2p"] = (None, "")
        except Exception as e:  # noqa: BLE001
            out["p2p"] = (type(e).__name__, str(e)[:300])
        out["p2p_secs"] = time.monotonic() - t0
    if rank == 1:
        time.sleep(8.0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        out["world"] = (None, "")
    except Exception as e:  # noqa: BLE001
        out["world"] = (type(e).__name__, str(e)[:300])
    out["world_secs"] = time.monotonic() - t0
    return out


def call_timeout(rank: int, world: int, mode: str) -> dict:
    """init_process_group("ringreduce", timeout=60 s); a barrier with a timeout of its own
    out of range is refused before anything moves; then the last rank comes 6 s late to
    dist.barrier(timeout=2 s) (mode "sync"; "async": async_op=True, then wait(); "allreduce":
    pg.allreduce with AllreduceOptions.timeout = 2 s): the others' waits end after ~2 s, as
    gloo's (before, ringreduce ignored the call's timeout and waited 6 s)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
    out: dict = {}
    try:
        dist.barrier(timeout=timedelta(seconds=-5))
        out["bad"] = None
    except Exception as e:  # noqa: BLE001
        out["bad"] = (type(e).__name__, str(e)[:300])
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)  # nothing moved for the refused barrier: the next call pairs up
    assert x.tolist() == [float(sum(range(1, world + 1)))] * 5, x
    if rank == world - 1:
        time.sleep(6.0)
    t0 = time.monotonic()
    two = timedelta(seconds=2)
    try:
        if mode == "sync":
            dist.barrier(timeout=two)
        elif mode == "async":
            dist.barrier(timeout=two, async_op=True).wait()
        else:
            opts = dist.AllreduceOptions()
            opts.timeout = two
            dist.group.WORLD.allreduce([torch.ones(4)], opts).wait()
        out["late"] = (None, "")
    except Exception as e:  # noqa: BLE001
        out["late"] = (type(e).__name__, str(e)[:400])
    out["secs"] = time.monotonic() - t0
    return out


def torch_cycles_on_shared_world(rank: int, world: int, cycles: int) -> list:
    """ringreduce.init() ran first (the spawn helper); torch's default group is made on its
    store and destroyed `cycles` times. Each cycle makes a subgroup -- [0, 1] in even
    cycles, all ranks in odd ones: torch's name for it is the same every time -- and splits
    the default group into even and odd ranks; checked all-reduces on both. Returns each
    cycle's sums."""
    import torch.distributed as dist

    from ringreduce import _rendezvous

    store = next(iter(_rendezvous._STORES.values()))
    out = []
    for c in range(cycles):
        dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world)
        members = [0, 1] if c % 2 == 0 else list(range(world))
        g = dist.new_group(members)
        x = torch.full((5,), float(rank + 1 + c))
        if rank in members:
            dist.all_reduce(x, group=g)
        y = torch.full((3,), float(rank + 1))
        odd = dist.group.WORLD.split_group([r for r in range(world) if r % 2 == rank % 2])
        odd.allreduce(y).wait()  # not in torch's Python registry (see split_group above)
        out.append([x.tolist(), y.tolist()])
        dist.destroy_process_group()
    rr.barrier()  # the user's world still works
    return out


def async_unwaited(rank: int, world: int) -> list:
    """Async collectives nobody waits for, as gloo runs them (found by a helper): list
    outputs are written once the collective completes -- when a later one's wait returns
    -- not only when their own Work is waited for or polled; and destroy_process_group()
    with one still running (a peer 0.3 s late) finishes it instead of cancelling it.
    Returns the checks that failed."""
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    fails: list = []

    def expect(what: str, got: list, want: list) -> None:
        if got != want:
            fails.append(f"{what}: {got} != {want}")

    outs = [[torch.zeros(2) for _ in range(world)] for _ in range(3)]
    works = [dist.all_gather(outs[i], torch.full((2,), float(10 * i + rank)), async_op=True)
             for i in range(3)]
    works[-1].wait()  # only the last
    for i in range(3):
        expect(f"all_gather #{i}", [o.tolist() for o in outs[i]],
               [[float(10 * i + r)] * 2 for r in range(world)])
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank + 1)), gathered, dst=0, async_op=True)
    a2a = [torch.zeros(1) for _ in range(world)]
    dist.all_to_all(a2a, [torch.full((1,), float(100 * rank + j)) for j in range(world)],
                    async_op=True)
    dist.all_reduce(torch.ones(1))  # the handles above were dropped
    if rank == 0:
        expect("gather", [g.tolist() for g in gathered], [[r + 1.0] * 2 for r in range(world)])
    expect("all_to_all", [a.item() for a in a2a], [100.0 * j + rank for j in range(world)])
    if rank == 1:
        time.sleep(0.3)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, async_op=True)
    dist.destroy_process_group()
    expect("all_reduce finished by destroy", t.tolist(), [sum(range(1, world + 1)) * 1.0] * 4)
    return fails


def future_callback_collective(rank: int, world: int) -> dict:
    """A Future's .then() callback that issues the group's next collective (torch's ZeRO
    interleaved DDP hook and PowerSGD do): when the completer thread has not got to it yet,
    a later collective's issue completes the Future and runs the callback on its own thread
    -- which deadlocked on the group's lock (found by a helper). The completer is held off
    (its search for a finished collective waits for a gate) until that issue has run."""
    import threading

    import torch.distributed as dist

    from ringreduce import _futures

    gate, next_done = threading.Event(), _futures._Gen.next_done
    _futures._Gen.next_done = lambda g: gate.wait() and next_done(g)  # type: ignore[method-assign]
    try:
        dist.init_process_group("ringreduce")
        a, c, d = torch.full((4,), rank + 1.0), torch.full((4,), 10.0 * (rank + 1)), torch.ones(4)

        def cb(fut: Any) -> Any:
            dist.all_reduce(d, async_op=True).wait()  # the group's next collective, from here
            return fut.value()

        fa = dist.all_reduce(a, async_op=True).get_future().then(cb)
        time.sleep(1.5)  # a is done on every rank (a 4-element all-reduce); its Future not yet
        wc = dist.all_reduce(c, async_op=True)  # issuing polls a's Completion: runs cb
        wc.wait(timeout=timedelta(seconds=20))
        by_issue = fa.done()
    finally:
        gate.set()
        _futures._Gen.next_done = next_done  # type: ignore[method-assign]
    fa.wait()
    out = {"a": a.tolist(), "c": c.tolist(), "d": d.tolist(), "by_issue": by_issue}
    dist.destroy_process_group()
    return out


def futures_in_completion_order(rank: int, world: int) -> dict:
    """Rank 0 asks for group A's Future, then group B's, and waits for B's first (then B's
    next collective, then A's); the others run B, B, then A -- a valid program (gloo runs
    it). B's Future waited behind A's, whose collective waits for B's next one: a deadlock
    until RINGREDUCE_TIMEOUT (found by a helper)."""
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    ga, gb = dist.new_group(list(range(world))), dist.new_group(list(range(world)))
    a, b, c = (torch.full((4,), k * (rank + 1.0)) for k in (1, 10, 100))
    waited = 0.0
    if rank == 0:
        wa = dist.all_reduce(a, group=ga, async_op=True)
        fa = wa.get_future()
        fb = dist.all_reduce(b, group=gb, async_op=True).get_future()
        t0 = time.monotonic()
        fb.wait()
        waited = time.monotonic() - t0
        dist.all_reduce(c, group=gb)
        wa.wait(timeout=timedelta(days=400))  # as good as none (it raised ValueError)
        fa.wait()
    else:
        for t, g in ((b, gb), (c, gb), (a, ga)):
            dist.all_reduce(t, group=g)
    out = {"a": a.tolist(), "b": b.tolist(), "c": c.tolist(), "waited": waited}
    dist.destroy_process_group()
    return out
