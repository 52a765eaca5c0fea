"""Functions that run inside ranks (started by _spawn.run_world) for tests/test_errors.py:
bad inputs, a peer killed mid-collective, ranks that disagree, timeouts, wrong secrets and
strangers on the listening port, destroy() with work pending, dropped async handles, and
the spawn helper's own failure reporting.

They catch the errors they provoke and return what they saw (type, message, timing) so the
parent can assert on every rank's story. Inputs and reference answers come from the shared
helpers in tests/workers.py.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
from typing import Any, Callable

import numpy as np
import torch
from _spawn import await_flags, raise_flag
from workers import Buf, compare_exact, pattern, reduce_np, values

import ringreduce as rr


def _exc_info(e: BaseException, t0: float) -> dict:
    return {"type": type(e).__name__, "msg": str(e), "elapsed": time.time() - t0,
            "is_rr": isinstance(e, rr.RingReduceError), "is_timeout": isinstance(e, TimeoutError),
            "peer_rank": getattr(e, "peer_rank", None),
            "waiting_for": getattr(e, "waiting_for", None),
            "relayed_by": getattr(e, "relayed_by", None)}


def _expect_raise(fn: Callable[[], Any], exc: type, pattern: str, what: str) -> list[str]:
    try:
        fn()
    except exc as e:
        if not re.search(pattern, str(e), re.IGNORECASE):
            return [f"{what}: {type(e).__name__} message {str(e)!r} does not match {pattern!r}"]
        return []
    except Exception as e:  # noqa: BLE001
        return [f"{what}: raised {type(e).__name__}: {e}, expected {exc.__name__}"]
    return [f"{what}: did not raise (expected {exc.__name__} matching {pattern!r})"]


def bad_inputs(rank: int, world: int) -> list[str]:
    """Only the last rank makes the bad calls: if any of them consumed a sequence number or
    moved a byte, the correct collectives afterwards would mismatch or hang."""
    errs: list[str] = []
    if rank == world - 1:
        ro = np.arange(6, dtype=np.float32)
        ro.flags.writeable = False
        leaf = torch.ones(3, requires_grad=True)
        sparse = torch.eye(3).to_sparse()
        x = np.arange(8, dtype=np.float32)
        x_before = x.copy()
        n = 4
        csr = torch.eye(world).to_sparse_csr()  # its __cuda_array_interface__ raises RuntimeError
        cases: list[tuple[str, Callable[[], Any], type, str]] = [
            # first: before this process's first dense torch tensor reached ringreduce
            ("sparse CSR tensor", lambda: rr.allreduce(csr), ValueError, "sparse.*to_dense"),
            ("sparse CSR gather", lambda: rr.gather(csr, dst=0), ValueError, "sparse.*to_dense"),
            ("sparse CSR reduce", lambda: rr.reduce(csr, dst=0), ValueError, "sparse.*to_dense"),
            ("sparse CSR all_to_all", lambda: rr.all_to_all(csr), ValueError, "sparse.*to_dense"),
            ("sparse CSR scatter",
             lambda: rr.scatter(csr, src=0, x=torch.zeros(world, world, world)), ValueError,
             "sparse.*to_dense"),
            ("non-contiguous tensor", lambda: rr.allreduce(torch.ones(4, 4).t()), ValueError,
             r"not contiguous.*contiguous\(\)"),
            ("strided tensor", lambda: rr.broadcast(torch.ones(10)[::2]), ValueError,
             "not contiguous"),
            ("non-contiguous array", lambda: rr.allreduce(np.ones((4, 4)).T), ValueError,
             "not C-contiguous.*ascontiguousarray"),
            ("float8 tensor", lambda: rr.allreduce(torch.ones(3).to(torch.float8_e4m3fn)),
             ValueError, r"float8_e4m3fn is not supported.*float32.*complex64"),
            ("float128 array", lambda: rr.allreduce(np.ones(3, np.longdouble)), ValueError,
             "float128 is not supported"),
            ("complex max", lambda: rr.allreduce(torch.ones(3, dtype=torch.complex64), op="max"),
             ValueError, "max is not defined on complex numbers.*sum or avg"),
            ("bool avg", lambda: rr.allreduce(torch.ones(3, dtype=torch.bool), op="avg"),
             ValueError, "avg of bool is not defined.*op=sum"),
            ("bool avg reduce_scatter",
             lambda: rr.reduce_scatter(np.ones(world * 3, np.bool_), op="avg"), ValueError,
             "avg of bool is not defined"),
            ("float band", lambda: rr.allreduce(np.ones(3, np.float32), op="band"), ValueError,
             "bitwise: it needs an integer or bool dtype, got float32"),
            ("bfloat16 bxor coalesced", lambda: rr.allreduce_coalesced(
                [torch.ones(3, dtype=torch.bfloat16)], op="bxor"), ValueError, "bitwise"),
            ("float64 bor async", lambda: rr.allreduce(np.ones(3), op="bor", async_op=True),
             ValueError, "bitwise"),
            # Lazy conj / neg views: before, their raw memory moved (a broadcast sent 1+2j
            # for conj(1+2j); max over negated views picked the wrong element).
            ("conjugate view", lambda: rr.broadcast(torch.tensor([1 + 2j]).conj(), src=0),
             ValueError, r"lazy conjugate view.*resolve_conj\(\)"),
            ("negative view", lambda: rr.allreduce(torch.tensor([1 + 2j]).conj().imag,
                                                   op="max"),
             ValueError, r"lazy negative view.*resolve_neg\(\)"),
            ("conjugate view allgather", lambda: rr.allgather(torch.ones(2, dtype=torch.complex64)
                                                              .conj()),
             ValueError, "lazy conjugate view"),
            ("fractional all_to_all counts", lambda: rr.all_to_all(
                np.ones(world * 2, np.float32), send_counts=[2.7] + [2] * (world - 1)),
             TypeError, "send_counts must be a sequence of .* ints"),
            ("read-only array", lambda: rr.allreduce(ro), ValueError, "read-only"),
            ("meta-device tensor", lambda: rr.allreduce(torch.empty(3, device="meta")),
             ValueError, r"meta.*\.cpu\(\)"),
            ("sparse tensor", lambda: rr.allreduce(sparse), ValueError, "sparse.*to_dense"),
            ("leaf requiring grad", lambda: rr.allreduce(leaf), ValueError,
             "requires grad.*detach"),
            ("list", lambda: rr.allreduce([1.0, 2.0]), TypeError,
             "expected a torch.Tensor or numpy.ndarray, got list"),
            ("python float", lambda: rr.broadcast(1.0), TypeError, "got float"),
            ("bad op", lambda: rr.allreduce(x, op="mean"), ValueError,
             "unsupported reduce op 'mean'.*sum, avg, prod, min, max, band, bor, bxor"),
            ("op None", lambda: rr.allreduce(x, op=None), ValueError, "unsupported reduce op"),
            ("bad algo", lambda: rr.allreduce(x, algo="star"), ValueError,
             "unknown algo 'star'.*auto, ring, tree"),
            # a zero-size send sends nothing: it waited for the timeout, then blamed the sender
            ("zero-size any-source recv", lambda: rr.recv(np.zeros(0, np.float32)), ValueError,
             r"recv\(src=None\): x has no elements.*name src"),
            ("zero-size any-source irecv", lambda: rr.irecv(torch.zeros(0), tag=3), ValueError,
             r"irecv\(src=None\): x has no elements"),
            ("bad algo coalesced", lambda: rr.allreduce_coalesced([x], algo="x"), ValueError,
             "unknown algo"),
            # a single buffer: numpy's / torch's "truth value is ambiguous" before
            ("coalesced of one array", lambda: rr.allreduce_coalesced(x), TypeError,
             r"takes a list of tensors/arrays, got ndarray: pass \[x\]"),
            ("coalesced of one tensor", lambda: rr.allreduce_coalesced(torch.ones(3)), TypeError,
             "got Tensor"),
            # strided nested tensors report torch.strided (the fast path summed their flat
            # storage); jagged ones and mkldnn were "sparse tensors"
            ("nested tensor", lambda: rr.allreduce(torch.nested.nested_tensor(
                [torch.ones(2), torch.ones(3)])), ValueError, r"nested tensors.*unbind\(\)"),
            ("nested tensor broadcast", lambda: rr.broadcast(torch.nested.nested_tensor(
                [torch.ones(2), torch.ones(3)]), src=0), ValueError, "nested tensors"),
            ("mkldnn tensor", lambda: rr.allreduce(torch.ones(3).to_mkldnn()), ValueError,
             r"layout _mkldnn are not supported.*to_dense\(\)"),
            ("big-endian array", lambda: rr.allreduce(np.ones(3, ">f4")), ValueError,
             r"big-endian: pass x.astype\(x.dtype.newbyteorder\('='\)\)"),
            ("op with a prefix of its own", lambda: rr.allreduce(x, op="torch.max"), ValueError,
             "unsupported reduce op 'torch.max'"),
            ("bad op reduce_scatter", lambda: rr.reduce_scatter(np.ones(world * 2), op="mean"),
             ValueError, "unsupported reduce op"),
            ("broadcast src=world", lambda: rr.broadcast(x, src=world), ValueError,
             rf"src={world}.*world size {world}"),
            ("broadcast src=-1", lambda: rr.broadcast(x, src=-1), ValueError, "src=-1"),
            ("allgather out too big",
             lambda: rr.allgather(np.ones(n, np.float32), out=np.empty(world * n + 1, np.float32)),
             ValueError, rf"out must hold.*{world * n}.*got {world * n + 1}"),
            ("allgather out too small",
             lambda: rr.allgather(torch.ones(n), out=torch.empty(world * n - 1)),
             ValueError, "out must hold"),
            ("allgather out dtype",
             lambda: rr.allgather(np.ones(n, np.float32), out=np.empty(world * n, np.float64)),
             ValueError, "out must hold.*float32.*float64"),
            ("allgather out non-contiguous",
             lambda: rr.allgather(torch.ones(2), out=torch.empty(world * 2, 2)[:, 0]), ValueError,
             r"allgather\(out\).*not contiguous"),
            ("allgather out read-only",
             lambda: rr.allgather(np.ones(1, np.float32),
                                  out=np.broadcast_to(np.float32(0), (world,))), ValueError,
             "allgather\\(out\\)"),
            ("reduce_scatter out size",
             lambda: rr.reduce_scatter(np.ones(world * 3), out=np.empty(4)), ValueError,
             "out must hold 3 elements"),
            ("reduce_scatter out dtype",
             lambda: rr.reduce_scatter(torch.ones(world * 3), out=torch.empty(3, dtype=torch.int32)),
             ValueError, "out must hold 3 elements of float32"),
            ("coalesced mixed dtypes",
             lambda: rr.allreduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.float64)]),
             ValueError, "one dtype.*group them by dtype"),
            ("coalesced bad member",
             lambda: rr.allreduce_coalesced([torch.ones(2), torch.ones(3, 3).t()]), ValueError,
             r"xs\[1\].*not contiguous"),
        ]
        if world > 1:  # a broadcast writes into its receivers' x (its source only reads it)
            cases.append(("read-only broadcast receiver", lambda: rr.broadcast(ro, src=0),
                          ValueError, "read-only"))
            cases.append(("reduce_scatter count not a multiple",
                          lambda: rr.reduce_scatter(np.ones(world * 3 + 1)), ValueError,
                          (rf"{world * 3 + 1} elements, not a multiple of world_size {world}.*pad "
                          rf"it to {world * 4}")))
            # One host: no hierarchy. Refused at the call also when async (was: at wait()).
            for what, fn in (("algo=hier", lambda: rr.allreduce(x, algo="hier")),
                             ("async algo=hier", lambda: rr.allreduce(x, algo="hier", async_op=True)),
                             ("async coalesced algo=hier",
                              lambda: rr.allreduce_coalesced([x], algo="hier", async_op=True))):
                cases.append((what, fn, ValueError, "algo=hier needs several hosts"))
        for what, fn, exc, pat in cases:
            errs += _expect_raise(fn, exc, pat, what)
        if not np.array_equal(x, x_before):
            errs.append("a rejected call modified its input")
    # The communicator is still usable, and in step on every rank.
    for t, dt in enumerate(("float32", "int64")):
        ins = [pattern(dt, "sum", r, 1001, t) for r in range(world)]
        b = Buf(dt, "torch", 1001, vals=ins[rank])
        rr.allreduce(b.view)
        errs += compare_exact(values(b.view), reduce_np(dt, "sum", ins, world),
                              f"allreduce after rejected calls ({dt})")
    # A read-only input is fine where the collective only reads it.
    ro_in = np.full(3, rank, dtype=np.int32)
    ro_in.flags.writeable = False
    got = rr.allgather(ro_in)
    errs += compare_exact(got, np.repeat(np.arange(world, dtype=np.int32), 3).reshape(world, 3),
                          "allgather of a read-only array")
    # torch.distributed.ReduceOp values are accepted too.
    import torch.distributed as dist

    for op, name in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"),
                     (dist.ReduceOp.PRODUCT, "prod"), (dist.ReduceOp.MIN, "min"),
                     (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.BAND, "band"),
                     (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor")):
        dt = "float64" if name == "avg" else "int32"  # integer avg is refused
        ins = [pattern(dt, name, r, 17, 1) for r in range(world)]
        v = ins[rank].copy()
        rr.allreduce(v, op=op)
        errs += compare_exact(v, reduce_np(dt, name, ins, world), f"op={op}")
        # a ReduceOp(...) instance wraps its member (gloo takes both); refused before
        v = ins[rank].copy()
        rr.allreduce(v, op=dist.ReduceOp(op))
        errs += compare_exact(v, reduce_np(dt, name, ins, world), f"op=ReduceOp({op})")
    # allreduce_coalesced of a generator: the first look used it up and nothing was reduced
    ins = [[pattern("float32", "sum", r, k, 2) for k in (5, 9)] for r in range(world)]
    parts = [torch.from_numpy(a.copy()) for a in ins[rank]]
    rr.allreduce_coalesced(p for p in parts)
    for k, part in enumerate(parts):
        errs += compare_exact(part.numpy(), reduce_np("float32", "sum", [i[k] for i in ins],
                                                      world), f"coalesced generator part {k}")
    # A tensor autograd saved, written in place by a collective: backward is refused, as
    # after torch's own in-place ops (it silently used the new values: wrong gradients)
    x = torch.arange(4.0, requires_grad=True)
    y = x * (rank + 1)
    z = (y * y).sum()  # saves y
    rr.allreduce(y)
    w = torch.arange(4.0, requires_grad=True)
    u = (w * w).sum()  # saves w
    with torch.no_grad():
        rr.allreduce(w)
    for what, loss in (("non-leaf y", z), ("leaf w under no_grad", u)):
        try:
            loss.backward()
            errs.append(f"{what}: backward through its old value ran")
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                errs.append(f"{what}: {e}")
    if y.tolist() != [float(i * world * (world + 1) // 2) for i in range(4)]:
        errs.append(f"the all-reduce itself: {y.tolist()}")
    return errs


def peer_kill(rank: int, world: int, algo: str, stamp_file: str) -> dict:
    """Rank 1 SIGKILLs itself while an all-reduce is on the wire; the others loop over
    all-reduces and report what they raised, when, and what a later call says."""
    import signal

    n = (1 << 20) if algo == "ring" else (1 << 16)
    x = np.ones(n, dtype=np.float32)
    t_end = time.time() + 30
    it = 0
    while time.time() < t_end:
        it += 1
        x.fill(1.0)
        if rank == 1 and it == 4:
            w = rr.allreduce(x, algo=algo, async_op=True)
            time.sleep(0.002)
            with open(stamp_file, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
            w.wait()  # not reached
        t0 = time.time()
        try:
            rr.allreduce(x, algo=algo)
        except Exception as e:  # noqa: BLE001
            info = _exc_info(e, t0)
            info["t_err"] = time.time()
            info["iterations"] = it
            try:
                rr.allreduce(x, algo=algo)
                info["after"] = None
            except Exception as e2:  # noqa: BLE001
                info["after"] = f"{type(e2).__name__}: {e2}"
            t = time.time()
            rr.destroy()
            info["destroy_s"] = time.time() - t
            return info
        if x[0] != world:
            return {"type": None, "msg": f"wrong sum {x[0]} at iteration {it}"}
    return {"type": None, "msg": f"no error after {it} iterations"}


MISMATCHES: dict[str, tuple[str, Callable[[int, bool], Any]]] = {
    # name: (phrase the error must contain, call(rank, odd_one_out))
    "count": ("count mismatch", lambda r, odd: rr.allreduce(np.ones(101 if odd else 100))),
    "dtype": ("dtype mismatch",
              lambda r, odd: rr.allreduce(np.ones(64, np.int32 if odd else np.float32))),
    "dtype-width": ("dtype mismatch",
                    lambda r, odd: rr.allreduce(np.ones(64, np.int64 if odd else np.float64))),
    "op": ("op mismatch", lambda r, odd: rr.allreduce(np.ones(64), op="max" if odd else "sum")),
    "algo": ("algorithm mismatch",
             lambda r, odd: rr.allreduce(np.ones(1000), algo="tree" if odd else "ring")),
    "kind": ("collective mismatch",
             lambda r, odd: rr.broadcast(np.ones(64)) if odd else rr.allreduce(np.ones(64))),
    "barrier-vs-allreduce": ("collective mismatch",
                             lambda r, odd: rr.barrier() if odd else rr.allreduce(np.ones(8))),
    "broadcast-count": ("count mismatch",
                        lambda r, odd: rr.broadcast(np.ones(33 if odd else 32), src=0)),
    "allgather-count": ("count mismatch",
                        lambda r, odd: rr.allgather(np.ones(5 if odd else 4))),
    "reduce_scatter-count": ("count mismatch", lambda r, odd: rr.reduce_scatter(
        np.ones(rr.get_world_size() * (3 if odd else 2)))),
    "reduce_scatter-op": ("op mismatch", lambda r, odd: rr.reduce_scatter(
        np.ones(rr.get_world_size() * 4), op="min" if odd else "max")),
    # Integer avg runs as an int64 sum inside the core: its frames must still describe the
    # call each rank made (before, every one of these returned silently).
    "intavg-vs-int64-sum": ("dtype mismatch", lambda r, odd: rr.allreduce(
        np.full(7, 100, np.int64 if odd else np.int32), op="sum" if odd else "avg")),
    "intavg-int8-vs-uint8": ("dtype mismatch", lambda r, odd: rr.allreduce(
        np.full(4, 255, np.uint8) if odd else np.full(4, -1, np.int8), op="avg")),
    "intavg-vs-sum-of-twice-as-many": ("count mismatch", lambda r, odd: rr.allreduce(
        np.full(14 if odd else 7, 100, np.int64), op="sum" if odd else "avg")),
    "reduce_scatter-intavg": ("dtype mismatch", lambda r, odd: rr.reduce_scatter(
        np.full(rr.get_world_size() * 7, 100, np.int64 if odd else np.int32),
        op="sum" if odd else "avg")),
    "broadcast-root": ("root mismatch",
                       lambda r, odd: rr.broadcast(np.full(64, float(r)), src=1 if odd else 0)),
    # The odd rank believes it is the root: over TCP both roots wait for partials (or
    # pieces) no one sends; the heartbeats' roots are what name it.
    "reduce-root": ("root mismatch", lambda r, odd: rr.reduce(
        np.full(64, float(r)), dst=r if odd else 0)),
    "gather-root": ("root mismatch", lambda r, odd: rr.gather(
        np.full(64, float(r)), dst=r if odd else 0)),
    # TCP: each root sends and keeps its own block; nobody waits (the next call names it).
    "scatter-root": ("root mismatch", lambda r, odd: rr.scatter(
        np.zeros(64), src=r if odd else 0,
        x=np.full((rr.get_world_size(), 64), float(r)) if odd or r == 0 else None)),
    # algo= per call (shared memory only): the odd rank runs shared memory, the others a
    # tree over TCP, whose frames to it stay unread -- the heartbeats' algorithms name it.
    "algo-shm": ("algorithm mismatch", lambda r, odd: rr.allreduce(
        np.full(64, float(r)), algo="shm" if odd else "tree")),
    # The odd rank's empty call is a no-op: its next call meets the others' current one.
    "zero-count": ("pass an empty buffer?", lambda r, odd: rr.allreduce(
        np.ones(0 if odd else 64))),
}


_SYNC_STORE: list = []


def store_barrier(rank: int, world: int, tag: str) -> None:
    """Out-of-band barrier through the job's TCPStore, for tests that must keep ranks in
    step without the library (which may be failing on purpose)."""
    from ringreduce import _rendezvous

    if not _SYNC_STORE:
        # Share (and hold) the job's store: destroy() then keeps rank 0's server running.
        _SYNC_STORE.append(_rendezvous.make_store(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, 60.0,
            False))
    store = _SYNC_STORE[0]
    store.set(f"tests/{tag}/{rank}", "1")
    store.wait([f"tests/{tag}/{r}" for r in range(world)])


def mismatch(rank: int, world: int, names: list[str]) -> list[dict]:
    """For each scenario the last rank disagrees with the others. Each scenario runs on a
    fresh communicator (destroy + init again) after a correct all-reduce proves it works;
    ranks line up through the store before each scenario (otherwise fast ranks may reach
    the mismatch, and abort, while a slow one is still finishing the correct all-reduce)."""
    out = []
    for k, name in enumerate(names):
        phrase, call = MISMATCHES[name]
        if k > 0:
            rr.init(timeout=10)
        res: dict[str, Any] = {"name": name, "phrase": phrase}
        try:
            v = np.full(10, float(rank))
            rr.allreduce(v)
            res["fresh_comm_ok"] = bool(np.all(v == world * (world - 1) / 2))
        except Exception as e:  # noqa: BLE001
            res["fresh_comm_ok"] = f"{type(e).__name__}: {e}"
        store_barrier(rank, world, f"mismatch-{k}")
        t0 = time.time()
        try:
            call(rank, rank == world - 1)
            res.update({"type": None, "msg": "no error", "elapsed": time.time() - t0})
        except Exception as e:  # noqa: BLE001
            res.update(_exc_info(e, t0))
        # The collective after a mismatch must not silently succeed either.
        try:
            rr.allreduce(np.ones(4))
            res["after"] = None
        except Exception as e:  # noqa: BLE001
            res["after"] = f"{type(e).__name__}: {e}"
        out.append(res)
        rr.destroy()
        if k + 1 < len(names):  # (rank 0 hosts the store: no store call after the last)
            store_barrier(rank, world, f"mismatch-{k}-destroyed")
    return out


def reduce_root_then_leave(rank: int, world: int) -> str:
    """Three reduces to rank 0, then rank 2 passes dst=1 in the fourth and everyone leaves at
    once: over TCP (4 ranks) rank 2 sends to its parent in the tree to rank 1 and finishes,
    so rank 0 waits for a message that never comes until rank 2's goodbye arrives."""
    x = np.ones(1000, np.float32)
    for _ in range(3):
        rr.reduce(x, dst=0)
    try:
        rr.reduce(x, dst=1 if rank == 2 else 0)
    except rr.RingReduceError as e:
        return str(e)
    return ""


