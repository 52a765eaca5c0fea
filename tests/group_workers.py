"""Rank-side code of tests/test_groups.py: groups (new_group, split) checked against numpy."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from _spawn import await_flags, raise_flag, stay_until, victim_after_the_others

import ringreduce as rr


def _data(rank: int, n: int, dtype: Any, salt: int = 0) -> np.ndarray:
    """Rank-dependent values whose sums are exact in every dtype used here."""
    return ((np.arange(n) * 7 + rank * 13 + salt) % 23).astype(dtype)


def _check_group(g: rr.Group, members: list[int], fails: list, what: str) -> None:
    me = rr.get_rank()
    if g.ranks != members or g.size != len(members) or g.rank != members.index(me) \
            or rr.get_rank(g) != g.rank or rr.get_world_size(g) != g.size:
        fails.append(f"{what}: identity {g!r}, expected ranks {members}")
        return
    for n in (0, 1, 5, 1003):
        for dt in (np.float64, np.int32, np.float32):
            x = _data(me, n, dt)
            want = sum(_data(r, n, dt) for r in members) if n else x.copy()
            rr.allreduce(x, group=g)
            if not np.array_equal(x, want):
                fails.append(f"{what}: allreduce n={n} {dt.__name__}")
        x = _data(me, 7, np.float64)
        rr.allreduce(x, op="max", group=g)
        if not np.array_equal(x, np.max([_data(r, 7, np.float64) for r in members], axis=0)):
            fails.append(f"{what}: allreduce max")
    for src in members:
        x = _data(me, 301, np.float32, salt=1)
        rr.broadcast(x, src=src, group=g)
        if not np.array_equal(x, _data(src, 301, np.float32, salt=1)):
            fails.append(f"{what}: broadcast src={src}")
    out = rr.allgather(_data(me, 11, np.int64), group=g)
    if not np.array_equal(out, np.stack([_data(r, 11, np.int64) for r in members])):
        fails.append(f"{what}: allgather")
    k = 6
    x = _data(me, k * g.size, np.float64)
    out = rr.reduce_scatter(x, group=g)
    want = sum(_data(r, k * g.size, np.float64) for r in members)[g.rank * k:(g.rank + 1) * k]
    if not np.array_equal(out, want):
        fails.append(f"{what}: reduce_scatter")
    xs = [_data(me, 3, np.float32), _data(me, 4, np.float32, salt=2)]
    rr.allreduce_coalesced(xs, group=g)
    if not (np.array_equal(xs[0], sum(_data(r, 3, np.float32) for r in members)) and
            np.array_equal(xs[1], sum(_data(r, 4, np.float32, salt=2) for r in members))):
        fails.append(f"{what}: allreduce_coalesced")
    x = _data(me, 9, np.float64)
    w = rr.allreduce(x, group=g, async_op=True)
    w.wait()
    if not np.array_equal(x, sum(_data(r, 9, np.float64) for r in members)):
        fails.append(f"{what}: async allreduce")
    rr.barrier(group=g)


def matrix(rank: int, world: int) -> dict:
    """Every kind of group this world size allows, each checked with every collective."""
    fails: list[str] = []
    ranks = list(range(world))
    shapes = {
        "all": ranks,
        "evens": ranks[0::2],
        "odds": ranks[1::2],
        "first": [0],
        "ends": sorted({0, world - 1}),
        "all_but_0": ranks[1:],
    }
    made = {}
    for name, members in shapes.items():
        if not members:
            continue
        g = rr.new_group(members)
        if (g is None) != (rank not in members):
            fails.append(f"new_group({members}) returned {g!r} on rank {rank}")
            continue
        if g is not None:
            _check_group(g, members, fails, f"new_group {name} {members}")
            made[name] = g
    # split of the world: color by parity, reverse order by key; the last rank opts out.
    color = None if (world > 2 and rank == world - 1) else rank % 2
    s = rr.world_group().split(color, key=-rank)
    members = sorted((r for r in ranks if not (world > 2 and r == world - 1) and r % 2 == color),
                     reverse=True) if color is not None else []
    if color is None:
        if s is not None:
            fails.append(f"split(None) returned {s!r}")
    elif s is None:
        fails.append("split returned None")
    else:
        _check_group(s, members, fails, f"split color={color} {members}")
        # split of a split: everyone in one group, by rank
        t = s.split(0, key=rank)
        if t is None:
            fails.append("split(0) of a split returned None")
        else:
            _check_group(t, sorted(members), fails, "split of split")
            t.destroy()
    # two groups over the same ranks used at once from two threads
    ga, gb = rr.new_group(), rr.new_group()
    res: dict = {}

    def loop(g: rr.Group, salt: int) -> None:
        ok = True
        for i in range(30):
            x = _data(rank, 257, np.float64, salt=salt + i)
            rr.allreduce(x, group=g)
            ok &= bool(np.array_equal(x, sum(_data(r, 257, np.float64, salt=salt + i)
                                             for r in ranks)))
        res[salt] = ok

    ts = [threading.Thread(target=loop, args=(ga, 0)), threading.Thread(target=loop, args=(gb, 100))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if res != {0: True, 100: True}:
        fails.append(f"two threads on two groups: {res}")
    # bad input, before any data moves
    g = made.get("first") if rank == 0 else None
    if g is not None and world > 1:
        try:
            rr.broadcast(np.zeros(3), src=world - 1, group=g)
            fails.append("broadcast from a rank outside the group did not raise")
        except ValueError as e:
            if "is not in group" not in str(e):
                fails.append(f"bad src message: {e}")
    # not ints (TypeError): [0, 0.7] became [0, 0] (a repeat) and ["0"] the group [0] before
    for bad, kind in (([], ValueError), ([0, 0], ValueError), ([world], ValueError),
                      ([0, 0.7], TypeError), (["0"], TypeError), (0, TypeError)):
        try:
            rr.new_group(bad)
            fails.append(f"new_group({bad!r}) did not raise")
        except kind:
            pass
    try:  # a generator: its message named "ranks []" (used up by the first look)
        rr.new_group(r for r in (0, 0))
        fails.append("new_group of a generator with a repeat did not raise")
    except ValueError as e:
        if "ranks [0, 0] repeat a rank" not in str(e):
            fails.append(f"new_group of a generator: {e}")
    evens = made.get("evens")
    if evens is not None:
        evens.destroy()
        try:
            rr.allreduce(np.zeros(2), group=evens)
            fails.append("a destroyed group still ran a collective")
        except RuntimeError as e:
            if "destroyed" not in str(e) or "new_group" not in str(e):
                fails.append(f"destroyed group message: {e}")
    # the world still works after all that (and destroy() closes the remaining groups)
    x = _data(rank, 33, np.float64)
    rr.allreduce(x)
    if not np.array_equal(x, sum(_data(r, 33, np.float64) for r in ranks)):
        fails.append("world allreduce after groups")
    return {"fails": fails}


def mismatch(rank: int, world: int, odd: tuple = (0, 1)) -> str:
    """Rank 1 asks for a different group (`odd`) than the others: every member fails,
    naming it. odd=(1, 2): rank 1 is the first rank of its list, as rank 0 is of theirs."""
    ranks = list(odd) if rank == 1 else list(range(world))
    try:
        rr.new_group(ranks)
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def retry_after_mismatch(rank: int, world: int, barrier: bool) -> dict:
    """4 ranks. Rank 1 calls new_group([0, 1, 2]), the others new_group([0, 1]) (ranks 2 and 3
    are left out of rank 0's group); then, in step, new_group([0, 2, 3]) and a world split,
    each checked with an all-reduce. Before, every creation after the mismatch failed with
    its error (posted job-wide, where every later creation looked). barrier=False: the ranks
    left out go on at once, while ranks 0 and 1 are still finding out (a review: rank 2 or 3
    then failed the next group alone, and its members waited for it)."""
    out: dict = {}
    try:
        out["first"] = repr(rr.new_group([0, 1, 2] if rank == 1 else [0, 1]))
    except ValueError as e:
        out["first"] = f"ValueError: {e}"
    if barrier:
        rr.barrier()
    try:
        g = rr.new_group([0, 2, 3])
        if g is not None:
            x = _data(rank, 17, np.float64)
            rr.allreduce(x, group=g)
            out["second"] = bool(np.array_equal(x, sum(_data(r, 17, np.float64) for r in (0, 2, 3))))
        else:
            out["second"] = None
        s = rr.world_group().split(rank % 2)
        y = _data(rank, 9, np.int64)
        rr.allreduce(y, group=s)
        out["split"] = bool(np.array_equal(y, sum(_data(r, 9, np.int64)
                                                  for r in range(world) if r % 2 == rank % 2)))
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
    return out


def single_mismatch(rank: int, world: int) -> str:
    """Rank 0 makes a group of one, [0]; rank 1 asks for [0, 1]. Before, rank 1 waited for
    rank 0's member list (a group of one published none) until rank 0 left."""
    t = time.monotonic()
    try:
        g = rr.new_group([0] if rank == 0 else [0, 1])
        out = f"ok {g.size}"
    except Exception as e:  # noqa: BLE001
        out = f"{type(e).__name__}: {e}"
    took = time.monotonic() - t
    rr.barrier()  # rank 0 stays until rank 1 has its answer
    return f"{out} after {took:.1f} s"


def skipped_call(rank: int, world: int) -> str:
    """The last rank skips new_group([0, 1]) and comes late to new_group(all): the others
    have made the first group and wait under the second's prefix while it compares lists
    under the first's. Returns the error and how long this rank's new_group calls took."""
    t0 = time.monotonic()
    try:
        if rank != world - 1:
            rr.new_group([0, 1])
        else:
            time.sleep(1.5)
            t0 = time.monotonic()
        rr.new_group(list(range(world)))
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"


def left_out(rank: int, world: int, who: int, late: float, lag0: float = 0.0,
             slow_verdict: bool = False) -> str:
    """World rank `who` calls new_group with the list of all ranks less itself; the others
    with all ranks. `late`: seconds `who` comes after the others (0: the others come
    late by 1 s instead, world rank 0 `lag0` s more). `slow_verdict`: world rank 0 reads the
    left-out notes 1.5 s after publishing its list (as under load). Returns "None" (no
    group, no error) or the error and how long this rank's new_group took."""
    ranks = [r for r in range(world) if r != who] if rank == who else list(range(world))
    if slow_verdict and rank == 0:
        from ringreduce import groups

        check = groups._check_left_out

        def late_check(*args: object) -> None:
            time.sleep(1.5)
            check(*args)

        groups._check_left_out = late_check
    if rank == who:
        time.sleep(late)
    elif not late:
        time.sleep(1.0 + (lag0 if rank == 0 else 0.0))
    t0 = time.monotonic()
    try:
        g = rr.new_group(ranks)
        return "None" if g is None else f"a group {g.ranks}"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"


def member_dies(rank: int, world: int) -> dict:
    """Overlapping groups A = [1, 2, 3] and B = [0, 2] of 4 ranks: world rank 2 exits; every
    member of every group it belonged to (ranks 1 and 3 in A, rank 0 in B) must fail its
    group all-reduce naming world rank 2 -- never a hang. Then rr.destroy(), timed: the
    world never saw the death, its groups did."""
    import os

    a = rr.new_group([1, 2, 3])
    b = rr.new_group([0, 2])
    if victim_after_the_others(rank, 2, range(world), "made"):
        os._exit(0)
    g = b if rank == 0 else a
    try:
        rr.allreduce(np.ones(4), group=g)
        msg = "no error"
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
    t = time.monotonic()
    rr.destroy()
    return {"error": msg, "destroy_secs": time.monotonic() - t}


def group_timeouts(rank: int, world: int) -> dict:
    """new_group(timeout=) on both APIs: the group's deadline, not the world's (default
    group 60 s), is what a collective that a member skipped waits for. Rank 1 skips one
    all-reduce of each group; the others time out, naming it."""
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    out: dict = {}
    tg = dist.new_group(list(range(world)), timeout=timedelta(seconds=2))
    ng = rr.new_group(list(range(world)), timeout=2.5)
    for name, run in (("torch", lambda: dist.all_reduce(torch.ones(4), group=tg)),
                      ("native", lambda: rr.allreduce(np.ones(4), group=ng))):
        # Start together: the first rank to time out tells the others (a relayed
        # CollectiveTimeout), so a rank that entered later would report a shorter wait.
        dist.barrier()
        if rank == 1:
            out[name] = "skipped"
            continue
        t0 = time.monotonic()
        try:
            run()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001
            out[name] = (type(e).__name__, round(time.monotonic() - t0, 1), "rank 1" in str(e))
    # Rank 1 stays until the others timed out (its exit would end their waits sooner).
    store = dist.distributed_c10d._get_default_store()
    if rank != 1:
        store.add("timed_out", 1)
    stay_until(store, "timed_out", world - 1, rank, world, 30)
    for bad in (0, -1, "soon"):
        try:
            rr.new_group([0], timeout=bad)
            out[f"bad {bad!r}"] = "accepted"
        except (TypeError, ValueError) as e:
            out[f"bad {bad!r}"] = type(e).__name__
    return out


def setup_timeout(rank: int, world: int, api: str) -> str:
    """new_group(timeout=) bounds the group's set-up too, as gloo's: the last rank never
    calls it (torch's dist.new_group, or rr.new_group); the others must give up after the
    group's 2 s, not RINGREDUCE_CONNECT_TIMEOUT (60 s here). Returns the error and how long
    new_group took ("skipped" on the last rank, which stays until the others are done)."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    out = "skipped"
    if rank != world - 1:
        t0 = time.monotonic()
        try:
            if api == "torch":
                dist.new_group(list(range(world)), timeout=timedelta(seconds=2))
            else:
                rr.new_group(list(range(world)), timeout=2.0)
            out = "no error"
        except Exception as e:  # noqa: BLE001
            out = f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
        store.add("done", 1)
    stay_until(store, "done", world - 1, rank, world)
    return out


def one_host_links(rank: int, world: int) -> dict:
    """Overlapping groups A = [0, 1, 2] and B = [1, 3] of 4 ranks on one host: what each
    group holds open (link_stats), their results, then world rank 1 is SIGKILLed while the
    others wait for it in their group's all-reduce: how soon each names it, and how."""
    import os
    import signal

    a = rr.new_group([0, 1, 2])
    b = rr.new_group([1, 3])
    mine = [g for g in (a, b) if g is not None]
    out: dict = {"fails": []}
    for g in mine:
        _check_group(g, g.ranks, out["fails"], f"group {g.ranks}")
        out[",".join(map(str, g.ranks))] = g.comm.link_stats()
    rr.barrier()
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    g = a if rank in (0, 2) else b
    t0 = time.monotonic()
    try:
        rr.allreduce(np.ones(4), group=g)
        out["error"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        out["peer_rank"] = getattr(e, "peer_rank", None)
    out["secs"] = time.monotonic() - t0
    return out


def shm_abort_reaches_members(rank: int, world: int) -> dict:
    """A group of 3 ranks on one host (no TCP connection between them) whose world rank 2
    was given a 1 s timeout, the others 60 s: rank 2 enters a broadcast at once and times
    out; ranks 0 and 1 enter 3 s later and must hear rank 2's reason at once, through its
    shared-memory control block -- not after their own 60 s."""
    g = rr.new_group([0, 1, 2], timeout=1.0 if rank == 2 else 60.0)
    x = np.arange(1000.0) if rank == 0 else np.zeros(1000)
    if rank != 2:
        time.sleep(3.0)
    t0 = time.monotonic()
    try:
        rr.broadcast(x, src=0, group=g)  # may complete without rank 2 (nothing to wait for)
        rr.barrier(group=g)
        out = "no error"
    except Exception as e:  # noqa: BLE001
        out = f"{type(e).__name__}: {e}"
    return {"error": out, "secs": time.monotonic() - t0,
            "links": g.comm.link_stats()["connections"]}


def groups_out_of_order(rank: int, world: int) -> str:
    """Rank 0 all-reduces on group [0, 1] and then on the world; rank 1 the other way round
    (rank 2, not in the group, joins the world's). Nothing can complete: each waits for
    the other on a different communicator. Each one's timeout must say where the other is
    blocked -- the other communicator's name and collective -- not only that it is idle."""
    g = rr.new_group([0, 1])
    order = [g, None] if rank == 0 else [None, g] if rank == 1 else [None]
    try:
        for grp in order:
            rr.allreduce(np.ones(16), group=grp)
        return "no error"
    except Exception as e:  # noqa: BLE001
        time.sleep(3)  # leave only after the other's timeout: else it reads "rank X left"
        return f"{type(e).__name__}: {e}"


def group_threads(rank: int, world: int) -> dict:
    """Threads of this process (/proc/self/task) with the world, with 4 more groups (and
    after an all-reduce on each, checked), and after destroy(): one process-wide heartbeat
    thread serves every communicator, so a group adds its executor thread only."""
    import os

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    with_world = threads()
    gs = [rr.new_group(list(range(world))) for _ in range(4)]
    for i, g in enumerate(gs):
        x = np.full(5, rank + i, dtype=np.float64)
        rr.allreduce(x, group=g)
        assert (x == sum(r + i for r in range(world))).all(), (i, x)
    with_groups = threads()
    rr.destroy()
    deadline = time.monotonic() + 5.0  # a joined thread's task entry may linger a moment
    while threads() > 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"with_world": with_world, "with_groups": with_groups, "after": threads()}


def dies_before_waits(rank: int, world: int, what: str, victim: int = 1) -> dict:
    """Rank `victim` is SIGKILLed (or SIGSTOPped: what="stop") after a barrier; the others
    then wait for it outside any collective: creating a group with it ("group"), a first
    message from it on a new tag ("recv"), a receive from any source ("any"). Each must
    raise PeerFailure naming it -- before, they waited until the connect timeout or
    RINGREDUCE_TIMEOUT, told to check WORLD_SIZE or their send/recv order; with rank 0
    (the store's host) the victim, they got torch's DistNetworkError or a RingReduceError."""
    import os
    import signal

    rr.barrier()
    if rank == victim:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGSTOP if what.endswith("stop") else signal.SIGKILL)
        time.sleep(60)
    t0 = time.monotonic()
    try:
        if what.startswith("group"):
            rr.new_group(list(range(world)))
        elif what.startswith("recv"):
            rr.recv(np.zeros(4), victim, tag=77)
        else:
            rr.recv(np.zeros(4), None, tag=78)
        return {"error": "no error", "secs": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "peer_rank": getattr(e, "peer_rank", None),
                "secs": time.monotonic() - t0}


