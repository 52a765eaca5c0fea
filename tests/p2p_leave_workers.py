"""Rank-side code of tests/test_p2p.py for ranks that leave or die: what the others are
told (every survivor names the rank that left, and why)."""

from __future__ import annotations

import os
import time

import numpy as np
from _spawn import await_flags, raise_flag

import ringreduce as rr

BIG = 1 << 20  # float32 elements: 4 MiB, more than a socket buffer holds


def sender_leaves(rank: int, world: int) -> str:
    """Rank 0 exchanges one message each way, then leaves (destroy()) without sending the
    second one rank 1 waits for: rank 1's error says it waited in a recv, on which channel."""
    x = np.ones(4)
    if rank == 0:
        rr.send(x, 1)
        rr.recv(x, 1)
        return "left"
    rr.recv(x, 0)
    rr.send(x, 0)
    try:
        rr.recv(x, 0)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def sender_left_before_a_new_tag(rank: int, world: int) -> str:
    """Rank 0 leaves (destroy()) after one message on tag 0; rank 1 then receives on tag 7,
    whose channel rank 0 never makes: a PeerFailure saying it left, at once (the channel's
    rendezvous waited RINGREDUCE_CONNECT_TIMEOUT, 120 s, then blamed WORLD_SIZE)."""
    import time

    x = np.ones(4)
    if rank == 0:
        rr.send(x, 1)
        return "left"
    rr.recv(x, 0)
    time.sleep(1.0)  # rank 0 is gone by now
    t0 = time.monotonic()
    try:
        rr.recv(x, 0, tag=7)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
    return "no error"


def ring_death(rank: int, world: int) -> dict:
    """An isend/irecv ring; world rank 1 exits at iteration 20. Each survivor destroys as
    soon as its own call fails (as a program that ends on the exception does): ranks whose
    neighbour failed because of rank 1 learn why that neighbour left, naming rank 1 too."""
    import os

    x = np.full(64, float(rank), np.float32)
    y = np.zeros_like(x)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    try:
        for i in range(100000):
            if rank == 1 and i == 20:
                os._exit(0)
            a, b = rr.isend(x, dst=nxt), rr.irecv(y, src=prv)
            a.wait()
            b.wait()
            if y[0] != prv:
                return {"error": f"wrong data {y[0]} from {prv} at {i}"}
        msg = "no error"
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
    rr.destroy()
    return {"error": msg}


def left_while_connecting(rank: int, world: int, leaver: int) -> str:
    """Rank `leaver` posts an irecv and the other rank a send: both publish their channel's
    addresses; the leaver destroys while rank 1 (slowed down) has not dialed rank 0 yet.
    Before, the other rank waited RINGREDUCE_CONNECT_TIMEOUT: rank 1 retrying its connect to
    rank 0's closed listener, or rank 0 accepting a dial that never came. Now rank 1 takes
    the refusal as final (every rank listens before it publishes its address) and rank 0's
    wait asks the world, which knows rank 1 left."""
    import time

    from ringreduce import _comm

    if rank == 1:
        plan = _comm.shm_options  # runs after the address exchange, before the dial

        def slowly(*a: object, **k: object) -> dict:
            raise_flag("exchanged")  # addresses exchanged: a leaving rank 0 may go now
            time.sleep(1.5)
            return plan(*a, **k)

        _comm.shm_options = slowly
    if rank == leaver:
        rr.irecv(np.zeros(1 << 20, np.float32), 1 - rank)
        # Rank 0 leaves once rank 1 has its address (not after a fixed time: a rank 1 that
        # got there later would learn of the departure from the world, not by a refusal).
        if rank == 0:
            await_flags(["exchanged"], 30)
        time.sleep(0.1 if rank == 0 else 0.5)
        return "left"
    t0 = time.monotonic()
    try:
        rr.send(np.zeros(1 << 20, np.float32), 1 - rank)  # 4 MiB: not an early-returning send
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} after {time.monotonic() - t0:.1f} s: {e}"
    return "no error"


