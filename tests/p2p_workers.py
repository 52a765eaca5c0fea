"""Rank-side code of tests/test_p2p.py: send/recv/isend/irecv checked against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

import ringreduce as rr

BIG = 1 << 20  # float32 elements: 4 MiB, more than a socket buffer holds


def _msg(src: int, dst: int, n: int, dtype: Any = np.float32, salt: int = 0) -> np.ndarray:
    return ((np.arange(n) * 3 + src * 101 + dst * 7 + salt) % 251).astype(dtype)


def _readonly() -> np.ndarray:
    a = np.ones(2)
    a.flags.writeable = False
    return a


def matrix(rank: int, world: int) -> list:
    fails: list = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # 1. ring exchange, isend first everywhere, big messages: must not deadlock
    for n in (0, 1, 1000, BIG + 3):
        out = _msg(rank, nxt, n)
        got = np.empty(n, np.float32)
        ws = [rr.isend(out, nxt), rr.irecv(got, prv)]
        for w in ws:
            w.wait()
        if not np.array_equal(got, _msg(prv, rank, n)):
            fails.append(f"ring exchange n={n}")
    # 2. dtypes, blocking send/recv in rank order (even ranks send first)
    for dt in (np.int64, np.float16, np.bool_, np.uint16, np.float64):
        x = _msg(rank, nxt, 37, dt)
        y = np.empty(37, dt)
        if rank % 2 == 0:
            rr.send(x, nxt)
            rr.recv(y, prv)
        else:
            rr.recv(y, prv)
            rr.send(x, nxt)
        if not np.array_equal(y, _msg(prv, rank, 37, dt)):
            fails.append(f"send/recv {np.dtype(dt).name}")
    # 3. tags: received in the other order than sent
    if world >= 2 and rank in (0, 1):
        other = 1 - rank
        if rank == 0:
            rr.send(_msg(0, 1, 5, salt=1), 1, tag=1)
            rr.send(_msg(0, 1, 9, salt=2), 1, tag=2)
        else:
            b2, b1 = np.empty(9, np.float32), np.empty(5, np.float32)
            w2 = rr.irecv(b2, other, tag=2)
            rr.recv(b1, other, tag=1)
            w2.wait()
            if not (np.array_equal(b1, _msg(0, 1, 5, salt=1))
                    and np.array_equal(b2, _msg(0, 1, 9, salt=2))):
                fails.append("tags out of order")
    # 4. bad input, before anything moves
    for bad, call in [("self", lambda: rr.send(np.ones(2), rank)),
                      ("range", lambda: rr.send(np.ones(2), world)),
                      ("tag", lambda: rr.recv(np.ones(2), nxt, tag=-1)),
                      ("readonly", lambda: rr.recv(_readonly(), nxt)),
                      ("strided", lambda: rr.send(np.ones(6)[::2], nxt))]:
        try:
            call()
            fails.append(f"bad {bad} did not raise")
        except ValueError:
            pass
    rr.barrier()
    return fails


def pipeline(rank: int, world: int, micro: int) -> list:
    """1F1B: stage `rank` of `world` runs warm-up forwards, then one forward / one backward
    in turn, then the remaining backwards; activations go to rank + 1 and gradients back to
    rank - 1 with isend, receives are blocking. Every value is checked."""
    fails: list = []
    n = 1 << 18
    pending: list = []

    def fwd(m: int) -> None:
        a = np.empty(n, np.float32)
        if rank > 0:
            rr.recv(a, rank - 1, tag=0)
            if not np.array_equal(a, _msg(rank - 1, rank, n, salt=m)):
                fails.append(f"forward {m} from {rank - 1}")
        if rank < world - 1:
            pending.append(rr.isend(_msg(rank, rank + 1, n, salt=m), rank + 1, tag=0))

    def bwd(m: int) -> None:
        g = np.empty(n, np.float32)
        if rank < world - 1:
            rr.recv(g, rank + 1, tag=1)
            if not np.array_equal(g, _msg(rank + 1, rank, n, salt=100 + m)):
                fails.append(f"backward {m} from {rank + 1}")
        if rank > 0:
            pending.append(rr.isend(_msg(rank, rank - 1, n, salt=100 + m), rank - 1, tag=1))

    warm = min(world - rank - 1, micro)
    for m in range(warm):
        fwd(m)
    for i in range(micro - warm):
        fwd(warm + i)
        bwd(i)
    for m in range(micro - warm, micro):
        bwd(m)
    for w in pending:
        w.wait()
    return fails


def size_mismatch(rank: int, world: int) -> str:
    try:
        if rank == 0:
            rr.send(np.ones(10, np.float32), 1)
        else:
            rr.recv(np.ones(12, np.float32), 0)
        return "no error"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__ + ": " + str(e)


def torch_p2p(rank: int, world: int) -> list:
    """Stock torch point-to-point on the ringreduce backend: dist.send/recv, isend/irecv and
    batch_isend_irecv (a ring exchange), in the world and in a subgroup."""
    import torch
    import torch.distributed as dist

    fails: list = []
    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = torch.from_numpy(_msg(rank, nxt, 5000))
    got = torch.empty(5000)
    ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if not torch.equal(got, torch.from_numpy(_msg(prv, rank, 5000))):
        fails.append("batch_isend_irecv ring")
    t = torch.zeros(3, dtype=torch.int64)
    if rank == 0:
        dist.send(torch.tensor([7, 8, 9]), dst=world - 1, tag=3)
    elif rank == world - 1:
        dist.recv(t, src=0, tag=3)
        if t.tolist() != [7, 8, 9]:
            fails.append(f"send/recv tag 3: {t.tolist()}")
    sub = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        t = torch.full((4,), float(rank))
        if rank == 0:
            dist.send(t, dst=world - 1, group=sub)  # dst: a world rank, as in torch
        else:
            dist.recv(t, src=0, group=sub)
            if t.tolist() != [0.0] * 4:
                fails.append(f"subgroup send/recv: {t.tolist()}")
    dist.barrier()
    dist.destroy_process_group()
    return fails
