"""Rank-side code of tests/test_p2p.py: send/recv/isend/irecv checked against numpy."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from _spawn import await_flags, raise_flag

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
                      ("strided", lambda: rr.send(np.ones(6)[::2], nxt)),
                      ("float tag", lambda: rr.send(np.ones(2), nxt, tag=1.0)),
                      ("bool tag", lambda: rr.send(np.ones(2), nxt, tag=True))]:
        try:
            call()
            fails.append(f"bad {bad} did not raise")
        except ValueError as e:  # named as the call made, also on a channel made already
            # (it said "broadcast(x): ...", the collective that carries a message)
            name = {"readonly": "recv(x): ", "strided": "send(x): "}.get(bad, "")
            if not str(e).startswith(name):
                fails.append(f"bad {bad}: {e}")
    # a float rank must not quietly become an int one (dst=1.7 was rank 1)
    for bad, call in [("float dst", lambda: rr.isend(np.ones(2), nxt + 0.5)),
                      ("str src", lambda: rr.irecv(np.ones(2), str(nxt)))]:
        try:
            call()
            fails.append(f"bad {bad} did not raise")
        except TypeError as e:
            if "must be an int rank" not in str(e):
                fails.append(f"bad {bad}: {e}")
    # numpy ints are ranks and tags, as in torch
    if world > 1:
        prv = (rank - 1) % world
        w = rr.isend(np.full(3, rank, np.int64), np.int64(nxt), tag=np.int32(7))
        got = np.empty(3, np.int64)
        src = rr.recv(got, np.int64(prv), tag=np.int64(7))
        w.wait()
        if src != prv or type(src) is not int or not np.array_equal(got, np.full(3, prv)):
            fails.append(f"numpy rank/tag: src={src!r} got={got}")
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


def send_first(rank: int, world: int) -> list:
    """Every rank sends (blocking) to the next rank of the ring before it receives from the
    previous one -- unsafe in MPI's terms, but eager small messages make it work there, as
    the kernel's buffers do over TCP. Two messages per size, up to 1.5 MiB unread. Then
    rank 0 sends 5 messages to rank 1, which starts reading 1 s late: the sender returns
    from the first ones at once and, over shared memory, waits in the third (over TCP the
    kernel buffers all five). The ring's first messages are the first on their channels:
    those sends return before the channel is made (p2p.EAGER_MAX)."""
    fails: list = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n in (1, 3, 2048, 2049, 65536, 131072):
        for salt in range(3):
            rr.send(_msg(rank, nxt, n, salt=salt), nxt)
            rr.send(_msg(rank, nxt, n, np.float64, salt=salt + 1), nxt)
            a, b = np.empty(n, np.float32), np.empty(n, np.float64)
            rr.recv(a, prv)
            rr.recv(b, prv)
            if not (np.array_equal(a, _msg(prv, rank, n, salt=salt)) and
                    np.array_equal(b, _msg(prv, rank, n, np.float64, salt=salt + 1))):
                fails.append(f"send first, n={n} salt={salt}: wrong data from rank {prv}")
    rr.barrier()
    # (told by a flag the receiver raises as it begins to read, not by times: a rank that
    # left the barrier late on a loaded host made them wrong)
    if rank == 0:
        raise_flag("sending")
        t0, took = time.monotonic(), []
        for k in range(5):
            rr.send(_msg(0, 1, 8, salt=k), 1)
            took.append(time.monotonic() - t0)
            if k == 0 and await_flags(["reading"], 0):
                fails.append(f"the first send waited for the late receiver: {took}")
        if not await_flags(["reading"], 0) and os.environ.get("RINGREDUCE_TRANSPORT") == "shm":
            fails.append(f"5 sends returned before the late receiver read any: {took}")
    elif rank == 1:
        await_flags(["sending"], 20)  # 1 s after rank 0 began, not after this rank's barrier
        time.sleep(1.0)
        raise_flag("reading")
        for k in range(5):
            y = np.empty(8, np.float32)
            rr.recv(y, 0)
            if not np.array_equal(y, _msg(0, 1, 8, salt=k)):
                fails.append(f"late receiver: message {k} is {y}")
    # Beyond the slots (2 MiB): over shared memory the receiver reads the sender's buffer in
    # place (process_vm_readv, which this machine allows; RINGREDUCE_CMA=1 by default).
    big = 6 << 20
    if rank == 0:
        rr.send(_msg(0, 1, big, salt=5), 1)
        rr.send(_msg(0, 1, 1000, salt=6), 1)  # the slots again after it
    elif rank == 1:
        y, z = np.empty(big, np.float32), np.empty(1000, np.float32)
        rr.recv(y, 0)
        rr.recv(z, 0)
        if not (np.array_equal(y, _msg(0, 1, big, salt=5)) and
                np.array_equal(z, _msg(0, 1, 1000, salt=6))):
            fails.append("24 MiB message, then a small one: wrong data")
        up = rr.world_group().p2p[(0, 1, 0)][0]  # the channel 0 -> 1, tag 0
        read = up.comm.cma_bytes()
        cma = os.environ.get("RINGREDUCE_CMA", "1") != "0"
        # (where the kernel refuses process_vm_readv the slots carry it: 0 bytes)
        readable = os.environ.get("RINGREDUCE_TRANSPORT") == "shm" and up.comm.cma_readable()
        want = big * 4 if cma and readable else 0
        if read != want:
            fails.append(f"{read} bytes of the 24 MiB message were read in place, not {want}")
    return fails


def size_mismatch(rank: int, world: int, n: int, good_first: bool = False) -> str:
    """Rank 0 sends n float32, rank 1 receives n + 2 (good_first: one matching message
    first). The receiver fails at once; the sender's send may return (eager, as over TCP),
    and then its next send on that channel, once the receiver has failed, must fail too
    (the receiver's abort reached it). Rank 0 returns what each send did, rank 1 what its
    recv and a second one said, and whether the failed recv's buffer and the bytes around it
    kept their -1s (over shared memory they must; over TCP the payload is read with its
    header, so the buffer may hold the message's start)."""
    flag = os.path.join(os.path.dirname(os.environ["RR_SPAWN_ARGS"]), "recv_failed")
    if rank == 1:
        if good_first:
            rr.recv(np.ones(n, np.float32), 0)
        said = []
        for _ in range(2):
            guarded = np.full(n + 6, -1.0, np.float32)
            try:
                rr.recv(guarded[2:-2], 0)
                said.append("no error")
            except Exception as e:  # noqa: BLE001
                said.append(type(e).__name__ + ": " + str(e))
            said[-1] += " [buffer untouched]" if np.all(guarded == -1) else " [buffer WRITTEN]"
            open(flag, "a").close()
        return " | ".join(said)
    if good_first:
        rr.send(np.ones(n, np.float32), 1)
    said = []
    for _ in range(4):
        try:
            rr.send(np.ones(n, np.float32), 1)
            said.append("no error")
            deadline = time.monotonic() + 20
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)  # until the receiver has failed
            time.sleep(0.1)  # and published its abort
        except Exception as e:  # noqa: BLE001
            said.append(type(e).__name__ + ": " + str(e))
            break
    return " | ".join(said)


def fresh_tag_order(rank: int, world: int, tags: int) -> list:
    """Messages posted back to back on a tag whose channel is still being made arrive in the
    order they were posted (the helper threads that make it must not reorder them): rank 0
    -> 1 by isends (and a blocking send first) against irecvs, 1 -> 0 by isends against
    blocking receives. Then rank 0's first message on a new tag, sent just before destroy(),
    still reaches rank 1, which receives it 1 s later."""
    fails: list = []
    if rank > 1:
        return fails
    for tag in range(100, 100 + tags):
        msgs = [_msg(0, 1, 7, np.int64, salt=tag * 10 + k) for k in range(4)]
        if rank == 0:
            rr.send(msgs[0], 1, tag=tag)
            ws = [rr.isend(m, 1, tag=tag) for m in msgs[1:]]
            for w in ws:
                w.wait()
            back = [np.empty(3, np.float32) for _ in range(3)]
            for b in back:
                rr.recv(b, 1, tag=tag)
            if [int(b[0]) for b in back] != [tag * 10 + k for k in range(3)]:
                fails.append(f"tag {tag}, 1 -> 0: order {[int(b[0]) for b in back]}")
        else:
            got = [np.empty(7, np.int64) for _ in range(4)]
            ws = [rr.irecv(g, 0, tag=tag) for g in got]
            out = [rr.isend(np.full(3, tag * 10 + k, np.float32), 0, tag=tag) for k in range(3)]
            for w in ws + out:
                w.wait()
            for k, g in enumerate(got):
                if not np.array_equal(g, msgs[k]):
                    fails.append(f"tag {tag}, 0 -> 1: message {k} starts {g[0]}, the four "
                                 f"sent start {[int(m[0]) for m in msgs]}")
    last = _msg(0, 1, 1000, salt=99)
    if rank == 0:
        rr.send(last, 1, tag=7)  # returns at once; the harness then destroys
    else:
        time.sleep(1.0)
        y = np.empty(1000, np.float32)
        rr.recv(y, 0, tag=7)
        if not np.array_equal(y, last):
            fails.append("the send just before destroy() arrived wrong")
    return fails


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
    # The tutorial's ring: blocking dist.send before dist.recv, first messages on tag 5
    # (gloo's sends complete before the receiver posts; so do ours up to p2p.EAGER_MAX).
    dist.send(torch.from_numpy(_msg(rank, nxt, 300)), nxt, tag=5)
    ring = torch.empty(300)
    dist.recv(ring, prv, tag=5)
    if not torch.equal(ring, torch.from_numpy(_msg(prv, rank, 300))):
        fails.append("blocking dist.send/recv ring on a new tag")
    t = torch.zeros(3, dtype=torch.int64)
    if rank == 0:
        dist.send(torch.tensor([7, 8, 9]), dst=world - 1, tag=3)
    elif rank == world - 1:
        dist.recv(t, src=0, tag=3)
        if t.tolist() != [7, 8, 9]:
            fails.append(f"send/recv tag 3: {t.tolist()}")
    # From any source (torch's dist.recv(t) / irecv(t) without src): returns / names the
    # sender; every rank but the last sends its rank to the last one.
    if rank == world - 1:
        senders = []
        for i in range(world - 1):
            t = torch.full((6,), -1.0)
            if i % 2:
                w = dist.irecv(t)
                w.wait()
                src = w._source_rank()
            else:
                src = dist.recv(t)
            senders.append(src)
            if t.tolist() != [float(src)] * 6:
                fails.append(f"any-source from {src}: {t.tolist()}")
        if sorted(senders) != list(range(world - 1)):
            fails.append(f"any-source senders {senders}")
    else:
        dist.send(torch.full((6,), float(rank)), dst=world - 1)
    sub = dist.new_group([0, world - 1])
    if rank in (0, world - 1):
        t = torch.full((4,), float(rank))
        if rank == 0:
            dist.send(t, dst=world - 1, group=sub)  # dst: a world rank, as in torch
        else:
            dist.recv(t, src=0, group=sub)
            if t.tolist() != [0.0] * 4:
                fails.append(f"subgroup send/recv: {t.tolist()}")
    # Process groups are separate message spaces: the same pair and tag on two groups and
    # the world never take each other's messages, named or any-source (before, every group's
    # messages between two ranks shared one channel per tag: B got A's message).
    a, b = dist.new_group([0, world - 1]), dist.new_group([0, world - 1])
    if rank == 0:
        for w in [dist.isend(torch.full((3,), v), dst=world - 1, group=g, tag=7)
                  for v, g in ((1.0, a), (2.0, b), (3.0, None))]:
            w.wait()
    elif rank == world - 1:
        got = {}
        for name, g in (("b", b), ("world", None), ("a", a)):
            t = torch.zeros(3)
            src = dist.recv(t, group=g, tag=7) if name == "b" else dist.recv(t, 0, g, 7)
            got[name] = (src, t.tolist())
        want = {"b": (0, [2.0] * 3), "world": (0, [3.0] * 3), "a": (0, [1.0] * 3)}
        if got != want:
            fails.append(f"messages of different groups mixed: {got}")
    dist.barrier()
    dist.destroy_process_group()
    return fails


def groups_apart(rank: int, world: int) -> list:
    """rr point-to-point on overlapping groups: each group is its own message space (same
    pair, same tag), also for any-source receives, and destroying a group closes its
    channels while the other group's keep working."""
    fails: list = []
    last = world - 1
    a, b = rr.new_group([0, last]), rr.new_group(list(range(world)))
    if rank == 0:
        for v, g in ((1.0, a), (2.0, b), (3.0, None), (4.0, b)):
            rr.send(np.full(5, v), last, tag=3, group=g)  # small: each returns at once
    elif rank == last:
        order = (("b", b, 0), ("world", None, 0), ("a", a, None), ("b", b, None))
        got = []
        for name, g, src in order:
            x = np.zeros(5)
            s = rr.recv(x, src, tag=3, group=g)
            got.append((name, s, float(x[0]), bool((x == x[0]).all())))
        want = [("b", 0, 2.0, True), ("world", 0, 3.0, True), ("a", 0, 1.0, True),
                ("b", 0, 4.0, True)]
        if got != want:
            fails.append(f"messages of different groups mixed: {got} (want {want})")
    if a is not None:
        a.destroy()
    rr.barrier()
    if rank in (0, last):  # b's channel between them still works after a is gone
        x = np.full(7, float(rank))
        if rank == 0:
            rr.send(x, last, tag=3, group=b)
        else:
            rr.recv(x, 0, tag=3, group=b)
            if not (x == 0.0).all():
                fails.append(f"group b after a's destroy: {x}")
    return fails


def any_source(rank: int, world: int) -> list:
    """Receives from any source (src=None) checked against each sender's message: every rank
    in turn receives 2 messages from every other rank (recv and irecv, as torch's suite),
    named receives posted first keep their messages, several irecv(src=None) outstanding at
    once take distinct senders (big messages: shm chunks / socket buffers), a subgroup
    limits the senders, and bad input fails before any wait."""
    fails: list = []
    peers = [r for r in range(world) if r != rank]
    for n in (7, BIG + 1):  # small (one line / frame) and large messages
        for dst in range(world):
            if dst != rank:
                rr.send(_msg(rank, dst, n, salt=0), dst, tag=4)
                rr.send(_msg(rank, dst, n, salt=1), dst, tag=4)
                continue
            seen: dict = {}
            for i in range(2 * (world - 1)):
                buf = np.full(n, -1, np.float32)
                if i % 2:
                    w = rr.irecv(buf, tag=4)
                    w.wait()
                    src = w.source_rank()
                else:
                    src = rr.recv(buf, None, tag=4)
                k = seen.get(src, 0)
                seen[src] = k + 1
                if src not in peers or not np.array_equal(buf, _msg(src, rank, n, salt=k)):
                    fails.append(f"n={n}: message {i} from {src} (its #{k}) is wrong")
            if seen != {p: 2 for p in peers}:
                fails.append(f"n={n}: senders {seen}, expected two from each of {peers}")
        rr.barrier()
    # A named irecv posted before any-source receives keeps the first message of its sender.
    if rank == 0:
        named = np.empty(11, np.float32)
        w = rr.irecv(named, src=world - 1, tag=6)
        got = []
        for _ in range(world - 1):
            buf = np.empty(11, np.float32)
            got.append((rr.recv(buf, tag=6), buf))
        w.wait()
        if w.source_rank() != world - 1 or not np.array_equal(named, _msg(world - 1, 0, 11)):
            fails.append("named irecv lost its message to an any-source receive")
        for src, buf in got:
            salt = 1 if src == world - 1 else 0
            if not np.array_equal(buf, _msg(src, 0, 11, salt=salt)):
                fails.append(f"any-source after a named irecv: wrong message from {src}")
        if sorted(s for s, _ in got) != list(range(1, world)):
            fails.append(f"any-source after a named irecv: senders {[s for s, _ in got]}")
    else:
        rr.send(_msg(rank, 0, 11), 0, tag=6)
        if rank == world - 1:
            rr.send(_msg(rank, 0, 11, salt=1), 0, tag=6)
    rr.barrier()
    # Several any-source irecvs outstanding at once: each sender's message taken once.
    if rank == 0:
        bufs = [np.empty(BIG, np.float32) for _ in peers]
        ws = [rr.irecv(b, None, tag=8) for b in bufs]
        srcs = []
        for w, b in zip(ws, bufs):
            w.wait()
            srcs.append(w.source_rank())
            if not np.array_equal(b, _msg(srcs[-1], 0, BIG)):
                fails.append(f"outstanding irecvs: wrong message from {srcs[-1]}")
        if sorted(srcs) != list(range(1, world)):
            fails.append(f"outstanding irecvs: senders {srcs}")
    else:
        rr.send(_msg(rank, 0, BIG), 0, tag=8)
    rr.barrier()
    # A subgroup limits the senders: rank 1 (outside it) has sent first and must wait.
    if world >= 3:
        sub = rr.new_group([0, world - 1])
        if rank == 0:
            buf = np.empty(3, np.float32)
            if rr.recv(buf, tag=9, group=sub) != world - 1 or not np.array_equal(
                    buf, _msg(world - 1, 0, 3)):
                fails.append("subgroup any-source took a rank outside the group")
            if rr.recv(buf, tag=9) != 1 or not np.array_equal(buf, _msg(1, 0, 3)):
                fails.append("world any-source after the subgroup one")
        elif rank in (1, world - 1):
            if rank == world - 1:
                import time
                time.sleep(0.3)  # rank 1's message (on the world) is there first
            rr.send(_msg(rank, 0, 3), 0, tag=9, group=sub if rank == world - 1 else None)
        rr.barrier()
    # Only a waiting message is taken: rank 1 sends once it heard from rank 0, which it
    # does only after receiving from the last rank (channels exist: a first round).
    if world >= 3:
        if rank == 0:
            for _ in peers:
                rr.recv(np.empty(2, np.float32), tag=10)
        else:
            rr.send(_msg(rank, 0, 2), 0, tag=10)
        rr.barrier()  # every first message taken: only the second round is left
        if rank == 0:
            buf = np.empty(2, np.float32)
            first = rr.recv(buf, tag=10)
            rr.send(np.ones(1, np.float32), 1, tag=11)
            second = rr.recv(buf, tag=10)
            if (first, second) != (world - 1, 1):
                fails.append(f"causal order: took {first} then {second}")
        else:
            if rank == 1:
                rr.recv(np.empty(1, np.float32), 0, tag=11)
            if rank in (1, world - 1):
                rr.send(_msg(rank, 0, 2), 0, tag=10)
        rr.barrier()
    # Bad input: before any wait.
    alone = [rr.new_group([r]) for r in range(world)][rank]
    for what, call in (("read-only", lambda: rr.recv(_readonly(), None)),
                       ("tag", lambda: rr.irecv(np.ones(2), None, tag=-1)),
                       ("group of one", lambda: rr.recv(np.ones(2), None, group=alone))):
        try:
            call()
            fails.append(f"{what}: no error")
        except ValueError:
            pass
    return fails


def any_source_timeout(rank: int, world: int) -> str:
    """Nobody sends: the receive fails at RINGREDUCE_TIMEOUT naming the tag."""
    import time

    if rank != 0:
        time.sleep(3.5)  # alive, sending nothing (a barrier would time out beside it)
        return "sent"
    try:
        rr.recv(np.ones(2), tag=3)
        return "no error"
    except Exception as e:  # noqa: BLE001
        return type(e).__name__ + ": " + str(e)


def first_message_waits(rank: int, world: int) -> dict:
    """The first message on a tag waits for the peer as any wait does (RINGREDUCE_TIMEOUT,
    not the connect timeout): a receiver that posts 2 s late still gets it. Blocking calls
    crossed over two new tags (rank 0 sends tag 10 first, rank 1 receives tag 11 first): small
    messages are sent eagerly, so both arrive intact; messages above p2p.EAGER_MAX wait for
    the receiver, and fail on both ranks at RINGREDUCE_TIMEOUT, naming the tag and the peer."""
    import time

    from ringreduce import p2p

    out: dict = {}
    x = np.arange(5, dtype=np.float64) + 7
    if rank == 0:
        rr.send(x, dst=1, tag=4)
    else:
        time.sleep(2.0)  # longer than RINGREDUCE_CONNECT_TIMEOUT=1 of this test
        y = np.zeros(5)
        rr.recv(y, src=0, tag=4)
        out["late"] = bool(np.array_equal(y, x))
    if rank == 0:
        x10, x11 = x * 10, x * 11
        rr.send(x10, dst=1, tag=10)
        x10[:] = -1  # the eager send copied it
        rr.send(x11, dst=1, tag=11)
    else:
        y10, y11 = np.zeros(5), np.zeros(5)
        rr.recv(y11, src=0, tag=11)
        rr.recv(y10, src=0, tag=10)
        out["crossed_small"] = bool(np.array_equal(y10, x * 10) and np.array_equal(y11, x * 11))
    big = np.ones(p2p.EAGER_MAX // 8 + 1)
    rr.barrier()  # both start waiting together (rank 0's eager sends returned at once)
    t0 = time.monotonic()
    try:
        if rank == 0:
            rr.send(big, dst=1, tag=20)
            rr.send(big, dst=1, tag=21)
        else:
            rr.recv(big, src=0, tag=21)
            rr.recv(big, src=0, tag=20)
        out["crossed"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["crossed"] = (type(e).__name__, round(time.monotonic() - t0, 1),
                          f"for rank {1 - rank} to post a send" in str(e)
                          and f"on tag {20 if rank == 0 else 21}" in str(e)
                          # the user's line, and no store keys (found by a helper)
                          and "called from p2p_workers.py:" in str(e) and "missing" not in str(e)
                          # as a collective's timeout: the rank the wait chain ends at
                          and getattr(e, "peer_rank", None) == 1 - rank
                          and getattr(e, "waiting_for", None) == 1 - rank)
    # Neither rank leaves before the other's deadline: a rank whose program ends first is
    # named to a peer still waiting (PeerFailure, "left the job"), as it should be.
    raise_flag(f"crossed{rank}")
    await_flags([f"crossed{1 - rank}"], 20)
    return out


def many_tags(rank: int, world: int, tags: int) -> list:
    """Rank 0 sends one checked message on each of `tags` tags to rank 1 (a channel pair per
    tag); returns what went wrong."""
    bad = []
    for t in range(tags):
        x = _msg(0, 1, 5, salt=t)
        if rank == 0:
            rr.send(x, dst=1, tag=t)
        else:
            y = np.zeros_like(x)
            rr.recv(y, src=0, tag=t)
            if not np.array_equal(x, y):
                bad.append(f"tag {t}: got {y[:3]}")
    return bad


def irecv_at_destroy(rank: int, world: int, who: int = 0, src: Any = "peer") -> dict:
    """Rank `who` posts an irecv (from the other rank, or src=None) on a tag no one sends
    on, then both destroy() and init() again in the same processes. Before, the irecv's
    helper thread kept waiting in the store (RINGREDUCE_TIMEOUT) holding the store, so rank
    0's store port stayed in use and the re-init failed (EADDRINUSE); its wait(3) returned
    False. On rank 1 its wait() said the store had failed ("did it exit or crash?", torch
    printing a C++ stack trace), or with src=None raised AttributeError."""
    import threading

    rr.barrier()
    w = None
    if rank == who:
        w = rr.irecv(np.ones(8), 1 - rank if src == "peer" else None, tag=3)
    # `who` destroys first: the other's earlier goodbye would end the wait as a PeerFailure
    # naming the rank that left (right too; the CI saw it under load).
    time.sleep(0.3 if rank == who else 1.0)
    rr.destroy()
    out: dict = {"connect_threads_at_destroy": sum(
        t.name == "ringreduce-p2p-connect" and t.is_alive() for t in threading.enumerate())}
    out.update(_wait_after_destroy(w, 3))
    del w  # nothing of the old world kept alive through the re-init
    rr.init()
    x = np.full(3, rank + 1.0)
    rr.allreduce(x)
    out["reinit_sum"] = float(x[0])
    return out


def _wait_after_destroy(w: Any, secs: float) -> dict:
    """How a pending irecv's wait(secs) (None: none on this rank) ends after a destroy, and
    the p2p helper threads left 0.3 s later."""
    import threading

    out: dict = {}
    if w is not None:
        t0 = time.monotonic()
        try:
            out["wait"] = f"returned {w.wait(secs)}"
        except Exception as e:  # noqa: BLE001
            out["wait"] = f"{type(e).__name__}: {e}"
        out["wait_secs"] = time.monotonic() - t0
    time.sleep(0.3)
    out["connect_threads"] = sum(t.name == "ringreduce-p2p-connect"
                                 for t in threading.enumerate())
    return out


def irecv_at_group_destroy(rank: int, world: int, src: Any = "peer") -> dict:
    """As irecv_at_destroy, on a group [0, last] (its timeout 30 s) that both destroy while
    rank 0's irecv on a new tag waits: the wait fails at once, naming the group. Before, it
    waited out the group's timeout and then blamed the peer (found by a helper)."""
    last = world - 1
    g = rr.new_group([0, last], timeout=30)
    w = None
    if rank == 0:
        w = rr.irecv(np.ones(8), last if src == "peer" else None, tag=3, group=g)
    time.sleep(0.3)
    if g is not None:
        g.destroy()
    out = _wait_after_destroy(w, 10)
    x = np.full(3, rank + 1.0)
    rr.allreduce(x)  # the world is unharmed
    out["sum"] = float(x[0])
    return out


def torch_call_sites(rank: int, world: int) -> dict:
    """2 ranks, stock torch: errors name this file's line, not a library's -- before, a
    dist.recv (run on a p2p helper thread) said "called from threading.py:..." and
    all_gather_into_tensor (torch wraps it in typing_extensions.deprecated) said
    "called from typing_extensions.py:...". Returns the error texts."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    out: dict = {}
    try:  # sizes differ between the ranks
        dist.all_gather_into_tensor(torch.zeros((4 + rank) * world), torch.ones(4 + rank))
        out["gather"] = "no error"
    except RuntimeError as e:
        out["gather"] = str(e)
    dist.destroy_process_group()
    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    try:  # the receiver's buffer is too small (a first message on the channel)
        if rank == 0:
            dist.send(torch.ones(10), 1)
            time.sleep(1)  # for the receiver's abort
            dist.send(torch.ones(10), 1)
        else:
            dist.recv(torch.zeros(7), 0)
        out["p2p"] = "no error"
    except RuntimeError as e:
        out["p2p"] = str(e)
    dist.destroy_process_group()
    return out


def unwaited_isend(rank: int, world: int, nelem: int) -> str:
    """Rank 0 starts an isend and returns at once, never waiting for its Work (the harness
    then destroys): destroy() completes the send, as it does an early-returned one. Before,
    the channel went with the world and rank 1 failed (shared memory: "rank 0 left the job")
    or waited RINGREDUCE_CONNECT_TIMEOUT in the channel's TCP connect."""
    want = np.arange(nelem, dtype=np.float32) + 7
    if rank == 0:
        rr.isend(want, 1, tag=3)
        return "sent"
    got = np.zeros(nelem, np.float32)
    rr.recv(got, 0, tag=3)
    return "ok" if np.array_equal(got, want) else f"wrong: {got[:4]}"




def interrupted_any_source(rank: int, world: int, src: int | None = None) -> dict:
    """Rank 0 waits in a receive from any rank (or, src=1, the first receive from rank 1
    on its tag, before the channel is made); Ctrl-C (SIGINT) 1 s later. Its
    KeyboardInterrupt carried no note saying what was interrupted (a receive on a made
    channel's does; found by helpers)."""
    import signal
    import threading

    if rank != 0:
        time.sleep(3)
        return {}
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        rr.recv(np.zeros(4, np.float32), src=src, tag=3)
        return {"error": "no error"}
    except KeyboardInterrupt as e:
        return {"error": "KeyboardInterrupt", "notes": getattr(e, "__notes__", []),
                "secs": time.monotonic() - t0}


def helper_thread_refused(rank: int, world: int, how: str) -> dict:
    """Rank 0's first post to rank 1 on tag 3 (`how`: an isend, or a small send, which
    returns early) cannot start its helper thread (a container's pids limit): it fails
    saying so; the next post on that tag is delivered, and destroy() works. Before, the
    unstarted thread stayed registered (destroy() raised "cannot join thread before it is
    started": a helper), and its ticket was never served, so the next post waited without
    end (a review)."""
    import threading

    out: dict = {}
    post = rr.isend if how == "isend" else rr.send
    if rank == 0:
        real = threading.Thread.start

        def refuse(t: threading.Thread) -> None:
            if t.name in ("ringreduce-p2p-connect", "ringreduce-p2p-eager"):
                raise RuntimeError("can't start new thread")
            real(t)

        threading.Thread.start = refuse  # type: ignore[method-assign]
        try:
            post(np.ones(4, np.float32), dst=1, tag=3)
            out["first"] = "no error"
        except RuntimeError as e:
            out["first"] = str(e)
        finally:
            threading.Thread.start = real  # type: ignore[method-assign]
        w = post(np.full(4, 7.0, np.float32), dst=1, tag=3)
        out["second_done"] = w is None or w.wait(20)
    elif rank == 1:
        z = np.zeros(4, np.float32)
        rr.recv(z, src=0, tag=3)
        out["got"] = z.tolist()
    rr.barrier()
    try:
        rr.destroy()
        out["destroy"] = "ok"
    except Exception as e:  # noqa: BLE001 - what the test checks
        out["destroy"] = f"{type(e).__name__}: {e}"
    return out
