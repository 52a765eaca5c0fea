"""Rank-side functions for test_shm.py and test_reliability.py (run through _spawn)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import signal
import time

import numpy as np
from _spawn import await_flags, raise_flag, stay_until, victim_after_the_others

import ringreduce as rr
from ringreduce import _state


def plan(rank: int, world: int) -> str:
    return _state._DEFAULT[0].comm.plan if world > 1 else "none"


def _fill_dev_shm(rank: int, leave: int) -> str:
    """Rank 0 fills /dev/shm but `leave` bytes with a file (whose path it returns: rank 0
    removes it); every rank then passes a barrier."""
    filler = "/dev/shm/ringreduce-test-filler"
    if rank == 0:
        st = os.statvfs("/dev/shm")
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - leave)
    rr.barrier()
    return filler


def groups_in_small_dev_shm(rank: int, world: int) -> dict:
    """The world, three groups of every rank and a split by parity, each running a
    multi-chunk all-reduce and all-to-all (checked against numpy), all alive at once."""
    from ringreduce import _C

    groups = [rr.world_group()] + [rr.new_group(list(range(world))) for _ in range(3)]
    groups.append(rr.world_group().split(rank % 2, key=rank))
    wrong = []
    for i, g in enumerate(groups):
        members = g.ranks
        x = (np.arange(3_000_001) % 11 + rank + i).astype(np.float32)
        want = sum((np.arange(3_000_001) % 11 + r + i).astype(np.float32) for r in members)
        rr.allreduce(x, group=g)
        if not np.array_equal(x, want):
            wrong.append(f"allreduce on {members}")
        blk = 700_001
        a = np.repeat(np.arange(g.size, dtype=np.float32) + 100 * rank + i, blk)
        out = rr.all_to_all(a, group=g)
        exp = np.repeat(np.array([g.rank + 100 * r + i for r in members], np.float32), blk)
        if not np.array_equal(out, exp):
            wrong.append(f"all_to_all on {members}")
    for g in groups[1:]:
        g.destroy()
    cap = _C.shm_capacity()
    return {"capacity": cap, "chunk": _C.shm_slot_bytes(world, 4, cap)[0], "wrong": wrong}


def all_pairs_in_small_dev_shm(rank: int, world: int) -> dict:
    """Every rank isends to and irecvs from every other (a point-to-point channel per
    direction and pair): 4 KiB messages, then 256 KiB ones over the same channels; every
    message checked. Reports how much of /dev/shm the host uses after each round."""

    def used() -> int:
        rr.barrier()  # every channel of the round is made and its messages read
        st = os.statvfs("/dev/shm")
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        rr.barrier()
        return used

    def all_pairs(n: int) -> list:
        peers = [p for p in range(world) if p != rank]
        got = {p: np.zeros(n, np.int32) for p in peers}
        works = [rr.isend(np.arange(n, dtype=np.int32) * world + rank, dst=p) for p in peers]
        works += [rr.irecv(got[p], src=p) for p in peers]
        for w in works:
            w.wait()
        return [f"{n} from {p}" for p in peers
                if not np.array_equal(got[p], np.arange(n, dtype=np.int32) * world + p)]

    before = used()
    wrong = all_pairs(1024)
    small = used()
    wrong += all_pairs(65536)
    return {"world": before, "small": small - before, "large": used() - small, "wrong": wrong}


def p2p_slots_into_full_dev_shm(rank: int, world: int) -> dict:
    """A channel made with a small message; then /dev/shm is filled (rank 0 leaves 256 KiB)
    before rank 0 first sends a message that needs its slots (1 MiB): both ranks get an
    error saying /dev/shm is full, soon (no SIGBUS, no timeout), also when rank 1 receives
    from any source (RR_TEST_ANY_SOURCE)."""
    x = np.arange(262144, dtype=np.float32)
    if rank == 0:
        rr.send(x[:16], dst=1)
    else:
        rr.recv(x[:16], src=0)
    filler = _fill_dev_shm(rank, 256 << 10)
    t0, error = time.monotonic(), ""
    try:
        if rank == 0:
            rr.send(x, dst=1)
        elif os.environ.get("RR_TEST_ANY_SOURCE"):
            rr.recv(x)
        else:
            rr.recv(x, src=0)
    except rr.RingReduceError as e:
        error = f"{type(e).__name__}: {e}"
    secs = time.monotonic() - t0
    rr.barrier()  # the world is unharmed: only the channel failed
    if rank == 0:
        os.unlink(filler)
    return {"error": error, "secs": secs}


def p2p_channel_into_full_dev_shm(rank: int, world: int) -> list:
    """/dev/shm is filled (rank 0 leaves 16 KiB) before a pair's first isend/irecv: making
    the channel fails on both ranks; each later try on that tag says why once more (before:
    "rank N was claimed by 3 processes"), and the world still works."""
    filler = _fill_dev_shm(rank, 16 << 10)
    x, errors = np.full(16, rank, np.float32), []
    for _ in range(3):
        try:
            works = [rr.isend(x, dst=1 - rank, tag=3), rr.irecv(x, src=1 - rank, tag=3)]
            for w in works:
                w.wait()
            errors.append("")
        except rr.RingReduceError as e:
            errors.append(f"{type(e).__name__}: {e}")
    rr.barrier()
    if rank == 0:
        os.unlink(filler)
    rr.barrier()
    try:  # room again, but the tag's keys are spent: a blocking (eager) send says so too
        if rank == 0:
            rr.send(x, dst=1, tag=3)
        else:
            rr.recv(x, src=0, tag=3)
        errors.append("")
    except rr.RingReduceError as e:
        errors.append(f"{type(e).__name__}: {e}")
    return errors


def many_idle_groups(rank: int, world: int, n: int) -> dict:
    """`n` groups over every rank, each running an 8-element all-reduce (lines only); then
    the last three run a 3M-element all-reduce, an all-to-all and a broadcast (slots)."""
    def used() -> int:
        rr.barrier()
        st = os.statvfs("/dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    before = used()
    groups = [rr.new_group(list(range(world))) for _ in range(n)]
    wrong = []
    for i, g in enumerate(groups):
        x = np.full(8, rank + i, np.float32)
        rr.allreduce(x, group=g)
        if not np.array_equal(x, np.full(8, sum(r + i for r in range(world)), np.float32)):
            wrong.append(f"small allreduce on group {i}")
    idle_used = used() - before
    big = (np.arange(3_000_001) % 11 + rank).astype(np.float32)
    rr.allreduce(big, group=groups[-1])
    if not np.array_equal(big, sum((np.arange(3_000_001) % 11 + r).astype(np.float32)
                                   for r in range(world))):
        wrong.append("large allreduce")
    a = np.repeat(np.arange(world, dtype=np.float32) + 100 * rank, 300_000)
    out = rr.all_to_all(a, group=groups[-2])
    if not np.array_equal(out, np.repeat(np.array([rank + 100 * r for r in range(world)],
                                                  np.float32), 300_000)):
        wrong.append("all_to_all")
    b = np.full(700_000, rank, np.int32)
    rr.broadcast(b, src=1, group=groups[-3])
    if not (b == 1).all():
        wrong.append("broadcast")
    for g in groups:
        g.destroy()
    return {"idle_used": idle_used, "wrong": wrong}


def group_slots_into_full_dev_shm(rank: int, world: int) -> dict:
    """A group runs a small all-reduce; /dev/shm is filled (256 KiB left); its first large
    all-reduce needs its slots: every member gets an error naming /dev/shm and the ranks
    short of it, soon; the world still works."""
    g = rr.new_group(list(range(world)))
    x = np.ones(8, np.float32)
    rr.allreduce(x, group=g)
    filler = _fill_dev_shm(rank, 256 << 10)
    t0, error = time.monotonic(), ""
    try:
        rr.allreduce(np.ones(1 << 20, np.float32), group=g)
    except rr.RingReduceError as e:
        error = f"{type(e).__name__}: {e}"
    secs = time.monotonic() - t0
    y = np.full(4, rank, np.float32)
    rr.allreduce(y)
    if rank == 0:
        os.unlink(filler)
    return {"error": error, "secs": secs, "world_ok": bool((y == sum(range(world))).all())}


def grow_into_full_dev_shm(rank: int, world: int) -> dict:
    """/dev/shm is filled (rank 0 writes a file leaving 1 MiB) before the first large
    all-reduce: the slots cannot grow to their full chunk size, every rank keeps the
    smaller chunks and every result is still right. Then the same with room to spare in a
    fresh group (its slots grow)."""
    from ringreduce import _C

    filler = _fill_dev_shm(rank, 1 << 20)
    wrong = []
    for it in range(3):
        x = (np.arange(3_000_001) % 13 + rank + it).astype(np.float32)
        rr.allreduce(x)
        want = sum((np.arange(3_000_001) % 13 + r + it).astype(np.float32) for r in range(world))
        if not np.array_equal(x, want):
            wrong.append(f"full: iteration {it}")
    rr.barrier()
    if rank == 0:
        os.unlink(filler)
    rr.barrier()
    g = rr.new_group(list(range(world)))
    y = np.full(3_000_001, rank + 1, np.float64)
    rr.allreduce(y, group=g)
    if not (y == world * (world + 1) / 2).all():
        wrong.append("group after the filler went")
    g.destroy()
    return {"capacity": _C.shm_capacity(), "wrong": wrong}


def group_resident_kib(rank: int, world: int, size: int) -> list:
    """Resident memory (KiB) that one live group over every rank adds, before and after
    its first all-reduce of `size` float32 elements (results checked)."""
    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    x = np.full(size, float(rank + 1), np.float32)
    x += 0  # resident before the first measurement
    rr.barrier()
    before = rss()
    g = rr.new_group(list(range(world)))
    made = rss()
    rr.allreduce(x, group=g)
    used = rss()
    ok = bool((x == world * (world + 1) / 2).all())
    g.destroy()
    return [made - before, used - before, ok]


def shm_entries(rank: int, world: int) -> list:
    """Our job's names in /dev/shm right after init (they must already be unlinked)."""
    return sorted(os.path.basename(p) for p in glob.glob("/dev/shm/rr-*"))


