"""Rank functions for tests/test_faults.py: loop over one collective with rank-dependent
inputs (every result checked against numpy) while RINGREDUCE_FAULT makes one rank kill,
stop, exit or hang itself at a chosen point; report what each survivor raised and when."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
from _spawn import await_flags, raise_flag, victim_after_the_others

import ringreduce as rr


def _inputs(rank: int, world: int, it: int, n: int) -> list[np.ndarray]:
    return [((np.arange(n, dtype=np.int64) * (r + 3) + it * 7 + r) % 1000).astype(np.float32)
            for r in range(world)]


def _one(collective: str, rank: int, world: int, it: int, n: int, algo: str) -> bool:
    """Run one collective; True when the result is right."""
    xs = _inputs(rank, world, it, n)
    x = xs[rank].copy()
    if collective == "allreduce":
        rr.allreduce(x, algo=algo)
        return bool(np.array_equal(x, np.sum(xs, axis=0, dtype=np.float32)))
    if collective == "broadcast":
        root = it % world
        rr.broadcast(x, src=root)
        return bool(np.array_equal(x, xs[root]))
    if collective == "allgather":
        out = rr.allgather(x)
        return bool(np.array_equal(out, np.stack(xs)))
    if collective == "reduce_scatter":
        k = n // world
        out = rr.reduce_scatter(x[:k * world])
        full = np.sum([a[:k * world] for a in xs], axis=0, dtype=np.float32)
        return bool(np.array_equal(out, full[rank * k:(rank + 1) * k]))
    if collective == "barrier":
        rr.barrier()
        return True
    root = it % world
    if collective == "reduce":
        rr.reduce(x, dst=root)
        return rank != root or bool(np.array_equal(x, np.sum(xs, axis=0, dtype=np.float32)))
    if collective == "gather":
        out = rr.gather(x, dst=root)
        return rank != root or bool(np.array_equal(out, np.stack(xs)))
    if collective == "scatter":
        k = n // world
        out = np.empty(k, np.float32)
        rr.scatter(out, src=root, x=xs[root][:k * world] if rank == root else None)
        return bool(np.array_equal(out, xs[root][rank * k:(rank + 1) * k]))
    if collective == "all_to_all":
        k = n // world
        out = rr.all_to_all(x[:k * world])
        return bool(np.array_equal(out, np.concatenate([a[rank * k:(rank + 1) * k] for a in xs])))
    raise ValueError(collective)


def fault_loop(rank: int, world: int, collective: str, n: int, algo: str,
               limit_s: float = 40.0) -> dict:
    """Loop until the injected fault surfaces as an exception (or limit_s passes)."""
    wrong = it = 0
    t_end = time.time() + limit_s
    while time.time() < t_end:
        it += 1
        try:
            if not _one(collective, rank, world, it, n, algo):
                wrong += 1
        except rr.RingReduceError as e:
            out = {"type": type(e).__name__, "msg": str(e), "t_err": time.time(),
                   "peer_rank": getattr(e, "peer_rank", None),
                   "waiting_for": getattr(e, "waiting_for", None),
                   "cause": getattr(e, "cause", None),
                   "relayed_by": getattr(e, "relayed_by", None), "iters": it, "wrong": wrong}
            try:
                rr.barrier()
                out["after"] = None
            except rr.RingReduceError as e2:
                out["after"] = str(e2)
            t0 = time.monotonic()
            rr.destroy()
            out["destroy_s"] = time.monotonic() - t0
            return out
    return {"type": None, "msg": "", "t_err": time.time(), "iters": it, "wrong": wrong}


def net_loop(rank: int, world: int, n: int, seconds: float, ready: str) -> dict:
    """Checked all-reduces while the test cuts or throttles links: touches `ready`.<rank>
    once the first all-reduce is through; the test touches `ready`.event once its link
    change is in place, and the ranks stop together `seconds` after that (or 60 s after
    starting). Counts the iterations run after the event."""
    x = np.ones(n, np.float32)
    rr.allreduce(x)
    with open(f"{ready}.{rank}", "w"):
        pass
    wrong = it = after = 0
    t_event = None
    give_up = time.monotonic() + 60
    try:
        while True:
            it += 1
            if not _one("allreduce", rank, world, it, n, "auto"):
                wrong += 1
            if t_event is None and os.path.exists(f"{ready}.event"):
                t_event = time.monotonic()
            elif t_event is not None:
                after += 1
            if it % 5 == 0:
                now = time.monotonic()
                stop = np.array([now > give_up or (t_event is not None and now > t_event + seconds)],
                                np.int32)
                rr.allreduce(stop, op="max")
                if stop[0]:
                    return {"type": None, "msg": "", "iters": it, "after_event": after,
                            "wrong": wrong}
    except rr.RingReduceError as e:
        return {"type": type(e).__name__, "msg": str(e), "t_err": time.time(), "iters": it,
                "wrong": wrong}


def init_outcome(rank: int, world: int, behave: dict) -> dict:
    """rr.init() with one rank misbehaving (behave maps str(rank) to "absent": never calls
    init; "store_then_die": hosts the store, then exits before publishing anything;
    "interrupted": Ctrl-C 1 s into init).
    Returns what init raised and how long it took."""
    import os

    action = behave.get(str(rank), "init")
    if action == "absent":
        time.sleep(300)
    if action.startswith("late:"):  # calls init this many seconds late
        time.sleep(float(action[5:]))
    if action.startswith("die:"):  # dies this many seconds into init (after publishing)
        import threading

        threading.Timer(float(action[4:]), os._exit, (3,)).start()
    if action == "interrupted":
        import signal
        import threading

        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    if action == "store_then_die":
        from ringreduce import _rendezvous

        _rendezvous.make_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank,
                               world, 30.0, False)
        time.sleep(1.5)
        os._exit(3)
    t0 = time.time()
    try:
        rr.init()
    except KeyboardInterrupt:
        return {"type": "KeyboardInterrupt", "msg": "", "elapsed": time.time() - t0,
                "is_rr": False}
    except Exception as e:  # noqa: BLE001 - ValueError or a ringreduce error, both reported
        return {"type": type(e).__name__, "msg": str(e), "elapsed": time.time() - t0,
                "t0": t0, "is_rr": isinstance(e, rr.RingReduceError),
                "peer_rank": getattr(e, "peer_rank", None),
                "waiting_for": getattr(e, "waiting_for", None)}
    rr.destroy()
    return {"type": None, "msg": "", "elapsed": time.time() - t0, "is_rr": False}


def late_rank(rank: int, world: int, late: int, sleep_s: float, at: int = 6) -> dict:
    """Rank `late` spends sleep_s in "user code" before its `at`-th all-reduce; everyone's
    results are checked (the others wait, log a stall report, and succeed)."""
    wrong = 0
    for it in range(1, 9):
        if rank == late and it == at:
            time.sleep(sleep_s)
        if not _one("allreduce", rank, world, it, 1000, "auto"):
            wrong += 1
    return {"wrong": wrong}


def aborter(rank: int, world: int, delay_s: float, on: str = "world") -> dict:
    """The last rank never joins the second all-reduce; rank 0 calls rr.abort() from a
    watchdog thread after delay_s. Everyone reports what they raised and when.
    on: where the blocked call runs -- "world", "group" (a group of every rank), or "p2p"
    (rank 0 waits in a recv from the last rank on an established channel; rank 1 idles)."""
    import threading

    x = np.ones(1000, np.float32)
    rr.allreduce(x)
    g = rr.new_group(list(range(world))) if on == "group" else None
    last = world - 1
    if on == "p2p" and rank in (0, last):  # make the channel
        rr.send(x, 0, tag=3) if rank == last else rr.recv(x, last, tag=3)

    def blocking_call() -> None:
        if on == "p2p":
            rr.send(x, 0, tag=3) if rank == last else rr.recv(x, last, tag=3)
        else:
            rr.allreduce(x, algo="ring", group=g)

    if on == "p2p" and rank not in (0, last):
        return {"type": None}
    if rank == last:
        time.sleep(delay_s + 2)  # "stuck in user code"; the others give up meanwhile
        t0 = time.time()
        try:
            blocking_call()
        except rr.RingReduceError as e:
            return {"type": type(e).__name__, "msg": str(e), "t": time.time(), "t0": t0}
        return {"type": None}
    if rank == 0:
        threading.Timer(delay_s, rr.abort).start()
    t0 = time.time()
    try:
        blocking_call()
    except rr.RingReduceError as e:
        out = {"type": type(e).__name__, "msg": str(e), "t": time.time(), "t0": t0}
    else:
        out = {"type": None}
    if rank == 0:  # what the abort did not reach yet: a new tag's channel, a new group
        out["after"] = []
        for call in (lambda: rr.send(x, last, tag=11), lambda: rr.new_group([0, last])):
            try:
                call()
                out["after"].append("no error")
            except rr.RingReduceError as e:
                out["after"].append(str(e))
    t1 = time.monotonic()
    rr.destroy()
    out["destroy_s"] = time.monotonic() - t1
    return out


def backend_fault_loop(rank: int, world: int, limit_s: float = 30.0) -> dict:
    """Stock torch.distributed code on the "ringreduce" backend while RINGREDUCE_FAULT hits
    a rank: survivors must get an exception from dist.all_reduce, not a hang."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    t = torch.ones(4096)
    t_end = time.time() + limit_s
    it = 0
    try:
        while time.time() < t_end:
            it += 1
            t.fill_(float(rank))
            dist.all_reduce(t)
            if not bool((t == world * (world - 1) / 2).all()):
                return {"type": "wrong result", "msg": "", "iters": it}
    except Exception as e:  # noqa: BLE001 - whatever torch passes up is what users see
        return {"type": type(e).__name__, "msg": str(e), "t_err": time.time(), "iters": it,
                "is_rr": isinstance(e, rr.RingReduceError)}
    return {"type": None, "msg": "", "iters": it}