def collective_timeout(rank: int, world: int, async_op: bool) -> dict:
    """init(timeout=2); the last rank sleeps 4 s before its all-reduce. Then every rank
    destroys and initialises again in the same process, and a correct all-reduce follows."""
    rr.init(timeout=2)
    late = world - 1
    res: dict[str, Any] = {}
    x = np.ones(1000, dtype=np.float32)
    if rank == late:
        time.sleep(4)
    t0 = time.time()
    try:
        w = rr.allreduce(x, algo="ring", async_op=async_op)
        if async_op:
            res["queued_s"] = time.time() - t0
            w.wait()
        res["first"] = {"type": None}
    except Exception as e:  # noqa: BLE001
        res["first"] = _exc_info(e, t0)
    try:
        rr.barrier()
        res["after"] = None
    except Exception as e:  # noqa: BLE001
        res["after"] = f"{type(e).__name__}: {e}"
    t = time.time()
    rr.destroy()
    res["destroy_s"] = time.time() - t
    res["initialized_after_destroy"] = rr.is_initialized()
    rr.init(timeout=20)
    v = np.full(5, rank + 1, dtype=np.int64)
    rr.allreduce(v)
    res["reinit_sum"] = v.tolist()
    rr.barrier()
    rr.destroy()
    return res


def left_after_reinit(rank: int, world: int) -> dict:
    """Job 1: rank 1 aborts, so every other rank's first failure lost rank 1. Job 2 (init()
    again, same processes): rank 2 leaves normally while rank 0 waits for its broadcast.
    Rank 0 must name rank 2 (left), not rank 1 relayed by rank 2 -- job 1's failure is not
    why rank 2 left job 2."""
    rr.init(timeout=20)
    rr.barrier()
    if rank == 1:
        time.sleep(0.5)
        rr.abort()
    else:
        try:
            rr.allreduce(np.ones(4))
        except rr.RingReduceError:
            pass
    rr.destroy()
    rr.init(timeout=20)
    rr.barrier()
    if rank == 2:
        rr.destroy()
        time.sleep(1.0)
        return {"type": None}
    if rank == 1:
        time.sleep(1.0)
        rr.destroy()
        return {"type": None}
    time.sleep(0.3)
    try:
        rr.broadcast(np.ones(4), src=2)
        out = {"type": None}
    except rr.RingReduceError as e:
        out = {"type": type(e).__name__, "peer_rank": e.peer_rank, "cause": e.cause,
               "relayed_by": e.relayed_by, "msg": str(e)}
    rr.destroy()
    return out


