"""Workers for tests/test_lazy.py: what a rank keeps open in a sparse (lazy) communicator."""

from __future__ import annotations

import resource

import numpy as np

import ringreduce as rr
from ringreduce import _C, _state


def links(rank: int, world: int) -> dict:
    """link_stats before and after collectives that need peers outside the overlay."""
    comm = _state.current().comm
    before = comm.link_stats()
    x = np.full(7, rank + 1.0, np.float32)
    rr.allreduce(x)  # ring/tree partners: within the overlay
    assert np.allclose(x, world * (world + 1) / 2), x
    after_allreduce = comm.link_stats()
    root = world - 2
    out = rr.gather(np.array([rank], np.int64), dst=root)
    if rank == root:
        assert out.ravel().tolist() == list(range(world)), out
    after_gather = comm.link_stats()
    blocks = np.arange(world * 3, dtype=np.int32) + 100 * rank
    got = np.asarray(rr.all_to_all(blocks)).ravel()
    want = np.concatenate([np.arange(3 * rank, 3 * rank + 3) + 100 * p for p in range(world)])
    assert (got == want).all(), (got, want)
    return {"overlay": _C.overlay_peers(rank, world), "before": before,
            "after_allreduce": after_allreduce, "after_gather": after_gather,
            "after_all_to_all": comm.link_stats()}


def low_fd_limit(rank: int, world: int, soft: int, hard: int) -> dict:
    """Set RLIMIT_NOFILE, then init: return the limit init left, or the error it raised."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        rr.init()
    except RuntimeError as e:
        return {"error": str(e)}
    x = np.full(3, rank + 1.0, np.float64)
    rr.allreduce(x)
    assert np.allclose(x, world * (world + 1) / 2)
    rr.destroy()
    return {"limit": list(resource.getrlimit(resource.RLIMIT_NOFILE))}


def silent_strangers(rank: int, world: int, per_rank: int) -> dict:
    """Sparse mode keeps each rank's listener open for connections made on first use. Rank
    0 opens `per_rank` connections to every listener that never say a word; then every pair
    connects (all-to-all). Those connections must not wait behind the strangers (before,
    each stranger got up to 5 s of the accept in turn: 12 of them timed the job out)."""
    import socket
    import time

    w = _state.current()
    socks = []
    if rank == 0:
        p = w.store_prefix
        for r in range(world):
            host, port = w.store.get(f"{p}addr/{r}").decode().rsplit(":", 1)
            socks += [socket.create_connection((host.strip("[]"), int(port)))
                      for _ in range(per_rank)]
    rr.barrier()
    t0 = time.monotonic()
    blocks = np.arange(world * 3, dtype=np.int32) + 100 * rank
    got = np.asarray(rr.all_to_all(blocks)).ravel()
    want = np.concatenate([np.arange(3 * rank, 3 * rank + 3) + 100 * p for p in range(world)])
    took = time.monotonic() - t0
    rr.barrier()
    for s in socks:
        s.close()
    return {"ok": bool((got == want).all()), "took": took,
            "connections": w.comm.link_stats()["connections"]}


def unwatched_peer(rank: int, world: int, victim: int, root: int, op: str, action: str,
                   root_done: str) -> dict:
    """`root` waits for `victim`, a rank outside its overlay, in `op` (a gather, a first
    receive from it, a receive from any rank that only the victim sends to: "anyrecv", or a
    gather once every pair is connected: "connected") while every
    other rank has done its part and idles: nobody relays anything. The victim is killed,
    stopped, leaves (rr.destroy()), or comes 5 s late ("late": the wait must not fail). A
    receive from any rank whose victim left gets rank 1's message, sent 4 s late. The root
    creates the file `root_done` when its wait is over; the others idle until then."""
    import os
    import signal
    import time

    x = np.arange(5, dtype=np.float32) + 10 * rank
    if op == "connected":
        rr.all_to_all(np.zeros((world, 2), np.float32))
    rr.barrier()
    if rank == victim:
        time.sleep(0.3)
        if action == "exit":
            rr.destroy()
            return {"left": True}
        if action == "late":
            time.sleep(5.0)
        else:
            os.kill(os.getpid(), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
            time.sleep(60)
    time.sleep(1.0)
    t0 = time.monotonic()
    try:
        if op in ("recv", "anyrecv"):
            # A receive from any rank whose victim left: rank 1 sends, 4 s late
            sender = 1 if action == "exit" else victim
            if rank == root:
                src = rr.recv(x, src=None if op == "anyrecv" else victim, tag=3)
                assert src == sender and (x == np.arange(5) + 10 * sender).all(), (src, x)
            elif rank == sender:
                time.sleep(4.0 if sender != victim else 0.0)
                rr.send(x, dst=root, tag=3)
        else:
            out = rr.gather(x, dst=root)
            if rank == root:
                want = np.arange(5) + 10 * np.arange(world)[:, None]
                assert (np.asarray(out) == want).all(), out
    except rr.PeerFailure as e:
        return {"error": str(e), "peer_rank": e.peer_rank, "cause": e.cause,
                "secs": time.monotonic() - t0}
    finally:
        if rank == root:
            open(root_done, "w").close()
    if rank not in (root, victim):
        # idle while the root waits (at most 10 s): the victim's neighbours say nothing
        end = time.monotonic() + 10.0
        while not os.path.exists(root_done) and time.monotonic() < end:
            time.sleep(0.05)
    return {"ok": True, "secs": time.monotonic() - t0}


def dripping_strangers(rank: int, world: int, secs: float) -> dict:
    """A stranger connects to every rank's listener (open in sparse mode) every 0.5 s and
    says nothing, while the ranks all-reduce: no call may wait for it (each cost a 1 s wait
    for its answer before: ~2 s per all-reduce, found by a helper). Returns the calls made
    and the time spent in slow ones (> 0.7 s)."""
    import socket
    import threading
    import time

    w = _state.current()
    stop = threading.Event()
    socks: list = []

    def drip() -> None:
        p = w.store_prefix
        addrs = [w.store.get(f"{p}addr/{r}").decode().rsplit(":", 1) for r in range(world)]
        while not stop.wait(0.5):
            for host, port in addrs:
                socks.append(socket.create_connection((host.strip("[]"), int(port))))

    t = threading.Thread(target=drip, daemon=True)
    rr.barrier()
    if rank == 0:
        t.start()
    calls, slow, t_end = 0, 0.0, time.monotonic() + secs
    x = np.zeros(1000, np.float32)
    while True:
        t0 = time.monotonic()
        x[:] = rank + 1
        rr.allreduce(x)
        assert (x == world * (world + 1) / 2).all(), x
        calls += 1
        took = time.monotonic() - t0
        slow += took if took > 0.7 else 0.0  # (the bug: ~2 s calls; a loaded host: ~0.5 s)
        done = np.array([time.monotonic() > t_end], np.int32)
        rr.allreduce(done)  # every rank stops after the same call
        if done[0] == world:
            break
    stop.set()
    if rank == 0:
        t.join()
    for s in socks:
        s.close()
    return {"calls": calls, "slow": slow, "strangers": len(socks)}
