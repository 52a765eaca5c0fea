"""Functions that run inside ranks for test_backend.py about the torch backend's life:
destroy and abort while a collective runs, re-init on a new store, ringreduce.init() beside
init_process_group, what an exit does to outstanding async collectives."""

from __future__ import annotations

import time
from typing import Any

import torch

import ringreduce as rr


def destroy_in_a_signal_handler(rank: int, world: int) -> dict:
    """Rank 0's SIGTERM handler (a checkpoint-and-exit handler, as under torchrun) calls
    destroy_process_group() while rank 0 waits for an async all_reduce that rank 1 joins
    late: the handler (a program's own: run once the core's wait returns) runs inside that
    wait's Python frames, and destroy waited for the collective's lock its own thread held
    -- for good (found by a helper; gloo exits)."""
    import os
    import signal
    import threading

    import torch.distributed as dist

    class Stop(Exception):
        pass

    def handler(signum: int, frame: Any) -> None:
        dist.destroy_process_group()
        raise Stop

    dist.init_process_group("ringreduce")
    x = torch.full((4,), rank + 1.0)
    t0 = time.monotonic()
    if rank == 0:
        signal.signal(signal.SIGTERM, handler)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        try:
            dist.all_reduce(x, async_op=True).wait()
        except Stop:
            return {"stopped": time.monotonic() - t0, "inited": dist.is_initialized()}
        return {"stopped": None}
    time.sleep(3.0)
    try:
        dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001 - rank 0 may have left first: any clear error
        return {"error": type(e).__name__}
    return {"error": None, "x": x.tolist()}


def a_bigger_world_on_a_new_file_store(rank: int, world: int, folder: str) -> dict:
    """Ranks 0..world-2 make a world on FileStore A and destroy it; then every rank, the last
    one new, makes one on FileStore B. The first ones counted an earlier init on "a store
    that is not a TCPStore" and looked for the new world's keys under another prefix than
    the new rank: all waited out the connect timeout (found by a helper; gloo runs it)."""
    import torch.distributed as dist

    if rank < world - 1:
        dist.init_process_group("ringreduce", init_method=f"file://{folder}/a", rank=rank,
                                world_size=world - 1)
        dist.destroy_process_group()
    dist.init_process_group("ringreduce", init_method=f"file://{folder}/b", rank=rank,
                            world_size=world)
    x = torch.full((4,), rank + 1.0)
    dist.all_reduce(x)
    dist.destroy_process_group()
    return {"x": x.tolist()}


def async_unwaited_at_exit(rank: int, world: int) -> dict:
    """Rank 0 issues an async all_reduce and its program ends (the exit hooks run) without
    waiting; the others come 0.3 s later and wait: they get the sum, as with gloo -- it was
    cancelled, failing theirs with 'communicator was destroyed' (found by a helper)."""
    import atexit

    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    t = torch.full((3,), float(rank + 1))
    if rank == 0:
        dist.all_reduce(t, async_op=True)
        atexit._run_exitfuncs()  # what the interpreter's exit runs (the harness skips it)
    else:
        time.sleep(0.3)
        dist.all_reduce(t, async_op=True).wait()
    return {"t": t.tolist()}


def torch_after_init_env(rank: int, world: int) -> dict:
    """ringreduce.init() ran first (the harness's, hosting the store on MASTER_PORT), then
    init_process_group("ringreduce") by env:// -- whose store on rank 0 failed with
    EADDRINUSE under every launcher but torchrun (found by a helper): it shares the server
    now (multi-tenant). ringreduce.init() again is refused (the world is there)."""
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    try:
        rr.init()
        again = None
    except RuntimeError as e:
        again = str(e)
    dist.destroy_process_group()
    return {"sum": x.tolist(), "again": again}


def torch_group_rules(rank: int, world: int) -> dict:
    """RINGREDUCE_TIMEOUT (the harness sets 7) is the deadline of a dist.new_group made
    without timeout= -- it was torch's 30 minutes (found by a helper); ringreduce.init()
    after init_process_group is refused saying so; and after ringreduce.destroy() ended
    the world under torch's default group, a new ringreduce subgroup is refused -- it
    became ringreduce's world on its members (found by a helper), and a collective on the
    torch group says how to make a new one (it said "call ringreduce.init() again")."""
    import torch.distributed as dist

    from ringreduce import backend

    dist.init_process_group("ringreduce")
    g = dist.new_group(list(range(world)))
    out: dict = {"deadline": backend.impl_of(g).timeout_seconds()}
    try:
        rr.init()
    except RuntimeError as e:
        out["again"] = str(e)
    rr.destroy()
    try:
        dist.new_group(list(range(world)))
        out["after_destroy"] = None
    except RuntimeError as e:
        out["after_destroy"] = str(e)
    out["initialized"] = rr.is_initialized()
    try:
        dist.all_reduce(torch.ones(3), group=g)
        out["call_after_destroy"] = None
    except RuntimeError as e:
        out["call_after_destroy"] = str(e)
    dist.destroy_process_group()
    return out