def init_only(rank: int, world: int) -> dict:
    """init() and report how it went (for wrong-secret tests)."""
    t0 = time.time()
    try:
        rr.init()
    except Exception as e:  # noqa: BLE001
        return _exc_info(e, t0)
    try:
        x = np.ones(4)
        rr.allreduce(x)
        return {"type": None, "elapsed": time.time() - t0, "sum": x.tolist()}
    finally:
        rr.destroy()


def init_only_unchecked(rank: int, world: int) -> dict:
    """init_only without init's comparison of the ranks' secrets (every rank the same
    check value): what the handshake alone does with a process holding another secret."""
    from ringreduce import _job_settings

    _job_settings.secret_check = lambda secret: "unchecked"
    return init_only(rank, world)


def init_and_destroy(rank: int, world: int) -> str:
    """init() and destroy(), no collective (init's own must not use RINGREDUCE_TIMEOUT)."""
    rr.init()
    rr.destroy()
    return "ok"


_HELLO = struct.Struct("<IIii16s")
_AUTH = struct.Struct("<IIiiii16s32s")
_ACK = struct.Struct("<II32s")
_MAGIC = 0x31485252
_VERSION = 4  # csrc/transport/tcp/handshake.cc kVersion


def _recv_all(s: socket.socket, n: int | None = None) -> bytes:
    buf = b""
    while n is None or len(buf) < n:
        try:
            chunk = s.recv(65536 if n is None else n - len(buf))
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        buf += chunk
    return buf