def left_with_a_call_in_flight(rank: int, world: int) -> dict:
    """3 ranks. Rank 1 exits once its channel from rank 0 carried a message. Rank 0 posts an
    irecv from rank 2 that rank 2 leaves unmatched, then its send to the dead rank 1 fails
    and it destroys -- stopping that irecv in flight, which aborts the 2 -> 0 channel. Rank
    2 then sends on that channel: the abort must say why rank 0 left, naming rank 1 (before,
    only "communicator was destroyed"; the ring test met this in 1 run of 20)."""
    x = np.arange(8, dtype=np.float32) + rank
    big = np.ones(BIG, np.float32)
    msg = "no error"
    try:
        if rank == 1:
            rr.recv(np.zeros_like(x), src=0, tag=7)
            os._exit(0)
        if rank == 0:
            rr.send(x, dst=1, tag=7)
            y = np.zeros_like(x)
            rr.recv(y, src=2, tag=5)  # the 2 -> 0 channel exists before it is stopped
            if not np.array_equal(y, x + 2):
                return {"error": f"wrong data {y}"}
            pending = rr.irecv(np.zeros_like(big), src=2, tag=5)  # in flight at destroy()
            for _ in range(100):  # until rank 1's exit fails one (a send may be written
                rr.send(big, dst=1, tag=7)  # to the socket before its close is seen)
                time.sleep(0.05)
            msg = f"sends to the dead rank 1 all returned; {pending!r}"
        else:
            rr.send(x, dst=0, tag=5)
            if not await_flags(["left"], 30):
                return {"error": "rank 0 never left"}
            rr.send(big, dst=0, tag=5)  # meets the abort of rank 0's irecv
            msg = "send returned"
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
    rr.destroy()
    if rank == 0:
        raise_flag("left")
    return {"error": msg}


def pipeline_death(rank: int, world: int, victim: int = 2) -> dict:
    """A 1F1B-like pipeline (activations forward on tag 1, gradients back on tag 2); stage
    `victim` is killed at micro-batch 5. Its neighbours fail at once, then linger (they do
    not destroy: a program that catches the error and cleans up slowly). Before, stage 0,
    waiting for stage 1's gradient, learnt nothing until its timeout, then blamed stage 1 as
    idle (found by a helper): stage 1's loss now fails its other channels of the world,
    whose peers are told which rank was lost."""
    import os
    import time

    act, grad = np.zeros(1 << 12, np.float32), np.zeros(1 << 12, np.float32)
    t0 = time.monotonic()
    try:
        for i in range(50):
            if rank == victim and i == 5:
                os._exit(0)
            t0 = time.monotonic()
            if rank > 0:
                rr.recv(act, src=rank - 1, tag=1)
            if rank < world - 1:
                rr.send(act + 1, dst=rank + 1, tag=1)
                rr.recv(grad, src=rank + 1, tag=2)
            if rank > 0:
                rr.send(grad + 1, dst=rank - 1, tag=2)
        out = {"error": "no error"}
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}", "secs": time.monotonic() - t0,
               "peer_rank": getattr(e, "peer_rank", None),
               "relayed_by": getattr(e, "relayed_by", None)}
    if rank != 0:
        time.sleep(8)  # still alive, and not destroyed, when stage 0 is told
    rr.destroy()
    return out


def every_sender_left(rank: int, world: int) -> dict:
    """Rank 1 sends one message on tag 5, then destroys; rank 2 destroys at once. Rank 0's
    first receive from any rank gets rank 1's message (delivered before it left); its second
    fails at once: every sender left (it waited for RINGREDUCE_TIMEOUT before)."""
    import time

    if rank == 1:
        rr.send(np.full(4, 7.0, np.float32), dst=0, tag=5)
    if rank != 0:
        rr.destroy()
        return {}
    y = np.zeros(4, np.float32)
    first = rr.recv(y, tag=5)
    t0 = time.monotonic()
    try:
        rr.recv(y, tag=5)
        out = {"error": "no error"}
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}", "cause": getattr(e, "cause", None)}
    out.update(first=first, got=float(y[0]), secs=time.monotonic() - t0)
    rr.destroy()
    return out


def any_source_sender_killed(rank: int, world: int) -> dict:
    """Through the torch backend: rank world // 2 sends rank 0 two messages (their channel
    exists), then is killed; rank 0's next dist.recv from any rank names it at once. The
    channel shows the death (a socket's EOF; over shared memory its pidfd, which the receive
    did not look at: in a helper's 6-rank job, started without this harness, it waited for
    the heartbeat timeout, or with heartbeats off for RINGREDUCE_TIMEOUT -- here the world's
    probe names the rank too). The others send nothing and stay."""
    import signal

    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    dist.barrier()
    x = torch.zeros(3)
    if rank == world // 2:
        for _ in range(2):
            dist.send(torch.full((3,), 2.0), dst=0)
        await_flags(["got0"], 20)
        time.sleep(0.5)  # rank 0 has waited a while: its probes have settled
        os.kill(os.getpid(), signal.SIGKILL)
    if rank != 0:
        await_flags(["done0"], 30)
        return {}
    got = [dist.recv(x) for _ in range(2)]
    raise_flag("got0")
    t0 = time.monotonic()
    try:
        dist.recv(x)
        out = {"error": None}
    except RuntimeError as e:  # torch wraps nothing: our PeerFailure (a RuntimeError)
        out = {"error": str(e), "peer_rank": getattr(e, "peer_rank", None),
               "secs": time.monotonic() - t0}
    raise_flag("done0")
    return {"got": got, **out}