def destroyed_with_work_queued(rank: int, world: int) -> dict:
    """2 ranks; rank 1 queues two all-reduces on a group rank 0 never calls, then destroys
    the group. The running one and the queued one must name the group and Group.destroy()
    -- before, the queued one said "communicator was destroyed; call ringreduce.init()
    again [... during barrier #0 ...]" (a stale description; only the group was gone)."""
    g = rr.new_group([0, 1])
    out: dict = {}
    if rank == 1:
        ws = [rr.allreduce(np.ones(1 << 20, np.float32), group=g, async_op=True)
              for _ in range(2)]
        time.sleep(0.3)
        g.destroy()
        for i, w in enumerate(ws):
            try:
                w.wait()
                out[f"w{i}"] = "no error"
            except rr.RingReduceError as e:
                out[f"w{i}"] = str(e)
        # torch's Work.exception() / is_success(): the same error, without raising
        out["exc"] = [type(w.exception()).__name__ for w in ws if not w.is_success()]
    rr.barrier()  # the world still works
    if rank == 0:
        time.sleep(0.5)
        g.destroy()
    return out


def late_group_member(rank: int, world: int) -> dict:
    """3 ranks; group [1, 2]; world rank 1 reaches the group's all-reduce 2.5 s late."""
    g = rr.new_group([1, 2])
    if g is None:
        return {"sum": None}
    if rank == 1:
        time.sleep(2.5)
    x = np.full(4, float(rank), np.float32)
    rr.allreduce(x, group=g)
    return {"sum": float(x[0])}