def strangers(rank: int, world: int) -> dict:
    """Before rank 1's init, four strangers connect to rank 0's listener (address read from
    the store): a wrong-secret handshake, garbage, an immediate close, and a silent one.
    Rank 0 must refuse them all and still accept the real rank 1."""
    from datetime import timedelta

    import torch.distributed as dist

    seen: dict[str, Any] = {}
    threads = []
    if rank == 1:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, timeout=timedelta(seconds=30),
                              wait_for_workers=False)
        key = "ringreduce/1/addr/0"
        store.wait([key])
        host, port = store.get(key).decode().rsplit(":", 1)
        socks = {k: socket.create_connection((host.strip("[]"), int(port)), timeout=30)
                 for k in ("bad_mac", "garbage", "closer", "silent")}
        socks["closer"].close()

        def bad_mac(s: socket.socket) -> None:
            hello = _HELLO.unpack(_recv_all(s, _HELLO.size))
            seen["hello"] = [hello[0], hello[1], hello[2], hello[3]]
            s.sendall(_AUTH.pack(_MAGIC, _VERSION, 1, world, 0, 0, os.urandom(16), os.urandom(32)))
            ack = _recv_all(s, _ACK.size)
            seen["bad_mac_ack"] = list(_ACK.unpack(ack)[:2]) if len(ack) == _ACK.size else None

        def garbage(s: socket.socket) -> None:
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\x00" * 100)
            data = _recv_all(s)
            seen["garbage_ack"] = (list(_ACK.unpack(data[-_ACK.size:])[:2])
                                   if len(data) == _HELLO.size + _ACK.size else len(data))

        for fn, k in ((bad_mac, "bad_mac"), (garbage, "garbage")):
            th = threading.Thread(target=fn, args=(socks[k],), daemon=True)
            th.start()
            threads.append(th)
    t0 = time.time()
    rr.init()
    seen["init_s"] = time.time() - t0
    x = np.full(3, rank + 1.0)
    rr.allreduce(x)
    seen["sum"] = x.tolist()
    for th in threads:
        th.join(10)
    if rank == 1:
        socks["silent"].close()
    return seen


