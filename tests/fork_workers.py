"""Rank-side code of tests/test_fork.py: processes forked after init (DataLoader workers,
os.fork) that make a world of their own."""

from __future__ import annotations

import os

import numpy as np

import ringreduce as rr


def _sums(g: rr.Group | None, rank: int, world: int, n: int) -> bool:
    x = np.arange(n, dtype=np.float64) + rank
    rr.allreduce(x, group=g)
    return bool(np.array_equal(x, world * np.arange(n, dtype=np.float64) + world * (world - 1) / 2))


def child_worlds(rank: int, world: int, port: int) -> dict:
    """Each rank, holding a TCP group (the process's shared links and their pump thread),
    forks a child. The child's init() with the inherited environment must refuse (it took
    the parent's store from the registry: their requests interleaved and the parent's job
    failed); with a MASTER_PORT of its own it makes a world, a group, and destroys them
    (destroy() waited forever for the parent's link pump). The parent meanwhile makes and
    destroys groups: every result checked."""
    g = rr.new_group(list(range(world)))
    ok = _sums(g, rank, world, 1000)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        code = 0
        try:
            try:
                rr.init()
                code = 10
            except RuntimeError as e:
                code = 0 if "forked from process" in str(e) else 11
                os.write(wr, str(e).encode()[:300])
            if code == 0:
                os.environ["MASTER_PORT"] = str(port)
                rr.init()
                cg = rr.new_group(list(range(world)))
                code = 0 if _sums(cg, rank, world, 1 << 16) and _sums(None, rank, world, 7) else 12
                rr.destroy()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(wr, f" | {type(e).__name__}: {e}".encode()[:500])
            code = code or 13
        os._exit(code)
    os.close(wr)
    for _ in range(10):
        gi = rr.new_group(list(range(world)))
        ok = _sums(gi, rank, world, 4099) and ok
        gi.destroy()
    ok = _sums(g, rank, world, 1 << 16) and _sums(None, rank, world, 5) and ok
    _, status = os.waitpid(pid, 0)
    with os.fdopen(rd) as f:
        said = f.read()
    return {"child": os.waitstatus_to_exitcode(status), "said": said, "ok": ok}


def torch_group_in_child(rank: int, world: int) -> dict:
    """torch's process group on the backend; a forked child's dist.new_group is refused
    naming the parent (it said "the default process group is another backend's")."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            dist.new_group(list(range(world)))
            os.write(wr, b"no error")
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(wr, str(e).encode()[:400])
        os._exit(0)
    os.close(wr)
    t = torch.full((9,), float(rank))
    dist.all_reduce(t)
    ok = bool(torch.all(t == world * (world - 1) / 2))
    os.waitpid(pid, 0)
    with os.fdopen(rd) as f:
        said = f.read()
    dist.destroy_process_group()
    return {"ok": ok, "said": said}


def future_of_a_parents_work(rank: int, world: int) -> dict:
    """Rank 0 forks while its async all-reduce waits for the last rank (1.5 s late); the
    child asks that Work for its Future and waits: it must fail at once saying the parent
    owns it -- its completer polled a Work no thread of the child completes, for good
    (found by a review; a wait() has raised so since the fork fixes)."""
    import time

    x = np.full(4, rank + 1.0)
    if rank == world - 1:
        time.sleep(1.5)
    w = rr.allreduce(x, async_op=True)
    said = ""
    if rank == 0:
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rd)
            try:
                w.get_future().wait()
                msg = "no error"
            except Exception as e:  # noqa: BLE001 - reported to the parent
                msg = str(e)
            os.write(wr, msg.encode()[:4000])
            os._exit(0)
        os.close(wr)
        with os.fdopen(rd, "rb") as f:
            said = f.read().decode()
        os.waitpid(pid, 0)
    w.wait()
    return {"said": said, "x": x.tolist()}