def interrupted_new_group(rank: int, world: int) -> str:
    """Rank 1 is interrupted (as by Ctrl-C) while it waits in new_group for rank 2, which
    comes 2 s late, and lives on. The others must stop at once, told why -- before, they
    waited for rank 1 until RINGREDUCE_CONNECT_TIMEOUT."""
    import _thread

    if rank == 2:
        time.sleep(2.0)
    if rank == 1:
        threading.Timer(0.5, _thread.interrupt_main).start()
    t0 = time.monotonic()
    try:
        rr.new_group(list(range(world)))
        return "no error"
    except KeyboardInterrupt:
        # Alive, as a program that catches Ctrl-C and goes on, until the others are done.
        await_flags([f"done{r}" for r in range(world) if r != rank], 12.0)
        return "interrupted"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
    finally:
        raise_flag(f"done{rank}")


def silent_strangers(rank: int, world: int) -> dict:
    """While a TCP group is set up (the last rank comes 2 s late), something opens 3
    connections to every rank's group listener and never says a word (a port scanner, a
    hung process). The members must connect past them: before, each got up to 5 s of the
    accept loop in turn, and the job failed with a false "rank 1 stopped responding"."""
    import socket

    from ringreduce import _state

    w = _state.current("test")
    prefix = f"{w.store_prefix}group{w.created + 1}/addr/"
    socks: list = []

    def stranger() -> None:
        deadline = time.monotonic() + 20
        for r in range(world):
            while not w.store.check([prefix + str(r)]) and time.monotonic() < deadline:
                time.sleep(0.01)
            if time.monotonic() < deadline:
                addr = w.store.get(prefix + str(r)).decode().partition("|")[0]  # less links
                host, port = addr.rsplit(":", 1)
                socks.extend(socket.create_connection((host.strip("[]"), int(port)))
                             for _ in range(3))

    t = threading.Thread(target=stranger, daemon=True)
    if rank == 0:
        t.start()
    if rank == world - 1:
        time.sleep(2.0)
    t0 = time.monotonic()
    g = rr.new_group(list(range(world)))
    took = time.monotonic() - t0
    x = _data(rank, 1000, np.float64)
    rr.allreduce(x, group=g)
    ok = bool(np.array_equal(x, sum(_data(r, 1000, np.float64) for r in range(world))))
    if rank == 0:
        t.join(1)
    for s in socks:
        s.close()
    return {"took": took, "ok": ok, "strangers": len(socks)}