def stuck_rank_named(rank: int, world: int) -> dict:
    """init(timeout=2). The last rank sleeps 4 s before its all-reduce; rank 0 joins 0.5 s
    after the others, so rank 1's deadline (waiting for rank 0, itself waiting for the last
    rank) fires first. Returns what each rank raised."""
    rr.init(timeout=2)
    if rank == world - 1:
        time.sleep(4)
    elif rank == 0:
        time.sleep(0.5)
    t0 = time.time()
    try:
        rr.allreduce(np.ones(1000, dtype=np.float32), algo="ring")
        return {"type": None}
    except Exception as e:  # noqa: BLE001
        return _exc_info(e, t0)
    finally:
        rr.destroy()


def hang(rank: int, world: int, seconds: float) -> None:
    """The last rank sleeps (for tests of the spawn helper's hard timeout)."""
    if rank == world - 1:
        time.sleep(seconds)


def fail_on(rank: int, world: int, bad_rank: int) -> int:
    """Raises on `bad_rank` (for tests of the spawn helper's error reporting)."""
    if rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    return rank * 10


def fire_and_forget(rank: int, world: int, n: int) -> list[bool]:
    """Async all-reduces whose Work handle (and buffer) the caller drops at once, as with
    torch.distributed, where the Work keeps its tensors alive until the collective is done.
    Then fresh arrays are allocated; they must stay intact and the process must survive."""
    import gc

    intact = []
    for _ in range(5):
        rr.allreduce(np.ones(n, dtype=np.float32), async_op=True)  # handle dropped here
        gc.collect()
        fresh = [np.full(n, 7.0, dtype=np.float32) for _ in range(4)]
        rr.barrier()
        intact.append(all(bool((f == 7.0).all()) for f in fresh))
    return intact


