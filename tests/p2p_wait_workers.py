"""Rank-side code of tests/test_p2p.py for waits and what channels leave behind: a first
message's stall report (RINGREDUCE_STALL_WARN), and the process-wide channel table."""

from __future__ import annotations

import time

import numpy as np

import ringreduce as rr

BIG = 1 << 20  # float32 elements: 4 MiB, more than a socket buffer holds


def busy_peer(rank: int, world: int) -> str:
    """Rank 0 waits for rank 1's first message on a tag while rank 1 (and the others) wait
    in an all-reduce for rank 0: both give up at RINGREDUCE_TIMEOUT. Returns the error."""
    x = np.zeros(4, np.float32)
    try:
        if rank == 0:
            rr.recv(x, src=1, tag=1)
        else:
            rr.allreduce(x)
    except rr.RingReduceError as e:
        return type(e).__name__
    return "no error"


def stall_beside_a_collective(rank: int, world: int) -> dict:
    """Rank 0 starts an async all-reduce, then waits for rank 1's first message (4 MiB: not
    sent eagerly); rank 1 sends 2 s late, then joins the all-reduce. Rank 0's stall report
    (RINGREDUCE_STALL_WARN) is due while the all-reduce is in flight: it must not wait for
    it (it did: both ranks then timed out, found by a review)."""
    x, y = np.ones(4, np.float32), np.zeros(BIG, np.float32)
    t0 = time.monotonic()
    if rank == 0:
        w = rr.allreduce(x, async_op=True)
        rr.recv(y, src=1, tag=1)
        w.wait()
    else:
        time.sleep(2.0)
        y[:] = 5
        rr.send(y, dst=0, tag=1)
        rr.allreduce(x)
    return {"secs": time.monotonic() - t0, "ok": bool((x == 2).all() and (y == 5).all())}


def channels_leave_their_family(rank: int, world: int) -> dict:
    """Groups carrying send/recv, made and destroyed 20 times: every destroyed channel
    leaves the process-wide table of channel families (each left ~1.4 KB there for good per
    group: found by a helper). Returns the table's (families, channels) then and before."""
    from ringreduce import _C

    before = _C._p2p_families()
    for it in range(20):
        g = rr.new_group()
        s, r = np.full(8, rank * 100 + it, np.int64), np.empty(8, np.int64)
        w = rr.isend(s, dst=(rank + 1) % world, group=g)
        rr.recv(r, src=(rank - 1) % world, group=g)
        w.wait()
        assert (r == ((rank - 1) % world) * 100 + it).all(), (it, r)
        during = _C._p2p_families()
        g.destroy()
    return {"before": list(before), "during": list(during), "after": list(_C._p2p_families())}


def world_wait_beside_a_receive(rank: int, world: int) -> str:
    """Rank 1 waits in its second receive from rank 0 (tag 5) while rank 0 waits in a world
    barrier rank 1 never joins: rank 0's timeout names what rank 1 is doing instead (a
    channel's transfer is a 2-rank broadcast inside; it said "broadcast #2"). Rank 0 then
    sends, so rank 1 finishes. Returns rank 0's error, "ok" on rank 1."""
    x = np.zeros(4, np.float32)
    if rank == 1:
        rr.recv(x, src=0, tag=5)
        rr.recv(x, src=0, tag=5)
        return "ok"
    rr.send(x, dst=1, tag=5)
    time.sleep(0.5)
    try:
        rr.barrier()
        err = "no error"
    except rr.CollectiveTimeout as e:
        err = str(e)
    rr.send(x, dst=1, tag=5)
    return err


def prefetched_receive_beside_a_collective(rank: int, world: int) -> dict:
    """Rank 0 posts a receive from rank 1 and takes its Future, then waits for an all-reduce's
    Future, then sends to rank 1; rank 1 joins the all-reduce, receives, then sends back.
    The all-reduce's Future waited behind the receive's, whose message comes only after
    rank 0's send: both ranks timed out (found by a helper)."""
    x = np.full(4, rank + 1.0, np.float32)
    y, z = np.zeros(3, np.float32), np.full(3, 7.0 + rank, np.float32)
    if rank == 0:
        f = rr.irecv(y, src=1).get_future()
        rr.allreduce(x, async_op=True).get_future().wait()
        rr.send(z, dst=1)
        f.wait()
    elif rank == 1:
        rr.allreduce(x)
        rr.recv(y, src=0)
        rr.send(z, dst=0)
    else:
        rr.allreduce(x)
    return {"x": x.tolist(), "y": y.tolist()}


def any_source_posts_in_order(rank: int, world: int, trials: int) -> dict:
    """The last rank sends 8 messages of 1..8 elements (blocking sends, in order) on tag 4
    to rank 0, which has posted 8 receives from any rank of those sizes: each message fills
    the receive posted in its place (MPI's non-overtaking rule, gloo's too). Their helper
    threads raced for the tag's lock: swapped payloads, or a size mismatch (found by a
    helper: 5 of 10 trials out of order)."""
    sender, bad = world - 1, []
    warm = np.zeros(1, np.float32)
    if rank == 0:  # the channel is made first: only the matching races then
        rr.recv(warm, src=sender, tag=4)
    elif rank == sender:
        rr.send(warm, dst=0, tag=4)
    for t in range(trials):
        if rank == 0:
            bufs = [np.zeros(k, np.float32) for k in range(1, 9)]
            works = [rr.irecv(b, src=None, tag=4) for b in bufs]
            for w in works:
                w.wait()
            bad += [(t, k) for k, b in enumerate(bufs, 1)
                    if not np.array_equal(b, np.full(k, 100.0 * t + k, np.float32))]
        elif rank == sender:
            for k in range(1, 9):
                rr.send(np.full(k, 100.0 * t + k, np.float32), dst=0, tag=4)
        rr.barrier()
    return {"bad": bad}