def slow_setup_tail(rank: int, world: int) -> dict:
    """A one-host group whose last set-up step returns 2.5 s later on rank 1 than on the
    others (a slow store, a loaded host), with a 1.5 s heartbeat timeout. The others wait
    in the group's first all-reduce meanwhile; heartbeats used to start only after set-up,
    so they failed with "rank 1 stopped responding ... never heard from"."""
    from ringreduce import _rendezvous

    gather = _rendezvous.allgather

    def slow(store: Any, prefix: str, r: int, n: int, timeout: float, step: str,
             value: str) -> list:
        out = gather(store, prefix, r, n, timeout, step, value)
        if step == "unlinked" and r == 1:
            time.sleep(2.5)
        return out

    _rendezvous.allgather = slow
    try:
        t0 = time.monotonic()
        g = rr.new_group(list(range(world)))
        x = _data(rank, 100, np.float64)
        rr.allreduce(x, group=g)
    finally:
        _rendezvous.allgather = gather
    ok = bool(np.array_equal(x, sum(_data(r, 100, np.float64) for r in range(world))))
    return {"ok": ok, "took": time.monotonic() - t0}


def after_rank0_left(rank: int, world: int, what: str) -> dict:
    """Rank 0 (its process serves the store) calls destroy() and exits; the others, once the
    store is gone, create a group ("group") or a new point-to-point channel ("p2p"). Both
    must raise PeerFailure naming rank 0 as `left` -- before, group rank 0 got torch's raw
    DistNetworkError and the other "rank 0 exited or crashed" (found by a helper's audit)."""
    if rank == 0:
        rr.destroy()
        return {}
    store = rr.world_group().store
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # rank 0's destroy waits (5 s) for our goodbyes
        try:
            store.check(["nothing"])
        except RuntimeError:
            break
        time.sleep(0.1)
    t0 = time.monotonic()
    try:
        if what == "group":
            rr.new_group([1, 2])
        elif rank == 1:  # rr.send returns before the channel exists: its error is logged
            rr.isend(np.ones(4), 2, tag=5).wait()
        else:
            rr.recv(np.zeros(4), 1, tag=5)
        return {"error": "no error"}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "peer_rank": getattr(e, "peer_rank", None),
                "cause": getattr(e, "cause", None), "secs": time.monotonic() - t0}


