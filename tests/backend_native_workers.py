"""Rank functions for test_backend_native.py: synchronous dist.* calls on the "ringreduce"
backend, which the C++ adapter runs on the core directly (csrc/torch_adapter/native_api.h),
checked against numpy from every rank's (rank-dependent) input; and that path's failures.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from _spawn import victim_after_the_others

import ringreduce as rr

LENGTHS = (1, 7, 1023, 65537)
R = dist.ReduceOp
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _input(rank: int, n: int, dtype: torch.dtype, op: Any) -> np.ndarray:
    """Rank `rank`'s input, as float64 (small integers: exact in every dtype)."""
    i = np.arange(n, dtype=np.int64)
    if op == R.PRODUCT:
        v = 1 + (i + rank) % 2  # 1 or 2: 2**5 fits int8
    elif op in (R.BAND, R.BOR, R.BXOR):
        v = (i * 7 + rank * 13) % 64
    else:
        v = (i * 3 + rank * 5) % 23 + (0 if dtype in FLOATS else 1)
    if dtype == torch.bool:
        v = (i + rank) % 3 == 0
    return v.astype(np.float64)


def _expect(ins: list, op: Any, dtype: torch.dtype) -> np.ndarray:
    if dtype == torch.bool:
        s = np.stack(ins).astype(bool)
        return (s.any(0) if op in (R.SUM, R.MAX, R.BOR) else s.all(0)).astype(np.float64)
    s = np.stack(ins).astype(np.int64 if dtype not in FLOATS else np.float64)
    if op == R.SUM:
        return s.sum(0).astype(np.float64)
    if op == R.AVG:
        return s.mean(0)
    if op == R.PRODUCT:
        return s.prod(0).astype(np.float64)
    if op == R.MAX:
        return s.max(0).astype(np.float64)
    if op == R.MIN:
        return s.min(0).astype(np.float64)
    red = {R.BAND: np.bitwise_and, R.BOR: np.bitwise_or, R.BXOR: np.bitwise_xor}[op]
    return red.reduce(s, axis=0).astype(np.float64)


def _cases() -> list:
    out = []
    for dt in FLOATS:
        out += [(dt, op) for op in (R.SUM, R.AVG, R.PRODUCT, R.MAX, R.MIN)]
    for dt in INTS:
        out += [(dt, op) for op in (R.SUM, R.PRODUCT, R.MAX, R.MIN, R.BAND, R.BOR, R.BXOR)]
    out += [(torch.bool, op) for op in (R.SUM, R.PRODUCT, R.MAX, R.MIN)]
    return out


def _allreduce_checks(rank: int, members: list, group: Any) -> list:
    """Every (dtype, op, length) on `group`: a list of mismatches (empty when all right)."""
    bad = []
    me = members.index(rank)
    for dt, op in _cases():
        for n in LENGTHS:
            ins = [_input(r, n, dt, op) for r in range(len(members))]
            t = torch.from_numpy(ins[me].copy()).to(dt)
            dist.all_reduce(t, op=op, group=group)
            want = _expect(ins, op, dt)
            got = t.double().numpy()
            tol = 0.05 if dt in (torch.float16, torch.bfloat16) and op == R.AVG else 0.0
            if op == R.AVG and dt in (torch.float32, torch.float64):
                tol = 1e-6
            if not np.allclose(got, want, rtol=tol, atol=tol):
                k = int(np.argmax(np.abs(got - want)))
                bad.append(f"all_reduce {dt} {op} n={n}: [{k}] = {got[k]}, want {want[k]}")
    return bad


def _broadcast_checks(rank: int, members: list, group: Any) -> list:
    bad = []
    for root in members:
        for dt in (torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool):
            for n in LENGTHS:
                sent = (torch.arange(n) * (root + 2) % 97).to(dt)
                t = sent.clone() if rank == root else torch.zeros(n).to(dt)
                dist.broadcast(t, src=root, group=group)
                if not torch.equal(t, sent):
                    bad.append(f"broadcast {dt} n={n} from {root}")
    return bad


def _work_checks(rank: int, world: int) -> list:
    """The completed Work the synchronous path returns behaves like torch's."""
    pg = dist.group.WORLD
    t = torch.full((5,), float(rank + 1))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    w = pg.allreduce([t], opts)
    bad = []
    want = torch.full((5,), world * (world + 1) / 2)
    if not (w.is_completed() and w.is_success() and w.wait()):
        bad.append("sync Work not completed/successful")
    fut = w.get_future()
    if not (fut.done() and fut.value()[0] is t and torch.equal(t, want)):
        bad.append(f"sync Work's future: done={fut.done()} value={fut.value()}")
    if w.result()[0] is not t:
        bad.append("sync Work's result() is not the tensor")
    # async_op=True still returns pending Work completed later (not the synchronous path)
    u = torch.full((5,), float(rank + 1))
    a = dist.all_reduce(u, async_op=True)
    a.wait()
    if not torch.equal(u, want):
        bad.append(f"async all_reduce gave {u.tolist()}")
    return bad + _work_introspection(pg, u)