def abort_process_group_in_flight(rank: int, world: int, on: str) -> dict:
    """A watchdog thread on rank 0 calls torch's _abort_process_group() while rank 0 waits in
    an all_reduce (on="collective") or a recv (on="recv") that rank 1 joins late. The call
    said "communicator was destroyed ... during" (torch destroys right after aborting): it
    says aborted now, and the late rank hears of it from rank 0."""
    import threading

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _abort_process_group

    dist.init_process_group("ringreduce")
    x = torch.full((4,), rank + 1.0)
    dist.all_reduce(x)  # the connections are there (a recv's channel too)
    if on == "recv":
        dist.send(x, 0) if rank == 1 else dist.recv(x, 1) if rank == 0 else None
    t0 = time.monotonic()
    if rank == 0:
        threading.Timer(1.0, _abort_process_group).start()
    else:
        time.sleep(3.0)
    try:
        if on == "recv" and rank == 0:
            dist.recv(x, 1)
        elif on == "recv":
            return {"error": None}
        else:
            dist.all_reduce(x)
    except RuntimeError as e:
        return {"error": str(e), "t": time.monotonic() - t0}
    return {"error": None, "t": time.monotonic() - t0}


def calls_after_pg_abort(rank: int, world: int) -> dict:
    """pg.abort() (torch's ProcessGroup.abort) on a subgroup and then on the default group,
    every rank at once: the next call on each -- synchronous (the C++ adapter's) and async
    (the Python side's) -- says what a torch user does next; an async one said only "make
    ringreduce.init() again" (found by a helper)."""
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    sub = dist.new_group([0, 1])
    x = torch.full((4,), rank + 1.0)
    dist.all_reduce(x)
    out = {}
    for name, g in (("sub", sub), ("world", dist.group.WORLD)):
        if rank not in dist.get_process_group_ranks(g):
            continue
        g.abort()
        for how in ("sync", "async"):
            try:
                if how == "sync":
                    dist.all_reduce(x, group=g)
                else:
                    dist.all_reduce(x, group=g, async_op=True).wait()
                out[f"{name} {how}"] = None
            except RuntimeError as e:
                out[f"{name} {how}"] = str(e)
    return out


def monitored_barriers(rank: int, world: int) -> dict:
    """dist.monitored_barrier (torch 2.14 runs it on any CPU backend; on 2.13, which lets
    only gloo through dist.monitored_barrier, the process group's own method): all arrive
    (twice); rank 2 late (each rank's error); ranks 1 and 2 late with wait_all_ranks; on a
    subgroup [1, 2] with rank 2 late (its group rank 1)."""
    from datetime import timedelta

    import torch.distributed as dist

    new = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 14)

    def mb(secs: float, wait_all: bool = False, group: Any = None) -> str | None:
        try:
            if new:
                dist.monitored_barrier(group, timedelta(seconds=secs), wait_all_ranks=wait_all)
            else:
                (group or dist.group.WORLD).monitored_barrier(timedelta(seconds=secs),
                                                              wait_all_ranks=wait_all)
        except RuntimeError as e:
            return str(e)
        return None

    dist.init_process_group("ringreduce")
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    keys = store.num_keys()
    dist.barrier()  # (no rank checks in before every rank counted, nor after: below)
    out: dict[str, Any] = {"all": [mb(5.0), mb(5.0)]}
    dist.barrier()
    out["keys_left"] = store.num_keys() - keys  # every verdict read: none stay
    dist.barrier()  # (CI: rank 1 checked in to the next barrier before rank 2 counted)
    if rank == 2:
        time.sleep(4.0)  # well past rank 0's 1 s: its wait is timed below
    t0 = time.monotonic()
    out["late"] = mb(1.0)
    out["late_secs"] = time.monotonic() - t0
    dist.barrier()
    if rank in (1, 2):
        time.sleep(2.5)
    out["late_all"] = mb(1.0, wait_all=True)
    dist.barrier()
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        if rank == 2:
            time.sleep(2.5)
        out["sub"] = mb(1.0, group=sub)
        out["sub_ok"] = mb(5.0, group=sub)
    dist.barrier()
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)  # the group works after failed monitored barriers
    out["sum"] = x.tolist()
    dist.destroy_process_group()
    return out