def destroyed_under_a_thread(rank: int, world: int, rounds: int = 3) -> list:
    """Each member loops small all-reduces on a group in a thread; rank 0's main thread
    destroys the group. The others must hear at once that rank 0 left. Before, over shared
    memory, they mostly waited until the timeout: the destroy stopped a call of the thread
    that had not begun a collective, and took that for a failure already told (no goodbye;
    found by a helper)."""
    res = []
    for _ in range(rounds):
        g = rr.new_group(list(range(world)))
        out: dict = {}

        def work(g: Any = g, out: dict = out) -> None:
            t0 = time.monotonic()
            try:
                while True:
                    rr.allreduce(np.ones(10, np.float32), group=g)
            except (RuntimeError, rr.RingReduceError) as e:  # rank 0: its destroy; others: 0 left
                out.update(type=type(e).__name__, secs=time.monotonic() - t0,
                           peer_rank=getattr(e, "peer_rank", None), msg=str(e)[:300])

        th = threading.Thread(target=work, daemon=True)
        th.start()
        time.sleep(0.5)
        if rank == 0:
            g.destroy()
        th.join(20)
        res.append(out or {"type": "still blocked after 20 s"})
        g.destroy()
        rr.barrier()  # the world is untouched
    return res


def root_mismatch(rank: int, world: int) -> str | None:
    """Group [1, 2, 3] of 4 ranks: world rank 1 broadcasts from itself, 2 and 3 from world
    rank 2. The error must name the roots as world ranks (it printed group ranks 0 and 1)."""
    g = rr.new_group([1, 2, 3], timeout=20)
    if g is None:
        return None
    try:
        rr.broadcast(np.full(8, float(rank)), src=1 if rank == 1 else 2, group=g)
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _native_threads() -> int:
    import os

    return len(os.listdir("/proc/self/task"))


