"""Rank functions for test_fastcall.py: rr.barrier() and rr.allreduce(ndarray), which run
without a Python frame (_C.FastCall), against numpy; every other call must reach the Python
functions unchanged."""

from __future__ import annotations

import inspect
import time
import traceback

import numpy as np
import torch
from _spawn import await_flags, raise_flag

import ringreduce as rr
from ringreduce import api

DTYPES = (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64)


def _err(fn) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


def semantics(rank: int, world: int) -> list:
    """A list of what went wrong (empty: all right)."""
    bad: list = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            bad.append(what)

    try:
        check(rr.barrier.__wrapped__ is api.barrier and rr.allreduce.__wrapped__ is api.allreduce,
              "__wrapped__")
        check(inspect.signature(rr.allreduce) == inspect.signature(api.allreduce), "signature")
        check(rr.barrier.__doc__ == api.barrier.__doc__ and rr.barrier.__name__ == "barrier",
              "doc/name")
        # the barrier waits: the last rank arrives 0.3 s late, with a flag raised just before
        # (a time bound failed where a rank left the first barrier late: load, not the code)
        rr.barrier()
        if rank == world - 1:
            time.sleep(0.3)
            raise_flag("last_in")
        rr.barrier()
        check(rank == world - 1 or await_flags(["last_in"], 0),
              "barrier returned before the last rank came")
        for dt in DTYPES:
            for n in (1, 7, 4097):
                ins = [((np.arange(n) * 3 + r * 5) % 11).astype(dt) for r in range(world)]
                x = ins[rank].copy()
                out = rr.allreduce(x)
                want = np.sum(np.stack(ins).astype(np.float64), axis=0)
                check(out is None and np.array_equal(x.astype(np.float64), want),
                      f"allreduce {np.dtype(dt).name} n={n}")
        fast0 = rr.allreduce.fast_calls, rr.barrier.fast_calls
        # not for the fast path: each must behave exactly as the Python function
        base = np.arange(8, dtype=np.float32) + rank
        x = base.copy()
        rr.allreduce(x, op="max")
        check(np.array_equal(x, np.arange(8, dtype=np.float32) + world - 1), "op=max")
        x = base.copy()
        rr.allreduce(x, "max")
        check(np.array_equal(x, np.arange(8, dtype=np.float32) + world - 1), "positional op")
        w = rr.allreduce(x := base.copy(), async_op=True)
        w.wait()
        check(np.array_equal(x, np.arange(8, dtype=np.float32) * world + sum(range(world))),
              "async_op=True")
        t = torch.full((5,), float(rank + 1))
        rr.allreduce(t)
        check(torch.equal(t, torch.full((5,), world * (world + 1) / 2)), "torch tensor")
        ro = base.copy()
        ro.flags.writeable = False
        strided = np.zeros(8, np.float32)[::2]
        for what, arr in (("read-only", ro), ("non-contiguous", strided),
                          ("empty", np.zeros(0, np.float32)), ("bool", np.ones(3, bool)),
                          ("big-endian", np.ones(3, ">f4"))):
            fast, slow = _err(lambda a=arr: rr.allreduce(a)), _err(
                lambda a=arr: api.allreduce(a))
            check(fast == slow, f"{what}: {fast!r} vs the Python function's {slow!r}")
        check(_err(lambda: rr.allreduce([1.0, 2.0])) == _err(lambda: api.allreduce([1.0, 2.0])),
              "a list")
        w = rr.barrier(async_op=True)
        check(w.wait() is True, "barrier(async_op=True)")
        sub = rr.new_group(list(range(world)))
        rr.barrier(group=sub)
        y = np.full(3, rank + 1.0)
        rr.allreduce(y, group=sub)
        check(np.array_equal(y, np.full(3, world * (world + 1) / 2)), "group=")
        sub.destroy()
        rr.barrier()
        check(rr.allreduce.fast_calls == fast0[0]
              and rr.barrier.fast_calls == fast0[1] + (world > 1),
              f"fast path taken by other calls: {fast0} -> {rr.allreduce.fast_calls}, "
              f"{rr.barrier.fast_calls}")
        if world > 1:  # a world of one has no communicator: everything is the Python path
            check(fast0[0] == len(DTYPES) * 3 and fast0[1] == 2,
                  f"fast calls before: {fast0}, want {len(DTYPES) * 3} and 2")
    except Exception:  # noqa: BLE001
        bad.append(traceback.format_exc())
    return bad


def after_destroy(rank: int, world: int) -> dict:
    rr.init()
    rr.barrier()
    rr.destroy()
    return {"barrier": _err(rr.barrier), "allreduce": _err(lambda: rr.allreduce(np.ones(2))),
            "python": _err(api.barrier)}


def late_rank(rank: int, world: int, late: int, sleep_s: float) -> dict:
    """The late rank sleeps before its sixth rr.barrier(); the others' stall reports must
    name the line of that call (recorded without a Python frame of ours)."""
    x = np.ones(4, np.float32)
    for it in range(1, 9):
        if rank == late and it == 6:
            time.sleep(sleep_s)
        rr.barrier()  # the call site the stall report must name
    rr.allreduce(x)
    return {"sum": float(x[0])}