def survivors_after_death(rank: int, world: int) -> dict:
    """3 ranks; rank 2 exits once the others are ready. Ranks 0 and 1 see the world's
    all-reduce fail naming it, then: a message between them on a new tag (checked), a new
    group of the two (all-reduce checked), and -- refused at once, naming rank 2 -- a send
    to it on a new tag and a new group with it. Before, the send returned and a log line
    said later that it had failed."""
    if rank == 2:
        await_flags(["ready0", "ready1"], 20.0)
        os._exit(0)
    raise_flag(f"ready{rank}")
    out: dict = {}
    try:
        rr.allreduce(np.ones(8))
        out["world"] = "no error"
    except rr.PeerFailure as e:
        out["world"] = e.peer_rank
    x = np.arange(5, dtype=np.int32) + 10 * rank
    if rank == 0:
        rr.send(x, 1, tag=7)
    else:
        got = np.zeros(5, np.int32)
        rr.recv(got, 0, tag=7)
        out["p2p"] = bool(np.array_equal(got, np.arange(5, dtype=np.int32)))
    g = rr.new_group([0, 1])
    y = np.full(3, rank + 1.0)
    rr.allreduce(y, group=g)
    out["group"] = bool(np.array_equal(y, np.full(3, 3.0)))
    for what, call in (("send", lambda: rr.send(x, 2, tag=8)),
                       ("new_group", lambda: rr.new_group([0, 1, 2]))):
        t = time.monotonic()
        try:
            call()
            out[what] = "not refused"
        except rr.PeerFailure as e:
            out[what] = (e.peer_rank, round(time.monotonic() - t, 2))
    return out



def survivor_told_back(rank: int, world: int, then: str) -> dict:
    """3 ranks; rank 2 exits. Rank 0's world all-reduce fails first; then rank 1's, told by
    rank 0 (over shared memory rank 1's abort record, naming rank 2, stays). Rank 1 then
    either comes to a new group of the two a second late (then="late": rank 0 waits for
    it, and the group's all-reduce is checked) or exits (then="exits": rank 0's set-up
    names rank 1, well before the timeout). Before, rank 0's wait took rank 1's abort --
    rank 0's own news told back -- for rank 1's failure and failed the group."""
    if rank == 2:
        await_flags(["ready0", "ready1"], 20.0)
        os._exit(0)
    raise_flag(f"ready{rank}")
    out: dict = {}
    if rank == 1:
        await_flags(["failed0"], 20.0)
    try:
        rr.allreduce(np.ones(8))
    except Exception as e:  # noqa: BLE001 - any other kind is reported as text
        out["world"] = getattr(e, "peer_rank", None) if isinstance(e, rr.PeerFailure) else \
            f"{type(e).__name__}: {e}"
    raise_flag(f"failed{rank}")
    if rank == 1:
        if then == "exits":
            os._exit(0)
        time.sleep(1.0)
    else:
        await_flags(["failed1"], 20.0)
    t = time.monotonic()
    try:
        g = rr.new_group([0, 1])
        y = np.full(3, rank + 1.0)
        rr.allreduce(y, group=g)
        out["group"] = y.tolist()
    except Exception as e:  # noqa: BLE001 - any other kind is reported as text
        out["group"] = (getattr(e, "peer_rank", None), round(time.monotonic() - t, 2),
                        f"{type(e).__name__}: {e}")
    return out

def unreceived_send(rank: int, world: int, linger: float) -> dict:
    """Rank 0's first message on tag 9 returns at once, but rank 1 never receives it: rank
    0's destroy() waits for it (RINGREDUCE_TIMEOUT) while rank 1 lives on (`linger` s),
    warning which send it waits for, and the send's failure is logged; once rank 1 has left
    the job (linger 0), at once -- or the send is refused, if rank 0 knows by then."""
    import logging

    records: list = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("ringreduce").addHandler(handler)
    t0 = time.monotonic()
    refused = None
    if rank == 0:
        try:
            rr.send(np.ones(3), 1, tag=9)
        except rr.PeerFailure as e:
            refused = (e.peer_rank, e.cause)
    returned = time.monotonic() - t0
    if rank == 1:
        time.sleep(linger)
    rr.destroy()
    return {"returned": returned, "destroyed": time.monotonic() - t0, "refused": refused,
            "logs": [r.getMessage() for r in records]}