def destroy_after_early_send(rank: int, world: int, rounds: int = 4) -> dict:
    """Rank 0 sends (eagerly: the call returns before the channel exists) on a new group and
    destroys the group at once; rank 1 receives late. Before, the channel made after the
    destroy stayed open on rank 0 (two communicators, their threads and descriptors) until
    rr.destroy(). Returns what rank 1 received and rank 0's thread counts and live groups."""
    got, threads = [], []
    for i in range(rounds):
        g = rr.new_group([0, 1])
        if rank == 0:
            rr.send(np.full(10, float(i + 1)), dst=1, tag=1, group=g)
        else:
            time.sleep(0.3)
            y = np.zeros(10)
            rr.recv(y, src=0, tag=1, group=g)
            got.append(y.tolist())
        g.destroy()
        rr.barrier()
        # A helper thread (the p2p connect of a blocking call) is gone a moment after it
        # said it was done: each round's count is the least seen while they settle (at
        # most 2 s, less once it is down to the rounds before). A leak keeps it higher.
        least, t0 = _native_threads(), time.monotonic()
        while time.monotonic() - t0 < (2.0 if threads else 0.5) and \
                not (threads and least <= min(threads)):
            time.sleep(0.05)
            least = min(least, _native_threads())
        threads.append(least)
    live = [c.name for c in rr.world_group().children]
    return {"got": got, "threads": threads, "live": live}


def p2p_group_timeout(rank: int, world: int, case: str) -> dict | None:
    """new_group([0, 1], timeout=2) in a world whose RINGREDUCE_TIMEOUT is 60: rank 0
    receives on the group from a live rank 1 that sends nothing (`case`: the tag's first
    message, one after an earlier message made the channel, or from any source). Before, the
    group's timeout was ignored: rank 0 waited for the world's."""
    g = rr.new_group([0, 1], timeout=2)
    if case == "made":
        if rank == 0:
            rr.recv(np.zeros(3), src=1, group=g)
        else:
            rr.send(np.ones(3), dst=0, group=g)
    out = None
    if rank == 0:
        t0 = time.monotonic()
        try:
            rr.recv(np.zeros(3), src=None if case == "any" else 1, group=g)
            out = {"error": "returned"}
        except Exception as e:  # noqa: BLE001
            out = {"error": f"{type(e).__name__}: {e}", "secs": time.monotonic() - t0}
    rr.barrier()  # rank 1 waits here, alive, until rank 0 gave up
    return out