def destroyer(rank: int, world: int, delay_s: float, transport_bytes: int) -> dict:
    """Rank 0 runs synchronous all-reduces on a second thread and calls rr.destroy() from its
    main thread while that thread is blocked inside one (the last rank arrives late): the
    blocked call must fail with a clear error, nothing may be freed under it (no crash; run
    under AddressSanitizer by test_destroy_under_asan), destroy() must return promptly."""
    import threading

    n = transport_bytes // 4
    x = np.ones(n, np.float32)
    rr.allreduce(x)
    if rank == world - 1:
        time.sleep(delay_s + 2)  # late: the others block in their second all-reduce
        try:
            rr.allreduce(x)
        except rr.RingReduceError as e:
            return {"type": type(e).__name__, "msg": str(e)}
        return {"type": None}
    if rank != 0:
        try:
            rr.allreduce(x)
        except rr.RingReduceError as e:
            return {"type": type(e).__name__, "msg": str(e)}
        return {"type": None}
    box: dict = {}
    started = threading.Event()

    def collective() -> None:
        started.set()
        try:
            rr.allreduce(x)
            box["type"] = None
        except Exception as e:  # noqa: BLE001 - the test checks what it was
            box.update(type=type(e).__name__, msg=str(e), t=time.monotonic())

    t = threading.Thread(target=collective)
    t.start()
    started.wait()
    time.sleep(delay_s)
    t0 = time.monotonic()
    rr.destroy()
    box["destroy_s"] = time.monotonic() - t0
    t.join(10)
    box["joined"] = not t.is_alive()
    if "t" in box:
        box["raised_after_s"] = box.pop("t") - t0
    box["module"] = rr._C.__file__
    try:
        rr.allreduce(x)
        box["after"] = None
    except Exception as e:  # noqa: BLE001
        box["after"] = f"{type(e).__name__}: {e}"
    return box