def _work_introspection(pg, t) -> list:
    """work._get_op_type() says the call (as gloo's Works), on the synchronous path and the
    async one; work._get_sequence_number() (torch >= 2.14) is the group's operation count
    when the call was issued (one more per call)."""
    from torch._C._distributed_c10d import OpType

    bad = []
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    calls = [("sync all_reduce", OpType.ALLREDUCE, lambda: pg.allreduce([t], opts)),
             ("all_reduce", OpType.ALLREDUCE, lambda: dist.all_reduce(t, async_op=True)),
             ("broadcast", OpType.BROADCAST, lambda: dist.broadcast(t, 0, async_op=True)),
             ("reduce", OpType.REDUCE, lambda: dist.reduce(t, 0, async_op=True)),
             ("all_gather", OpType.ALLGATHER,
              lambda: dist.all_gather([torch.empty_like(t) for _ in range(pg.size())], t,
                                      async_op=True)),
             ("barrier", OpType.BARRIER, lambda: dist.barrier(async_op=True))]
    seqs = []
    for name, want, issue in calls:
        w = issue()
        w.wait()
        if w._get_op_type() != int(want):  # an int in torch 2.13
            bad.append(f"{name}: op type {w._get_op_type()}, not {want}")
        if hasattr(w, "_get_sequence_number"):
            seqs.append(w._get_sequence_number())
    if seqs and seqs != list(range(seqs[0], seqs[0] + len(calls))):
        bad.append(f"sequence numbers {seqs}: not one more per call")
    return bad


def sync_calls(rank: int, world: int) -> dict:
    """init_process_group("ringreduce"); every dtype x op x length of dist.all_reduce and
    dist.broadcast from every root, on the world and on a subgroup with an odd rank list;
    barrier; the returned Work. Returns {"bad": [...], "sub": members}."""
    torch.set_num_threads(1)
    dist.init_process_group("ringreduce")
    bad: list = []
    members = sorted(range(world - 1, -1, -2))  # world 5: [0, 2, 4]; world 2: [1]
    try:
        everyone = list(range(world))
        c10d = dist.group.WORLD._get_backend(torch.device("cpu"))
        before = c10d.direct_calls
        bad += _allreduce_checks(rank, everyone, None)
        bad += _broadcast_checks(rank, everyone, None)
        calls = len(_cases()) * len(LENGTHS) + world * 5 * len(LENGTHS)
        if c10d.direct_calls - before != calls:  # every one of them took the direct path
            bad.append(f"{c10d.direct_calls - before} of {calls} calls took the direct path")
        bad += _work_checks(rank, world)
        dist.barrier()
        sub = dist.new_group(members)
        if rank in members:
            bad += _allreduce_checks(rank, members, sub)
            bad += _broadcast_checks(rank, members, sub)
            dist.barrier(group=sub)
        dist.barrier()
    except Exception:  # noqa: BLE001
        bad.append(traceback.format_exc())
    dist.destroy_process_group()
    return {"bad": bad, "sub": members}


def peer_dies(rank: int, world: int, victim: int) -> dict:
    """`victim` exits before its fourth all_reduce; every other rank's synchronous
    dist.all_reduce must raise PeerFailure naming it (and the next call too)."""
    torch.set_num_threads(1)
    dist.init_process_group("ringreduce")
    t = torch.ones(1000)
    for _ in range(3):
        dist.all_reduce(t)
    # The victim dies only once the others are out of the third all_reduce too: a tree
    # leaf that saw its sibling's EOF before its parent's result failed it (CI, TCP).
    if victim_after_the_others(rank, victim, range(world), "third"):
        import os

        os._exit(3)
    t0 = time.monotonic()
    out: dict = {}
    try:
        dist.all_reduce(t)
        out["first"] = None
    except Exception as e:  # noqa: BLE001
        out["first"] = {"type": type(e).__name__, "msg": str(e), "is_peer":
                        isinstance(e, rr.PeerFailure),
                        "peer_rank": getattr(e, "peer_rank", None),
                        "cause": getattr(e, "cause", None),
                        "relayed_by": getattr(e, "relayed_by", None)}
    out["t_err"] = time.monotonic() - t0
    try:
        dist.all_reduce(t)
        out["second"] = None
    except Exception as e:  # noqa: BLE001
        out["second"] = {"type": type(e).__name__, "msg": str(e)}
    t1 = time.monotonic()
    dist.destroy_process_group()
    out["t_destroy"] = time.monotonic() - t1
    return out


def after_destroy(rank: int, world: int) -> dict:
    """ringreduce.init() first, the torch group on top of it; after rr.destroy() the
    synchronous path says the communicator is gone (never touches freed memory)."""
    from ringreduce import _rendezvous

    torch.set_num_threads(1)
    rr.init()
    store = next(iter(_rendezvous._STORES.values()))
    dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world)
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    ok_before = t.tolist() == [world * (world + 1) / 2] * 3
    rr.destroy()
    out = {"ok_before": ok_before}
    try:
        dist.all_reduce(t)
        out["after"] = None
    except Exception as e:  # noqa: BLE001
        out["after"] = {"type": type(e).__name__, "msg": str(e)}
    dist.destroy_process_group()
    return out