def destroy_with_pending(rank: int, world: int) -> dict:
    """destroy() while async collectives are queued: it returns promptly and every pending
    Work fails with a RingReduceError (none hangs); afterwards the API says to init."""
    xs = [np.ones(200_000, dtype=np.float32) for _ in range(6)]
    if rank == 1:  # rank 0 destroys before rank 1 posts: some Work is pending on both
        await_flags(["posted0"], 20)  # (a fixed 0.3 s: rank 0 could start later than that)
        time.sleep(1.0)
    works = [rr.allreduce(x, async_op=True) for x in xs]
    if rank == 0:
        raise_flag("posted0")
    t = time.time()
    rr.destroy()
    res: dict[str, Any] = {"destroy_s": time.time() - t, "works": []}
    for w in works:
        t = time.time()
        try:
            done = w.wait(timeout=10)
            res["works"].append({"type": None, "done": done})
        except Exception as e:  # noqa: BLE001
            res["works"].append(_exc_info(e, t))
    try:
        rr.allreduce(np.ones(3))
        res["after"] = None
    except Exception as e:  # noqa: BLE001
        res["after"] = f"{type(e).__name__}: {e}"
    return res


def dies_after_sending(rank: int, world: int) -> dict:
    """3 ranks over TCP: rank 0 enters an all-reduce at once, rank 1 enters and is killed
    1 s later (its data for rank 0 already sent), rank 2 enters 6 s late. Rank 0, waiting
    for rank 2 with rank 1's data unread in its socket, must name rank 1's exit when it
    happens -- before, it stopped watching that socket and learnt of it only when rank 1's
    heartbeats were missed (4 s later), told that rank 1 'stopped responding'."""
    x = np.full(1024, float(rank + 1), np.float32)
    rr.barrier()
    if rank == 1:
        threading.Timer(1.0, os.kill, (os.getpid(), 9)).start()
    if rank == 2:
        time.sleep(6.0)
    t0 = time.monotonic()
    try:
        rr.allreduce(x)
        return {"error": "no error", "secs": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "secs": time.monotonic() - t0}