def abort_mid_frame(rank: int, world: int, nbytes: int, at: float) -> dict:
    """Rank 1 broadcasts `nbytes` to rank 0 over a slow link and calls rr.abort() from a
    watchdog thread `at` s in, while a frame is half sent; rank 0 reports what it heard."""
    import threading

    x = np.zeros(nbytes // 4, np.float32)
    rr.barrier()
    if rank == 1:
        threading.Timer(at, rr.abort).start()
    try:
        rr.broadcast(x, src=1)
        return {"type": None, "msg": ""}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"type": type(e).__name__, "msg": str(e), "cause": getattr(e, "cause", None)}


def leaver_loop(rank: int, world: int, victim: int, collective: str, algo: str) -> dict:
    """Rank `victim` raises (its exit hook says goodbye: a rank that *left*) after a few
    collectives; the others loop until they fail and say whom they blame."""
    if rank == victim:
        for it in range(1, 4):
            _one(collective, rank, world, it, 3000, algo)
        raise RuntimeError("the victim's program failed")
    return fault_loop(rank, world, collective, 3000, algo, limit_s=30.0)


def sender_to_leaver(rank: int, world: int, nbytes: int) -> dict:
    """Rank 1 calls destroy() (its goodbye) and lives on; rank 0 then broadcasts to it: the
    send fails (EPIPE) with the goodbye still unread -- it was named "closed ... probably
    exited or crashed", not a rank that left (the race behind a flaky leaver_loop run)."""
    rr.barrier()
    if rank == 1:
        rr.destroy()
        time.sleep(2.0)
        return {"type": None}
    time.sleep(0.5)
    try:
        rr.broadcast(np.ones(nbytes // 4, np.float32), src=0)
        return {"type": None}
    except rr.RingReduceError as e:
        return {"type": type(e).__name__, "msg": str(e), "peer_rank": e.peer_rank,
                "cause": e.cause}


def left_before_the_collective(rank: int, world: int, late_s: float) -> dict:
    """The last rank calls destroy() (its goodbye) and lives on; rank 0 reaches the next
    all-reduce late_s later, the others at once. That all-reduce can never complete: the
    others were told only once they waited for the leaver itself -- after rank 0 came, or
    at the timeout blaming rank 0 (found by a helper)."""
    rr.barrier()
    if rank == world - 1:
        rr.destroy()
        time.sleep(late_s + 2.0)
        return {"type": None}
    time.sleep(0.3)
    if rank == 0:
        time.sleep(late_s)
    t0 = time.monotonic()
    try:
        rr.allreduce(np.ones(1024, np.float32))
        return {"type": None}
    except rr.RingReduceError as e:
        return {"type": type(e).__name__, "msg": str(e), "peer_rank": e.peer_rank,
                "cause": e.cause, "secs": time.monotonic() - t0}


def any_source_after_a_sender_left(rank: int, world: int) -> object:
    """Channels 1->0 and 2->0 on tag 3 exist; rank 2 leaves (destroy()), rank 1 sends 2 s
    later: rank 0's receive from any rank gets rank 1's message. Over TCP the goodbye made
    rank 2's channel look like a waiting message, and the receive failed at once naming
    rank 2 -- rank 1's message was never read (found by a helper)."""
    x = np.ones(16, np.float32)
    if rank == 0:
        rr.recv(x, 1, tag=3)
        rr.recv(x, 2, tag=3)
    else:
        rr.send(x, 0, tag=3)
    rr.barrier()
    if rank == 2:
        return "left"  # the harness's destroy() says goodbye
    if rank == 1:
        time.sleep(2.0)
        rr.send(np.full(16, 7, np.float32), 0, tag=3)
        return "sent"
    time.sleep(0.5)
    y = np.zeros(16, np.float32)
    src = rr.recv(y, None, tag=3)
    return [src, float(y[0]), bool(np.all(y == 7))]


def idle_aborter(rank: int, world: int, on: str, hold_s: float = 8.0) -> dict:
    """Rank 0 calls rr.abort() between calls and then stays alive (a watchdog that aborts,
    then cleans up) until the others are done, at most hold_s; the others are blocked on it
    in an all-reduce (on the world or a group) or a recv, or come later. Before, an idle
    rank's abort reached nobody: they waited until rank 0 exited (or RINGREDUCE_TIMEOUT)."""
    try:
        return _idle_aborter(rank, world, on, hold_s)
    finally:
        raise_flag(f"done{rank}")


def _idle_aborter(rank: int, world: int, on: str, hold_s: float) -> dict:
    g = rr.new_group(list(range(world))) if on == "group" else None
    x = np.ones(64)
    if on == "recv" and rank in (0, 1):  # the channel exists before the abort
        rr.send(x, 1, tag=5) if rank == 0 else rr.recv(x, 0, tag=5)
    rr.barrier()
    if rank == 0:
        time.sleep(1.0)
        rr.abort()
        await_flags([f"done{r}" for r in range(1, world)], hold_s)
        rr.destroy()
        return {"type": None}
    if on == "late":
        time.sleep(2.0)
    t0 = time.monotonic()
    try:
        if on == "recv":
            if rank == 1:
                rr.recv(x, 0, tag=5)
            else:
                return {"type": None}
        else:
            rr.allreduce(x, group=g)
        out = {"type": None, "secs": time.monotonic() - t0}
    except rr.RingReduceError as e:
        out = _failure(e, t0)
    rr.destroy()
    return out


def _failure(e: Exception, t0: float) -> dict:
    """What a survivor raised, and how long after t0 (its fields where it has them)."""
    return {"type": type(e).__name__, "msg": str(e), "secs": time.monotonic() - t0,
            "peer_rank": getattr(e, "peer_rank", None), "cause": getattr(e, "cause", None),
            "relayed_by": getattr(e, "relayed_by", None)}


def killed_between_collectives(rank: int, world: int, on: str, idle_s: float) -> dict:
    """The last rank kills itself (SIGKILL) between collectives; the others start the next
    one after idle_s, longer than RINGREDUCE_HEARTBEAT_TIMEOUT. Found by a helper: over
    shared memory the survivors called it frozen ("no heartbeat for ...", cause "silent"),
    as the heartbeats were read before the connection that says it is gone."""
    g = rr.new_group(list(range(world))) if on == "group" else None
    x = np.full(64, rank + 1.0)
    rr.allreduce(x, group=g)
    if victim_after_the_others(rank, world - 1, range(world), "first"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(idle_s)
    t0 = time.monotonic()
    try:
        rr.allreduce(x, group=g)
        return {"type": None}
    except rr.RingReduceError as e:
        return _failure(e, t0)


def killed_with_a_forked_child(rank: int, world: int, child_s: float) -> dict:
    """The last rank forks a child that outlives it by child_s (a DataLoader worker notices
    its parent's death only at its next 5 s check), then kills itself (SIGKILL) while the
    others wait in a collective. The child held copies of the rank's sockets, so no FIN
    left the host and the others named the rank only after the heartbeat timeout, as
    `silent`; a forked child now holds /dev/null in their place."""
    x = np.full(64, rank + 1.0)
    rr.allreduce(x)
    if victim_after_the_others(rank, world - 1, range(world), "first"):
        if os.fork() == 0:
            time.sleep(child_s)
            os._exit(0)
        time.sleep(0.3)  # the others are inside the collective below
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        rr.allreduce(x)
        return {"type": None}
    except rr.RingReduceError as e:
        return _failure(e, t0)


def a_replacement_rank_on_the_same_port(rank: int, world: int, port: int) -> dict:
    """Ranks 0..world-2 make a world on `port` and destroy it (rank 0's store server goes);
    then every rank, the last one new (a dead rank's replacement), inits on the same port.
    The survivors counted an earlier init on that address and the new rank none: different
    key prefixes, and all waited out the connect timeout, blaming each other (found by a
    helper; gloo runs it). The server made again has another instance id now."""
    if rank < world - 1:
        rr.init(rank, world - 1, master_addr="127.0.0.1", master_port=port)
        rr.allreduce(np.ones(4))
        rr.destroy()
    else:
        time.sleep(1.0)  # the replacement comes after the old world is gone
    rr.init(rank, world, master_addr="127.0.0.1", master_port=port)
    x = np.full(4, rank + 1.0)
    rr.allreduce(x)
    rr.destroy()
    return {"x": x.tolist()}


def lost_outside_the_group(rank: int, world: int, on: str) -> dict:
    """Rank 1 is killed. Rank 2 loses it on a p2p channel or group without rank 0, fails
    and leaves; rank 0, waiting for rank 2 on a channel or group without rank 1, names rank
    1 (relayed by 2). Before, it named rank 2: a goodbye could name only a rank of the
    communicator it was said on (found again by a helper)."""
    x = np.zeros(1000, np.float32)
    g12 = rr.new_group([1, 2]) if on == "group" else None
    g02 = rr.new_group([0, 2]) if on == "group" else None

    def step() -> None:
        if on == "p2p":
            if rank == 1:
                rr.send(x, dst=2, tag=3)
            if rank == 2:
                rr.recv(x, src=1, tag=3)
                rr.send(x, dst=0, tag=3)
            if rank == 0:
                rr.recv(x, src=2, tag=3)
        else:
            if rank in (1, 2):
                rr.allreduce(x, group=g12)
            if rank in (0, 2):
                rr.allreduce(x, group=g02)

    step()  # every channel and group has carried a message
    rr.barrier()
    if rank == 1:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        step()
        return {"type": None}
    except rr.PeerFailure as e:
        return _failure(e, t0)


def destroy_after_a_dead_sender(rank: int, world: int) -> dict:
    """Rank 1 exits before its first send; rank 0's recv names it, then destroy() must not
    wait for rank 1's goodbye in the store's farewell (it waited the 5 s cap: the world had
    found it gone in the recv's set-up, but nothing told the farewell; found by a helper)."""
    if rank == 1:
        time.sleep(1.0)
        os._exit(3)
    try:
        rr.recv(np.zeros(3), src=1)
        got = None
    except rr.PeerFailure as e:
        got = [e.peer_rank, e.cause]
    t0 = time.monotonic()
    rr.destroy()
    return {"recv": got, "destroy_s": time.monotonic() - t0}


def _victim_ready(pid_dir: str) -> None:
    """The victim of a RINGREDUCE_FAULT action=stop: leave its pid for _wake_victim."""
    with open(os.path.join(pid_dir, "victim"), "w") as f:
        f.write(str(os.getpid()))
    raise_flag("victim-ready")


def _wake_victim(pid_dir: str) -> None:
    with open(os.path.join(pid_dir, "victim")) as f:
        os.kill(int(f.read()), signal.SIGCONT)


def finished_then_failed(rank: int, world: int, victim: int, pid_dir: str) -> dict:
    """The victim, a tree leaf, stops itself (RINGREDUCE_FAULT at=mid, action=stop) in its
    first all-reduce, waiting for the result; the others complete it (its result is sent to
    it), then fail the next one on a count mismatch, which sends every peer an abort; the
    lowest of them wakes the victim a second later. Its result and another rank's abort then
    wait together: the all-reduce completed everywhere, so it must return the right sum and
    only the next call fail. Before, over TCP, the abort was read first and failed the
    completed all-reduce (found by the project's CI in a test that polls async work)."""
    x = np.full(16, rank + 1.0)
    if rank == victim:
        _victim_ready(pid_dir)
        out: dict = {}
        try:
            rr.allreduce(x, algo="tree")
            out["first"] = float(x[0])
        except rr.RingReduceError as e:
            out["first"] = f"{type(e).__name__}: {e}"
        try:
            rr.allreduce(np.ones(4), algo="tree")
            out["next"] = "no error"
        except rr.RingReduceError as e:
            out["next"] = type(e).__name__
        raise_flag("victim-done")
        return out
    await_flags(["victim-ready"], 30)
    time.sleep(0.5)  # the victim waits (and stops) first
    rr.allreduce(x, algo="tree")
    out = {"first": float(x[0])}
    try:
        rr.allreduce(np.ones(4 + rank), algo="tree")  # the counts differ: every rank fails
        out["next"] = "no error"
    except rr.RingReduceError as e:
        out["next"] = type(e).__name__
    if rank == min(r for r in range(world) if r != victim):
        time.sleep(1.0)  # the abort frames are out by now
        _wake_victim(pid_dir)
    await_flags(["victim-done"], 30)  # connections stay open while the victim reads
    return out


def finished_then_left(rank: int, world: int, victim: int, pid_dir: str) -> dict:
    """The victim stops itself (RINGREDUCE_FAULT at=mid, action=stop) in the first barrier,
    right after finding its peers' part not there yet and before it asks whether they are
    alive; the others then arrive, complete the barrier (the victim's part was there) and
    leave (destroy(), its goodbye first), and the lowest of them wakes the victim (SIGCONT)
    a second later. The victim's barrier completed everywhere: it must return, and only
    its next call fail, naming a rank that left. Before, the barrier itself raised "rank N
    left the job" (found under a loaded parallel test run)."""
    import threading

    if rank == victim:
        _victim_ready(pid_dir)
        try:
            rr.barrier()
            out = {"barrier": "ok"}
        except rr.RingReduceError as e:
            return {"barrier": f"{type(e).__name__}: {e}"}
        try:
            rr.allreduce(np.ones(8))
            out["next"] = "no error"
        except rr.RingReduceError as e:
            out["next"] = _failure(e, time.monotonic())
        return out
    await_flags(["victim-ready"], 30)
    time.sleep(0.5)  # the victim waits (and stops) first
    rr.barrier()
    done = threading.Thread(target=rr.destroy)  # its store farewell waits for the victim
    done.start()
    if rank == min(r for r in range(world) if r != victim):
        time.sleep(1.0)  # every other rank's goodbye is out by now
        _wake_victim(pid_dir)
    done.join()
    return {"barrier": "ok"}


def inits_racing(rank: int, world: int) -> dict:
    """Two threads call init() at once: one makes the world, the other is told it exists
    (both made one, and ranks could pick different ones; found by a helper)."""
    import threading

    errors: list = []

    def one() -> None:
        try:
            rr.init()
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    x = np.full(3, float(rank + 1), np.float32)
    rr.allreduce(x)
    rr.destroy()
    return {"errors": errors, "sum": x.tolist()}


def inits_differ_before(rank: int, world: int, first_port: int, port: int) -> list:
    """Ranks 0 and 1 make a 2-rank world on `first_port` first; then all ranks make one on
    `port`, a fresh store: their key prefixes must agree though their earlier inits differ
    (they counted inits per process and waited out the connect timeout; found by a
    helper)."""
    if rank < 2:
        rr.init(rank, 2, master_addr="127.0.0.1", master_port=first_port)
        rr.barrier()
        rr.destroy()
        raise_flag(f"first{rank}")
    else:  # the connect timeout counts from here, not from the others' first world
        await_flags(["first0", "first1"], 30)
    rr.init(rank, world, master_addr="127.0.0.1", master_port=port)
    x = np.full(3, float(rank + 1), np.float32)
    rr.allreduce(x)
    rr.destroy()
    return x.tolist()


def interrupted(rank: int, world: int, mode: str) -> dict:
    """2 ranks. Rank 0 gets SIGINT (Ctrl-C) 1 s into an all-reduce that rank 1 joins only
    6 s later. Before, Python's KeyboardInterrupt waited until the collective ended (here at
    6 s; with a peer stuck in user code, RINGREDUCE_TIMEOUT). mode "sync": rr.allreduce is
    interrupted, its communicator fails and rank 1 is told why. "async": the Work's wait()
    is interrupted, the collective goes on: a second wait() gets its result. "custom": the
    program has a signal handler of its own (it could re-enter ringreduce), so handlers run
    only once the collective returned, as before. "dataloader": as "sync", after a
    DataLoader with a worker ran (torch's SIGCHLD handler, installed then, kept handlers
    from running inside collectives)."""
    import threading

    if mode == "custom":
        signal.signal(signal.SIGUSR1, lambda *_: None)
    if mode == "dataloader":
        from torch.utils.data import DataLoader

        assert [int(b) for b in DataLoader(list(range(4)), num_workers=1)] == [0, 1, 2, 3]

    x = np.full(1000, rank + 1, np.float32)
    rr.allreduce(x)  # connected; x = 3
    if rank == 1:
        time.sleep(6)
        try:
            rr.allreduce(x)  # x = 6 (rank 0 had sent its part before the signal)
            rr.allreduce(x)
            return {"error": "no error", "x": float(x[0])}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}", "peer_rank": getattr(e, "peer_rank", None)}
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    out: dict = {"error": "no error"}
    w = None
    try:
        if mode == "async":
            w = rr.allreduce(x, async_op=True)
            time.sleep(0.3)  # started in the background (an unstarted one runs in wait())
            w.wait()
        else:
            rr.allreduce(x)
            if mode == "custom":
                time.sleep(1)  # KeyboardInterrupt: Python runs the handler after the call
    except KeyboardInterrupt as e:
        out = {"error": "KeyboardInterrupt", "notes": getattr(e, "__notes__", [])}
    out["secs"] = time.monotonic() - t0
    if w is not None:
        w.wait()  # rank 1 joins: the collective completes
        out["x"] = float(x[0])
        rr.allreduce(x)  # the communicator still works: x = 6 + 6 on rank 1's second call
        out["x2"] = float(x[0])
    elif mode == "custom":
        out["x"] = float(x[0])
        rr.allreduce(x)
    else:
        time.sleep(4)  # keep the store up while rank 1 finds out
    return out