def p2p_semantics(rank: int, world: int) -> list:
    """rr.send / rr.recv(ndarray, peer): a ring exchange per dtype and length (the first
    message of a pair makes its channel in Python, later ones take the fast path), checked;
    tags, torch tensors, bad peers behave as the Python functions."""
    from ringreduce import p2p

    bad: list = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            bad.append(what)

    try:
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        for rnd in range(3):
            for dt in DTYPES:
                for n in (1, 7, 70000):
                    out = ((np.arange(n) + 3 * rank + rnd) % 101).astype(dt)
                    got = np.zeros(n, dt)
                    if rank % 2 == 0:  # even ranks send first: no cycle of blocked sends
                        rr.send(out, nxt)
                        rr.recv(got, prv)
                    else:
                        rr.recv(got, prv)
                        rr.send(out, nxt)
                    want = ((np.arange(n) + 3 * prv + rnd) % 101).astype(dt)
                    check(np.array_equal(got, want), f"round {rnd} {np.dtype(dt).name} n={n}")
        check(rr.send.fast_calls > 0 and rr.recv.fast_calls > 0,
              f"fast path never taken: {rr.send.fast_calls}, {rr.recv.fast_calls}")
        before = rr.send.fast_calls, rr.recv.fast_calls
        t = torch.full((4,), float(rank))
        u = torch.zeros(4)
        x, y = np.full(3, rank, np.int64), np.zeros(3, np.int64)
        if rank % 2 == 0:
            rr.send(t, nxt)
            rr.recv(u, prv)
            rr.send(x, nxt, tag=5)
            rr.recv(y, prv, tag=5)
        else:
            rr.recv(u, prv)
            rr.send(t, nxt)
            rr.recv(y, prv, tag=5)
            rr.send(x, nxt, tag=5)
        check(torch.equal(u, torch.full((4,), float(prv))), "torch tensors")
        check(y.tolist() == [prv] * 3, "tag=5")
        check((rr.send.fast_calls, rr.recv.fast_calls) == before, "fast path taken for those")
        for peer in (rank, world, -1):
            a = _err(lambda p=peer: rr.send(np.ones(2, np.float32), p))
            b = _err(lambda p=peer: p2p.send(np.ones(2, np.float32), p))
            check(a == b and a is not None, f"send to {peer!r}: {a!r} vs {b!r}")
        ro = np.ones(3, np.float32)
        ro.flags.writeable = False
        a, b = _err(lambda: rr.recv(ro, nxt)), _err(lambda: p2p.recv(ro, nxt))
        check(a == b and a is not None, f"recv into read-only: {a!r} vs {b!r}")
        rr.barrier()
    except Exception:  # noqa: BLE001
        bad.append(traceback.format_exc())
    return bad


def slot_rewritten_meanwhile(rank: int, world: int, calls: int, seconds: float) -> dict:
    """A thread rewrites the fast calls' slots (as destroy(), init() and a re-made channel
    do) while this one runs fast all-reduces and barriers (`calls`, or for `seconds`):
    each rewrite drops the capsule a call in flight uses, which freed the handle under it
    once the GIL was released (found by a helper under AddressSanitizer; the call now holds
    the capsule). The GIL changes hands every 0.1 ms (5 ms by default: the rewriting thread
    kept it for most of each, and 30000 calls outran CI's 150 s)."""
    import sys
    import threading

    from ringreduce import _state

    x = np.ones(8, np.float32)
    world_group = _state._DEFAULT[0]
    stop = threading.Event()

    def rewrite() -> None:
        while not stop.is_set():
            _state.set_default(world_group)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    t = threading.Thread(target=rewrite, daemon=True)
    t.start()
    wrong, done, end = 0, 0, time.monotonic() + seconds
    flag = np.zeros(1, np.int64)
    try:
        while True:
            x[:] = 1
            rr.allreduce(x)
            wrong += int(x[0] != world)
            done += 1
            if done % 64 == 0:  # every rank stops at the same call: one says when
                flag[0] = int(done >= calls or time.monotonic() > end)
                rr.allreduce(flag)
                if flag[0]:
                    break
                rr.barrier()
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(interval)
    return {"wrong": wrong, "calls": done, "fast": rr.allreduce.fast_calls,
            "module": rr._C.__file__}


def slot_rewritten_by_a_collection(rank: int, world: int, calls: int) -> dict:
    """Every garbage collection (one at each allocation) rewrites the world's slot, as
    destroy(), init() or a re-made channel may from another thread whenever this one runs
    Python code: a fast call that allocates between reading the capsule and using it saw
    it freed ("PyCapsule_GetPointer called with invalid PyCapsule object" under Python's
    debug allocator, a crash under its own; found by CI, one call in ~300000 with a
    rewriting thread). Runs fast all-reduces and barriers; returns how many were wrong."""
    import gc

    from ringreduce import _state

    world_group = _state._DEFAULT[0]
    rewrites = [0]

    def rewrite(phase: str, _info: dict) -> None:
        if phase == "start":
            _state.set_default(world_group)
            rewrites[0] += 1

    x = np.ones(8, np.float32)
    wrong, thresholds = 0, gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(rewrite)
    try:
        for i in range(calls):
            x[:] = rank + i
            rr.allreduce(x)
            wrong += int(x[0] != world * (world - 1) / 2 + world * i)
            rr.barrier()
    finally:
        gc.callbacks.remove(rewrite)
        gc.set_threshold(*thresholds)
    return {"wrong": wrong, "fast": rr.allreduce.fast_calls, "rewrites": rewrites[0]}