def _expected(op: str, dtype: str, world: int, n: int) -> np.ndarray:
    ins = [((np.arange(n) % 7) + k + 1).astype(np.float64) for k in range(world)]
    if op == "sum":
        e = sum(ins)
    elif op == "prod":
        e = np.prod(ins, axis=0)
    elif op == "min":
        e = np.min(ins, axis=0)
    elif op == "max":
        e = np.max(ins, axis=0)
    elif op in ("band", "bor", "bxor"):
        fn = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        e = fn.reduce(np.stack(ins).astype(np.int64), axis=0)
    else:
        if "float" in dtype:
            e = sum(ins) / world
        else:  # exact, rounded toward zero
            t = sum(x.astype(np.int64) for x in ins)
            e = (np.sign(t) * (np.abs(t) // world)).astype(dtype)
    return e


def allreduce_sweep(rank: int, world: int, counts: list, dtypes: list, ops: list,
                    large_ops: list | None = None) -> list:
    """Exact checks (inputs are small integers, so every dtype represents them exactly);
    returns a digest per case so the test can compare ranks bit for bit. Counts of 100,000
    and more run `large_ops` only (default: all)."""
    out = []
    for n in counts:
        for dt in dtypes:
            for op in ops if large_ops is None or n < 100_000 else large_ops:
                floating = "float" in dt
                if op in ("band", "bor", "bxor") and floating:
                    try:  # refused before anything moves
                        rr.allreduce(np.ones(n, np.float32 if floating else dt), op=op)
                    except ValueError:
                        continue
                    raise AssertionError(f"{dt} {op} was accepted; it must be refused")
                if dt == "bfloat16":
                    import torch

                    x = torch.from_numpy((np.arange(n) % 7 + rank + 1).astype(np.float32)).bfloat16()
                    rr.allreduce(x, op=op)
                    got = x.float().numpy().astype(np.float64)
                    raw = x.view(torch.int16).numpy().tobytes()
                else:
                    x = (np.arange(n) % 7 + rank + 1).astype(dt)
                    rr.allreduce(x, op=op)
                    got = x.astype(np.float64)
                    raw = x.tobytes()
                e = _expected(op, dt, world, n)
                if "int" in dt:  # integer results wrap around like C arithmetic
                    e = e.astype(np.int64).astype(dt).astype(np.float64)
                if dt in ("float16", "bfloat16") and op in ("avg", "prod"):
                    ok = np.allclose(got, e, rtol=1e-2)
                elif "float" in dt and op == "avg":
                    ok = np.allclose(got, e, rtol=1e-6)
                else:
                    ok = np.array_equal(got, e)
                if not ok:
                    bad = int(np.argmax(got != e))
                    raise AssertionError(f"n={n} {dt} {op}: element {bad} got {got[bad]} want {e[bad]}")
                out.append(hashlib.sha1(raw).hexdigest()[:12])
    return out


def broadcast_sweep(rank: int, world: int, counts: list) -> bool:
    for n in counts:
        for root in range(world):
            x = (np.arange(n, dtype=np.int64) * 3 + rank)
            rr.broadcast(x, src=root)
            if not np.array_equal(x, np.arange(n, dtype=np.int64) * 3 + root):
                raise AssertionError(f"broadcast n={n} root={root} wrong")
        rr.barrier()
    return True


def busy_loop(rank: int, world: int, iters: int, n: int) -> float:
    x = np.ones(n, np.float32)
    t = time.perf_counter()
    for i in range(iters):  # rank- and iteration-dependent: a lost or stale part shows
        x[:] = rank + 1 + i % 7
        rr.allreduce(x)
        if x[0] != world * (world + 1) / 2 + world * (i % 7) or x[-1] != x[0]:
            raise AssertionError(f"oversubscribed allreduce {i} gave a wrong result: {x[0]}")
    return time.perf_counter() - t


def victim(rank: int, world: int, victim: int, n: int, how: str) -> dict:
    """The victim stops itself (how="stop": SIGSTOP, frozen with sockets open; "kill":
    SIGKILL); the others time how long until they raise."""
    x = np.ones(n, np.float32)
    for _ in range(5):
        rr.allreduce(x)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)
    t = time.monotonic()
    try:
        for _ in range(1000):
            rr.allreduce(x)
    except rr.RingReduceError as e:
        return {"type": type(e).__name__, "msg": str(e), "after": time.monotonic() - t}
    return {"type": None, "msg": "", "after": time.monotonic() - t}


def count_mismatch(rank: int, world: int) -> dict:
    x = np.ones(1000 + (rank == 1) * 10, np.float32)
    try:
        rr.allreduce(x)
    except rr.RingReduceError as e:
        return {"type": type(e).__name__, "msg": str(e)}
    return {"type": None, "msg": ""}


def traced(rank: int, world: int, n: int) -> list:
    x = np.ones(n, np.float32)
    for _ in range(3):
        rr.allreduce(x)
    rr.broadcast(x, src=0)
    rr.barrier()
    events = _state._DEFAULT[0].comm.trace_events()
    return [[e["collective"], e["seq"], e["bytes"], e["ok"]] for e in events]


def traced_groups(rank: int, world: int) -> None:
    """A group (destroyed before the end), a split and a point-to-point channel, each used,
    next to the world's collectives: every one gets its own row in the trace file."""
    x = np.full(6, rank + 1.0)
    g = rr.new_group()
    for _ in range(2):
        rr.allreduce(x, group=g)
    g.destroy()
    half = rr.world_group().split(rank % 2, key=rank)
    rr.broadcast(x, src=rank % 2, group=half)
    rr.allreduce(x)
    if rank < 2:
        (rr.send if rank == 0 else rr.recv)(x, 1 - rank, tag=5)


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cycles(rank: int, world: int, n_cycles: int) -> dict:
    """init/destroy repeatedly in one process; report fds, threads and /dev/shm growth."""
    import threading

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def nthreads() -> int:
        return len(os.listdir("/proc/self/task"))

    mine = f"/dev/shm/rr-*-{os.getpid()}-*"  # this process's segments: other tests make theirs
    x = np.ones(4096, np.float32)
    rr.init()
    rr.allreduce(x)
    rr.destroy()
    base = (fds(), nthreads(), _rss_kib(), len(glob.glob(mine)))
    for _ in range(n_cycles):
        rr.init()
        rr.allreduce(x)
        rr.destroy()
    # A helper thread that destroy() joined (the store farewell) may still be leaving the
    # kernel's task list for a moment after join() returned: wait up to 2 s for that, so
    # only threads that stay are counted.
    t_end = time.monotonic() + 2.0
    while nthreads() > base[1] and time.monotonic() < t_end:
        time.sleep(0.01)
    end = (fds(), nthreads(), _rss_kib(), len(glob.glob(mine)))
    return {"fds": end[0] - base[0], "threads": end[1] - base[1],
            "rss_kib": end[2] - base[2], "shm": end[3] - base[3],
            "py_threads": threading.active_count()}


def checksum_run(rank: int, world: int, n: int) -> bool:
    x = (np.arange(n) % 5 + rank).astype(np.float32)
    rr.allreduce(x)
    return bool(np.array_equal(x, sum((np.arange(n) % 5 + k) for k in range(world)).astype(np.float32)))


def dump_json(obj: object) -> str:
    return json.dumps(obj)


def hier_sweep(rank: int, world: int, counts: list) -> dict:
    """Results across emulated hosts, with the plan each rank chose."""
    for n in counts:
        for dt, op in (("float32", "sum"), ("int32", "max"), ("float64", "avg"), ("int64", "sum")):
            x = (np.arange(n) % 7 + rank + 1).astype(dt)
            rr.allreduce(x, op=op)
            e = _expected(op, dt, world, n)
            if not np.allclose(x.astype(np.float64), e, rtol=1e-12):
                raise AssertionError(f"n={n} {dt} {op} wrong: {x[:4]} vs {e[:4]}")
        b = np.arange(n, dtype=np.int32) + rank
        rr.broadcast(b, src=world - 1)
        assert np.array_equal(b, np.arange(n, dtype=np.int32) + world - 1)
        g = rr.allgather(np.full(3, rank, np.int64))
        assert np.array_equal(g[:, 0], np.arange(world))
    rr.barrier()
    return {"plan": _state._DEFAULT[0].comm.plan}


def group_plans(rank: int, world: int, member_lists: list) -> dict:
    """Each group of `member_lists` (made by every rank, in order): its transport plan on
    its members, and an all-reduce and a broadcast checked against numpy."""
    plans = {}
    for members in member_lists:
        g = rr.new_group(members)
        if g is None:
            continue
        for n in (3, 70_001):
            x = (np.arange(n) % 5 + rank).astype(np.int64)
            rr.allreduce(x, group=g)
            want = (np.arange(n) % 5) * len(members) + sum(members)
            assert np.array_equal(x, want), (members, n, x[:4], want[:4])
            b = np.full(n, rank, np.float32)
            rr.broadcast(b, src=members[-1], group=g)
            assert (b == members[-1]).all(), (members, n)
        plans[",".join(map(str, members))] = g.comm.plan
        g.destroy()
    return plans


def link_cut(rank: int, world: int, n: int) -> dict:
    """Loop all-reduces until the test cuts a link; report how each rank failed."""
    x = np.ones(n, np.float32)
    rr.allreduce(x)
    with open(f"/tmp/rr_linkcut_ready_{os.environ['MASTER_PORT']}_{rank}", "w"):
        pass
    t = None
    try:
        for _ in range(200000):
            rr.allreduce(x)
            if t is None and os.path.exists(f"/tmp/rr_linkcut_cut_{os.environ['MASTER_PORT']}"):
                t = time.monotonic()
    except rr.RingReduceError as e:
        return {"type": type(e).__name__, "msg": str(e),
                "after": time.monotonic() - (t or time.monotonic())}
    return {"type": None, "msg": "", "after": 0}


def flood_target(rank: int, world: int, outdir: str, seconds: float) -> dict:
    """Publish this rank's listening and heartbeat addresses (from the store), then run
    checked all-reduces for `seconds` while the test floods those ports."""
    from ringreduce import _rendezvous

    store = next(iter(_rendezvous._STORES.values()))
    p = _state.current().store_prefix
    info = {"tcp": store.get(p + f"addr/{rank}").decode(),
            "udp": store.get(p + f"hb/{rank}").decode()}
    with open(os.path.join(outdir, f"addr_{rank}.json"), "w") as f:
        json.dump(info, f)
    iters = wrong = 0
    end = time.monotonic() + seconds
    want = sum((np.arange(10_000) % 11 + k) for k in range(world)).astype(np.float32)
    while True:
        x = (np.arange(10_000) % 11 + rank).astype(np.float32)
        rr.allreduce(x)
        wrong += int(np.count_nonzero(x != want))
        iters += 1
        if iters == 50:
            rss0 = _rss_kib()  # warm: buffers and arenas exist; the flood starts about now
        if iters % 50 == 0:  # stop together: every rank must run the same collectives
            stop = np.array([time.monotonic() > end], np.int32)
            rr.allreduce(stop, op="max")
            if stop[0]:
                break
    return {"iters": iters, "wrong": wrong, "rss_growth_kib": _rss_kib() - rss0}


def init_loop(rank: int, world: int, cycles: int, job: int, sync_dir: str, jobs: int) -> dict:
    """init / checked all-reduces / destroy, `cycles` times, while other jobs with the same
    RINGREDUCE_SECRET do the same on this host: every cycle starts when every rank of every
    job reached it (files in sync_dir), so the jobs' inits overlap. Each job's inputs differ
    (`job`), so a segment shared across jobs shows up as a wrong result, not only as an
    error."""
    wrong = []
    failed = os.path.join(sync_dir, "failed")
    try:
        for i in range(cycles):
            open(os.path.join(sync_dir, f"{i}-{job}-{rank}"), "w").close()
            deadline = time.monotonic() + 30
            while len(glob.glob(os.path.join(sync_dir, f"{i}-*"))) < jobs * world:
                if os.path.exists(failed) or time.monotonic() > deadline:
                    raise TimeoutError(f"cycle {i}: gave up waiting for the other job's ranks "
                                       f"(one of them failed, or 30 s passed)")
                time.sleep(0.001)
            rr.init()
            for n in (9, 5000, 300_001):  # inline, one-round small path, chunked pipeline
                x = (np.arange(n) % 13 + rank + 1000 * job + i).astype(np.float64)
                rr.allreduce(x)
                want = sum((np.arange(n) % 13 + k + 1000 * job + i) for k in range(world))
                if not np.array_equal(x, want):
                    bad = int(np.argmax(x != want))
                    wrong.append(f"cycle {i} n={n}: element {bad} got {x[bad]} want {want[bad]}")
            rr.destroy()
    except BaseException:
        open(failed, "w").close()  # the other job stops waiting for us at once
        raise
    return {"wrong": wrong, "pid": os.getpid()}


def spin_choice(rank: int, world: int) -> dict:
    """What init decided about spinning (the core's one setting for sockets and shared
    memory), and the affinity mask this rank ran under."""
    o = _state._DEFAULT[0].options
    return {"spin_us": o.get("spin_us"),
            "affinity": sorted(os.sched_getaffinity(0))}


def planned_sweep(rank: int, world: int, counts: list) -> bool:
    """float32 all-reduces of `counts` elements with algo "auto", checked exactly (the
    test reads which algorithm each one ran from the DEBUG log)."""
    for n in counts:
        x = (np.arange(n) % 5 + rank * 3).astype(np.float32)
        rr.allreduce(x)
        want = (np.arange(n) % 5 * world + 3 * world * (world - 1) // 2).astype(np.float32)
        if not np.array_equal(x, want):
            raise AssertionError(f"n={n}: {x[:4]} vs {want[:4]}")
    return True


def output_sweep(rank: int, world: int, counts: list) -> dict:
    """Every shared-memory collective that writes the caller's buffer, at `counts` elements
    (odd lengths, odd offsets into a larger array), checked against numpy."""
    wrong = []

    def expect(name: str, got: np.ndarray, want: np.ndarray) -> None:
        if not np.array_equal(got, want):
            bad = int(np.argmax(got != want))
            wrong.append(f"{name}: element {bad} got {got.flat[bad]} want {want.flat[bad]}")

    def data(r: int, n: int, salt: int = 0) -> np.ndarray:
        return (np.arange(n, dtype=np.int64) * 7 + r * 1000 + salt) % 251

    for n in counts:
        # In place, at an odd byte offset of a larger uint8 array (unaligned for the stores).
        base = np.zeros(n + 3, np.uint8)
        x = base[3:]
        x[:] = data(rank, n)
        rr.allreduce(x, op="max")
        expect(f"allreduce n={n}", x, np.max([data(r, n) for r in range(world)], axis=0))
        parts = [data(rank, k, salt=k).astype(np.float32) for k in (n, 5, n // 3 + 1)]
        rr.allreduce_coalesced(parts)
        for k, p in zip((n, 5, n // 3 + 1), parts):
            expect(f"allreduce_coalesced n={n} piece {k}", p,
                   sum(data(r, k, salt=k) for r in range(world)).astype(np.float32))
        out = np.empty(world * n + 1, np.uint8)[1:].reshape(world, n)
        rr.allgather(data(rank, n).astype(np.uint8), out=out)
        expect(f"allgather n={n}", out, np.stack([data(r, n) for r in range(world)]).astype(np.uint8))
        send = np.stack([data(rank, n, salt=p) for p in range(world)]).astype(np.int32)
        got = np.empty_like(send)
        rr.all_to_all(send, out=got)
        expect(f"all_to_all n={n}", got, np.stack([data(p, n, salt=rank) for p in range(world)]).astype(np.int32))
        b = data(rank, n).astype(np.int16)
        rr.broadcast(b, src=world - 1)
        expect(f"broadcast n={n}", b, data(world - 1, n).astype(np.int16))
        g = rr.gather(data(rank, n).astype(np.uint8), dst=0)
        if rank == 0:
            expect(f"gather n={n}", g, np.stack([data(r, n) for r in range(world)]).astype(np.uint8))
        s_out = np.empty(n, np.int32)
        src = np.stack([data(r, n, salt=9) for r in range(world)]).astype(np.int32)
        rr.scatter(s_out, src=world - 1, x=src if rank == world - 1 else None)
        expect(f"scatter n={n}", s_out, data(rank, n, salt=9).astype(np.int32))
    return {"wrong": wrong}


def group_in_full_dev_shm(rank: int, world: int) -> dict:
    """The world's segments fit /dev/shm, the group's do not all fit: the rank whose segment
    does not fit fails, and the other, waiting in the store for its segment name (a group on
    one host has no connection to hear an abort on), must stop at once. Rank 0 keeps the
    store up for 12 s after its own failure, so a waiting rank 1 cannot learn of it from the
    store going away. A group's segment is ~40 KiB before its first large collective: rank 0
    fills /dev/shm but 60 KiB first (one segment fits, not two)."""
    filler = _fill_dev_shm(rank, 60 << 10)
    t0 = time.monotonic()
    try:
        rr.new_group(list(range(world)))
        out = {"error": None, "secs": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}", "secs": time.monotonic() - t0}
        if rank == 0 and "/dev/shm is full" in out["error"]:
            time.sleep(12)
    if rank == 0:
        os.unlink(filler)
    return out


def eager_send_without_room(rank: int, world: int, stage: str) -> dict:
    """2 ranks, tag 0 used both ways; /dev/shm is then filled. Rank 0 sends its first
    message on tag 1, which returns early (a helper thread makes the channel and sends it):
    `stage` "make": 16 B, with 8 KiB of /dev/shm left the channel cannot be made; "slots":
    64 KiB, with 400 KiB left the channel is made but its 2 MiB of slots cannot be mapped.
    Then rank 0 receives from rank 1 on tag 0. Rank 1, told on tag 1, catches the error
    and stays alive (no more calls) for 8 s. Rank 0's receive must fail at once, saying
    why (it waited for RINGREDUCE_TIMEOUT: the send's failure was only logged; a helper)."""
    x = np.full(4, rank + 1.0, np.float32)
    rr.send(x, dst=1 - rank) if rank == 0 else rr.recv(x, src=0)
    rr.send(x, dst=1 - rank) if rank == 1 else rr.recv(x, src=1)
    rr.barrier()  # rank 0 received: the tag-0 channels are made before /dev/shm fills
    filler = _fill_dev_shm(rank, 400 << 10 if stage == "slots" else 8 << 10)
    n = 16384 if stage == "slots" else 4
    out: dict = {"error": None}
    t0 = time.monotonic()
    try:
        if rank == 0:
            rr.send(np.ones(n, np.float32), dst=1, tag=1)
            rr.recv(x, src=1)
        else:
            rr.recv(np.zeros(n, np.float32), src=0, tag=1)
    except Exception as e:  # noqa: BLE001 - what the test checks
        out["error"] = f"{type(e).__name__}: {e}"
    out["secs"] = time.monotonic() - t0
    if rank == 1:
        time.sleep(8.0)  # alive, told, silent: only rank 0's own news can end its wait
    else:
        os.unlink(filler)
    return out


def frozen_after_one_left(rank: int, world: int) -> dict:
    """3 ranks: rank 2 does its part of a reduce to rank 0 and calls destroy() (its process
    lives on); rank 1 freezes (SIGSTOP) before its part; rank 0 waits in the reduce. Rank 0
    must name rank 1, the frozen one -- before, rank 2's heartbeats stopped first (it left),
    so rank 0 named rank 2 ("no heartbeat for 4 s") while it waited for rank 1."""
    x = np.ones(10, np.float32)
    rr.allreduce(x)
    if rank == 2:
        rr.reduce(x, dst=0)
        rr.destroy()
        time.sleep(20)
        return {}
    if rank == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGSTOP)
        return {}
    t0 = time.monotonic()
    try:
        rr.reduce(x, dst=0)
        return {"error": "no error"}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "peer_rank": getattr(e, "peer_rank", None),
                "secs": time.monotonic() - t0}


def destroy_after_a_death(rank: int, world: int) -> dict:
    """Rank world-1 is killed; the others fail their next all-reduce, then destroy(). Before,
    rank 0 (the store's host) waited out the farewell cap (1 s) for the dead rank's goodbye,
    and the others for rank 0: now the first survivor that found it dead speaks for it."""
    x = np.full(100, rank + 1, np.float32)
    rr.allreduce(x)
    if victim_after_the_others(rank, world - 1, range(world), "first"):
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        rr.allreduce(x)
        err = "no error"
    except rr.PeerFailure as e:
        err = f"PeerFailure: {e}"
    # Both survivors start destroy() together: each waits for the other's goodbye, so the
    # time also held how much later the other failed (load, not the farewell).
    raise_flag(f"failed{rank}")
    await_flags([f"failed{r}" for r in range(world - 1)], 10)
    t0 = time.monotonic()
    rr.destroy()
    return {"error": err, "destroy_secs": time.monotonic() - t0}


def late_rank(rank: int, world: int, op: str) -> dict:
    """The last rank enters a small collective 2.5 s late; the others (RINGREDUCE_TIMEOUT=1)
    time out first -- their inputs already published in shared memory. The late rank must
    fail too (as gloo's does), not return as if the collective had completed everywhere.
    The ranks stay alive (the store) until the late rank is done."""
    late = world - 1
    x = np.arange(10.0) + rank
    calls = {"allreduce": lambda: rr.allreduce(x), "barrier": rr.barrier,
             "allgather": lambda: rr.allgather(x),
             "broadcast": lambda: rr.broadcast(x, src=late)}
    store = _state._DEFAULT[0].store
    if rank == late:
        time.sleep(2.5)
    t0 = time.monotonic()
    try:
        calls[op]()
        out = {"type": None, "msg": ""}
    except rr.RingReduceError as e:
        out = {"type": type(e).__name__, "msg": str(e)}
    out["secs"] = time.monotonic() - t0
    store.add("done", 1)
    stay_until(store, "done", world, rank, world, 30)
    return out