def awaited_rank_dies_after_another(rank: int, world: int) -> dict:
    """3 ranks: rank 0 waits for rank 2's first message on a tag; rank 1 (not involved) is
    killed at 1 s, rank 2 at 3 s. Every probe of rank 0's wait found rank 1 first, so rank
    2's death went unseen until the timeout (found by a README check)."""
    rr.barrier()
    if rank == 1:
        threading.Timer(1.0, os.kill, (os.getpid(), 9)).start()
        time.sleep(30)
    if rank == 2:
        threading.Timer(3.0, os.kill, (os.getpid(), 9)).start()
        time.sleep(30)
    t0 = time.monotonic()
    try:
        rr.recv(np.zeros(4, np.float32), src=2, tag=7)
        return {"error": None, "secs": time.monotonic() - t0}
    except rr.PeerFailure as e:
        return {"error": "PeerFailure", "peer": e.peer_rank, "cause": e.cause,
                "secs": time.monotonic() - t0}


def late_to_group_creation(rank: int, world: int) -> dict:
    """Group [0, 2] (timeout 2 s) that world rank 2 joins 5 s late: rank 0's timeout names
    it as a world rank (.peer_rank; its address key is its group rank's, addr/1)."""
    if rank == 2:
        time.sleep(5.0)
    try:
        rr.new_group([0, 2], timeout=2)
        return {"error": None}
    except Exception as e:  # noqa: BLE001 - reported
        return {"error": f"{type(e).__name__}: {e}", "peer_rank": getattr(e, "peer_rank", None)}