def late_rank(rank: int, world: int, late: int, sleep_s: float) -> dict:
    """Rank `late` sleeps before its sixth dist.all_reduce; the others' stall reports must
    name its last call site (recorded by the synchronous path, which skips Python)."""
    torch.set_num_threads(1)
    dist.init_process_group("ringreduce")
    wrong = 0
    for it in range(1, 9):
        if rank == late and it == 6:
            time.sleep(sleep_s)
        t = torch.full((100,), float(rank + it))
        dist.all_reduce(t)  # the call site the stall report must name
        if not torch.equal(t, torch.full((100,), float(sum(r + it for r in range(world))))):
            wrong += 1
    dist.destroy_process_group()
    return {"wrong": wrong}


def async_mismatch(rank: int, world: int) -> dict:
    """An async dist.all_reduce whose ranks disagree on the size: wait() raises
    CollectiveMismatch, and -- as gloo's -- is_success() is False, exception() returns the
    error (it returned None) and the future's wait() raises it. A successful one's
    exception() is None."""
    torch.set_num_threads(1)
    dist.init_process_group("ringreduce")
    out: dict = {}
    ok = dist.all_reduce(torch.ones(3), async_op=True)
    ok.wait()
    out["ok_exc"] = repr(ok.exception())
    w = dist.all_reduce(torch.ones(4 + rank), async_op=True)
    try:
        w.wait()
        out["wait"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["wait"] = f"{type(e).__name__}: {e}"
    out["success"] = w.is_success()
    e = w.exception()
    out["exc"] = f"{type(e).__name__}: {e}" if e is not None else None
    try:
        w.get_future().wait()
        out["future"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["future"] = f"{type(e).__name__}: {e}"
    dist.destroy_process_group()
    return out


def async_polling(rank: int, world: int) -> dict:
    """torch's non-blocking Work checks on the ringreduce backend, as on gloo: is_completed()
    polled without wait() is True only once all_gather's outputs and a non-contiguous
    all_reduce's result are in place; a failure nobody waited for shows in is_success() /
    exception(); a Future taken before wait() is done once wait() returns (all three broke
    before: found by a helper)."""
    torch.set_num_threads(1)
    dist.init_process_group("ringreduce")
    bad = []

    def spin(w: Any) -> None:
        deadline = time.monotonic() + 30
        while not w.is_completed() and time.monotonic() < deadline:
            pass

    for i in range(30):
        outs = [torch.full((3,), -1.0) for _ in range(world)]
        w = dist.all_gather(outs, torch.full((3,), float(rank * 100 + i)), async_op=True)
        spin(w)
        if any(outs[r][0].item() != r * 100 + i for r in range(world)):
            bad.append(f"all_gather {i}: outputs not in place when is_completed() was True")
            break
        w.wait()
    for i in range(30):
        t = torch.arange(6.0).reshape(2, 3).t() * (rank + 1) + i
        w = dist.all_reduce(t, async_op=True)
        spin(w)
        if not torch.equal(t, torch.arange(6.0).reshape(2, 3).t() * (world * (world + 1) / 2)
                           + i * world):
            bad.append(f"all_reduce {i}: result not in place when is_completed() was True")
            break
        w.wait()
    for i in range(50):
        w = dist.all_reduce(torch.full((2,), float(rank)), async_op=True)
        f = w.get_future()
        w.wait()
        if not f.done():
            bad.append(f"future {i}: not done after work.wait()")
            break
    w = dist.all_reduce(torch.ones(4 + rank), async_op=True)  # sizes differ: fails
    spin(w)
    out = {"bad": bad, "polled": [w.is_completed(), w.is_success(), type(w.exception()).__name__]}
    dist.destroy_process_group()
    return out


def store_host_dies_in_p2p_setup(rank: int, world: int) -> dict:
    """init_process_group("ringreduce") by env:// (torch's rank 0 serves the TCPStore);
    rank 1 waits for the first message from rank 0 on a fresh tag, and rank 0 is killed.
    The store failing under that wait is rank 0's death: a PeerFailure naming it, as the
    same wait on ringreduce's own store says (it was a RingReduceError: found by a
    helper)."""
    import os
    import signal

    dist.init_process_group("ringreduce")
    dist.barrier()
    if rank == 0:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank != 1:
        time.sleep(8.0)  # stays until rank 1 is done (its death is not the point here)
        return {}
    t0 = time.monotonic()
    try:
        dist.recv(torch.zeros(3), 0, tag=5)
        return {"error": None}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "is_peer": isinstance(e, rr.PeerFailure),
                "peer_rank": getattr(e, "peer_rank", None), "cause": getattr(e, "cause", None),
                "secs": time.monotonic() - t0}
