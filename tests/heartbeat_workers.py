"""Rank-side code of tests/test_heartbeats.py: idle communicators lean on the world's
heartbeat (liveness shared per peer process), and nothing about failure detection is lost."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
from _spawn import proc_state

import ringreduce as rr


def _checked_allreduce(g: rr.Group | None, rank: int, members: list[int]) -> None:
    x = np.full(7, rank + 1, np.int64)
    rr.allreduce(x, group=g)
    want = sum(r + 1 for r in members)
    assert (x == want).all(), f"rank {rank}: {x.tolist()}, want {want}"


def _groups(rank: int, world: int) -> list[tuple[rr.Group, list[int]]]:
    made = [(rr.new_group(), list(range(world))), (rr.new_group([0, 2]), [0, 2]),
            (rr.world_group().split(rank % 2, key=rank),
             [r for r in range(world) if r % 2 == rank % 2])]
    return [(g, m) for g, m in made if g is not None]


def idle_traffic(rank: int, world: int) -> dict:
    """Groups used once, then idle for 3 s: the heartbeat datagrams each communicator sent
    meanwhile (and skipped: the world spoke for it), groups checked before and after."""
    groups = _groups(rank, world)
    for g, m in groups:
        _checked_allreduce(g, rank, m)
    time.sleep(1.0)
    comms = {"world": rr.world_group().comm}
    comms.update({g.name: g.comm for g, _ in groups if g.comm is not None})
    before = {k: c.link_stats() for k, c in comms.items()}
    time.sleep(3.0)
    after = {k: c.link_stats() for k, c in comms.items()}
    for g, m in groups:
        _checked_allreduce(g, rank, m)
    return {k: {"sent": after[k]["heartbeat_sent"] - before[k]["heartbeat_sent"],
                "skipped": after[k]["heartbeat_skipped"] - before[k]["heartbeat_skipped"],
                "targets": after[k]["heartbeat_targets"]} for k in comms}


def late_member(rank: int, world: int, late: int, secs: float, alt_addr: bool = False) -> float:
    """Every rank but `late` waits in an all-reduce on a group of all ranks while `late`
    sleeps `secs` (longer than the heartbeat timeout) before joining: its group was idle
    and quiet, its process alive -- nobody may call it silent. Returns seconds waited.
    alt_addr: `late` binds its group to 127.0.0.2, the world to 127.0.0.1 (as a group can
    when an interface list or a route picks another address later)."""
    if alt_addr and rank == late:
        from ringreduce import _env

        _env.select_interface_address = lambda *a, **k: "127.0.0.2"
    g = rr.new_group()
    _checked_allreduce(g, rank, list(range(world)))
    rr.barrier()
    if rank == late:
        time.sleep(secs)
    t0 = time.monotonic()
    _checked_allreduce(g, rank, list(range(world)))
    return time.monotonic() - t0


def frozen_member(rank: int, world: int, victim: int, members: list[int] | None = None) -> dict:
    """`victim` stops (SIGSTOP) while its group (`members`, default all) is idle; the others
    then all-reduce on the group: the victim must be named silent at the heartbeat timeout,
    as before. Ranks outside the group idle meanwhile (their world heartbeats go on)."""
    members = list(range(world)) if members is None else members
    g = rr.new_group(members)
    if g is not None:
        _checked_allreduce(g, rank, members)
    rr.barrier()
    if g is None:
        time.sleep(8.0)
        return {"error": "not a member"}
    if rank == victim:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(60)
    time.sleep(1.0)  # the victim is stopped, its group's last word a while ago
    t0 = time.monotonic()
    try:
        _checked_allreduce(g, rank, members)
        return {"error": "no error"}
    except rr.PeerFailure as e:
        return {"error": str(e), "peer_rank": e.peer_rank, "cause": e.cause,
                "secs": time.monotonic() - t0}


def paused(rank: int, world: int, stopped: list[int], pause: float) -> list[str]:
    """Ranks `stopped` (the whole job: a suspended SLURM job, docker pause; one rank: a
    debugger) are SIGSTOPped for `pause` s, longer than the heartbeat timeout, while the
    others wait in an all-reduce (rank 0 computes meanwhile); then SIGCONT. Nobody may be
    named: a resumed rank blamed a healthy peer for its own pause (found by a helper). Rank
    0 starts the stopper (a shell) and reaps it."""
    import subprocess

    pids = [int(p) for p in rr.allgather(np.array([os.getpid()], np.int64)).ravel()]
    stopper = None
    if rank == 0:
        who = " ".join(str(pids[r]) for r in stopped)
        stopper = subprocess.Popen(
            ["sh", "-c", f"sleep 0.5; kill -STOP {who}; sleep {pause}; kill -CONT {who}"])
    errs: list[str] = []
    try:
        for i in range(3):
            if rank == 0 and i == 0:
                if 0 in stopped:
                    time.sleep(1.0)  # the others wait meanwhile
                else:  # until the stopped rank runs again (never waiting for it stopped)
                    for want_stopped in (True, False):
                        _wait_state(pids[stopped[0]], want_stopped, pause + 20)
                    time.sleep(1.5)
            _checked_allreduce(None, rank, list(range(world)))
    except rr.RingReduceError as e:
        errs.append(f"{type(e).__name__}: {e}")
    finally:
        if stopper is not None:
            stopper.wait(pause + 30)
    return errs


def _wait_state(pid: int, stopped: bool, limit: float) -> None:
    """Until process `pid` is stopped (state T) or not, as /proc says (at most `limit` s)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if (proc_state(pid) in ("T", "t")) == stopped:
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {pid} not {'stopped' if stopped else 'running'} in {limit} s")


def late_behind_a_firewall(rank: int, world: int, late: int, secs: float) -> dict:
    """Rank `late`'s UDP datagrams are dropped (tests/cpp/drop_udp.cc preloaded there: a
    firewall passing TCP only); it sleeps `secs` (a slow checkpoint save, longer than the
    heartbeat timeout) while the others wait in an all-reduce. Returns seconds waited, or
    the error."""
    _checked_allreduce(None, rank, list(range(world)))
    if rank == late:
        time.sleep(secs)
    t0 = time.monotonic()
    try:
        _checked_allreduce(None, rank, list(range(world)))
        _checked_allreduce(None, rank, list(range(world)))
    except rr.PeerFailure as e:
        return {"error": str(e), "peer_rank": e.peer_rank, "cause": e.cause}
    return {"waited": time.monotonic() - t0}