def roots_then_leave(rank: int, world: int) -> list:
    """Each rank names itself a broadcast's root (over TCP all only send, and return), and
    the job ends: no later call reads the other's frame. destroy() (the harness's) must say
    the results differ -- nothing did (found by a helper)."""
    x = np.full(10, float(rank), np.float32)
    rr.broadcast(x, src=rank)
    return x.tolist()


def avg_scratch_refused(rank: int, world: int) -> dict:
    """An integer avg whose int64 scratch cannot be allocated (an address-space limit, as
    `ulimit -v`): a clear error saying how much and what to do -- it was a bare
    "std::bad_alloc" reported "during barrier #3", the collective before it (a helper)."""
    import resource

    x = np.full(32 << 20, rank + 1, np.int32)  # 128 MiB; its avg needs 256 MiB of int64
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) << 10
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + (128 << 20), hard))
    try:
        rr.allreduce(x, op="avg")
        out = {"error": None}
    except rr.RingReduceError as e:
        out = {"error": str(e)}
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    out["intact"] = bool((x == rank + 1).all())
    return out


def late_first_message(rank: int, world: int, timeout: float | None) -> dict:
    """Rank 1 posts its first send 4 s late; rank 0's receive gives up after the world's
    timeout (init's timeout= when given) and says which setting that was."""
    rr.init(timeout=timeout)
    out: dict = {}
    try:
        x = np.zeros(3)
        if rank == 1:
            time.sleep(4)
            rr.send(np.ones(3), 0)
        else:
            rr.recv(x, 1)
        out["got"] = x.tolist()
    except Exception as e:  # noqa: BLE001 - what the test checks
        out["error"] = f"{type(e).__name__}: {e}"
    rr.destroy()
    return out


def algo_cycle(rank: int, world: int, algos: list) -> dict:
    """Rank r all-reduces with algo=algos[r]: tree against shared memory at 3 or 5 ranks
    sends no frame either side could compare (rank 0's tree first waits for rank 2's fold-in,
    rank 2 waits in shared memory for rank 0's line); they wait for each other until the
    timeout, whose wait chain must say why."""
    x = np.full(7, float(rank), np.float32)
    t0 = time.time()
    try:
        rr.allreduce(x, algo=algos[rank])
        return {"type": None, "ok": bool(np.all(x == world * (world - 1) / 2))}
    except Exception as e:  # noqa: BLE001
        return _exc_info(e, t0)
