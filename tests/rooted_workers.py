"""Rank-side code of tests/test_rooted.py: reduce, gather, scatter and all_to_all checked
against numpy references computed from rank-dependent inputs."""

from __future__ import annotations

from typing import Any

import numpy as np

import ringreduce as rr

# 40_001: several 64 KiB segments (the tests' RINGREDUCE_SEGMENT_BYTES) in every dtype, the
# last one short; 1_000_003: many, for the two dtypes that run it.
LENGTHS = [0, 1, 3, 5, 1000, 40_001, 1_000_003]
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.float16]


def _x(rank: int, n: int, dtype: Any, salt: int = 0) -> np.ndarray:
    v = (np.arange(n) * 7 + rank * 31 + salt) % 13
    return v.astype(dtype)


def _want(op: str, xs: list) -> np.ndarray:
    if op in ("sum", "avg"):
        acc = np.sum([x.astype(np.float64) for x in xs], axis=0) / (len(xs) if op == "avg" else 1)
    elif op == "prod":
        acc = np.prod([x.astype(np.float64) for x in xs], axis=0)
    elif op == "max":
        acc = np.max(xs, axis=0)
    elif op == "min":
        acc = np.min(xs, axis=0)
    else:  # band
        acc = xs[0].copy()
        for x in xs[1:]:
            acc &= x
    return np.asarray(acc).astype(xs[0].dtype)


def matrix(rank: int, world: int) -> list:
    fails: list = []
    ranks = list(range(world))
    for n in LENGTHS:
        for dt in DTYPES:
            if n > 50_000 and dt not in (np.float32, np.uint8):
                continue
            for op in ("sum", "max", "min", "prod", "band"):
                if op == "band" and np.dtype(dt).kind == "f":
                    continue
                if op == "prod" and n > 5000:
                    continue
                for root in ranks if n < 5000 else [world - 1]:
                    x = _x(rank, n, dt, salt=root)
                    orig = x.copy()
                    rr.reduce(x, dst=root, op=op)
                    want = _want(op, [_x(r, n, dt, salt=root) for r in ranks])
                    if rank == root:
                        tol = 0 if dt != np.float16 else 1e-2
                        if not np.allclose(x.astype(np.float64), want.astype(np.float64),
                                           rtol=tol, atol=tol):
                            fails.append(f"reduce {op} n={n} {np.dtype(dt).name} root={root}")
                    elif not np.array_equal(x, orig):
                        fails.append(f"reduce changed a non-root's x: n={n} {np.dtype(dt).name}")
            for root in ranks if n < 5000 else [0]:
                x = _x(rank, n, dt, salt=1)
                out = rr.gather(x, dst=root)
                if rank == root:
                    want = np.stack([_x(r, n, dt, salt=1) for r in ranks])
                    if out is None or out.shape != (world, n) or not np.array_equal(out, want):
                        fails.append(f"gather n={n} {np.dtype(dt).name} root={root}")
                elif out is not None:
                    fails.append("gather returned something off the root")
                full = np.stack([_x(r, n, dt, salt=2) for r in ranks]) if rank == root else None
                mine = np.empty(n, dt)
                rr.scatter(mine, src=root, x=full)
                if not np.array_equal(mine, _x(rank, n, dt, salt=2)):
                    fails.append(f"scatter n={n} {np.dtype(dt).name} root={root}")
    # large reduces to every root: the shared-memory schedule's root-only copy-out, with
    # 16-bit floats (float32 accumulation) and avg (the slices are final before collection)
    for dt, op in ((np.float16, "sum"), (np.float32, "avg")):
        for root in ranks:
            x = _x(rank, 300_007, dt, salt=root + 5)
            orig = x.copy()
            rr.reduce(x, dst=root, op=op)
            want = _want(op, [_x(r, 300_007, dt, salt=root + 5) for r in ranks])
            if rank == root:
                if not np.allclose(x.astype(np.float64), want.astype(np.float64), rtol=1e-3,
                                   atol=1e-3):
                    fails.append(f"large reduce {op} {np.dtype(dt).name} root={root}")
            elif not np.array_equal(x, orig):
                fails.append(f"large reduce changed a non-root's x: {np.dtype(dt).name}")
    # all_to_all: equal blocks (2-D), then uneven rows with zeros
    for rows_per in (0, 1, 3, 4097, 300_001):  # the last: blocks of 5 shm chunks
        x = np.stack([_x(rank * world + p, 2 * rows_per, np.float32).reshape(rows_per, 2)
                      for p in ranks]).reshape(world * rows_per, 2)
        out = rr.all_to_all(x)
        want = np.concatenate([_x(p * world + rank, 2 * rows_per, np.float32).reshape(rows_per, 2)
                               for p in ranks])
        if out.shape != want.shape or not np.array_equal(out, want):
            fails.append(f"all_to_all equal rows={rows_per}")

    def cnt(a: int, b: int) -> int:  # rows rank a sends to rank b
        return (a * 3 + b * 5) % 4

    send = [cnt(rank, p) for p in ranks]
    recv = [cnt(p, rank) for p in ranks]
    x = np.concatenate([np.full(cnt(rank, p), rank * 100 + p, np.int64) for p in ranks])
    out = rr.all_to_all(x, send_counts=send, recv_counts=recv)
    want = np.concatenate([np.full(cnt(p, rank), p * 100 + rank, np.int64) for p in ranks])
    if not np.array_equal(out, want):
        fails.append(f"all_to_all uneven {out} != {want}")
    # rank 0 sends nothing (x has no rows) but receives p rows of 3 from each rank p: before,
    # its row width came from x's element count (0), so it expected 0 bytes and failed
    send = [0] * world if rank == 0 else [rank if p == 0 else 0 for p in ranks]
    recv = [p if rank == 0 else 0 for p in ranks]
    x = np.full((sum(send), 3), rank + 0.5, np.float32)
    out = rr.all_to_all(x, send_counts=send, recv_counts=recv)
    want = np.concatenate([np.full((recv[p], 3), p + 0.5, np.float32) for p in ranks])
    if out.shape != want.shape or not np.array_equal(out, want):
        fails.append(f"all_to_all from an empty x: {out.shape} {out.tolist()[:4]}")
    # uneven and large: rounds of different lengths in chunks (0 to ~3.4 shm chunks per
    # block), this rank's own block copied while the exchange waits
    send = [cnt(rank, p) * 150_001 for p in ranks]
    recv = [cnt(p, rank) * 150_001 for p in ranks]
    x = np.concatenate([np.arange(send[p], dtype=np.int32) * 7 + rank * 100 + p for p in ranks])
    out = rr.all_to_all(x, send_counts=send, recv_counts=recv)
    want = np.concatenate([np.arange(recv[p], dtype=np.int32) * 7 + p * 100 + rank for p in ranks])
    if out.shape != want.shape or not np.array_equal(out, want):
        fails.append("all_to_all uneven, large blocks")
    # async, and on a group
    w = rr.all_to_all(np.arange(world, dtype=np.float64) + 10 * rank, async_op=True)
    if not np.array_equal(w.result(), np.arange(world) * 10.0 + rank):
        fails.append("all_to_all async")
    if world >= 3:
        g = rr.new_group([0, world - 1])
        if (g is None) != (rank not in (0, world - 1)):
            fails.append(f"new_group([0, {world - 1}]) returned {g!r} on rank {rank}")
        elif g is not None:
            x = np.full(4, float(rank + 1))
            rr.reduce(x, dst=world - 1, group=g)
            if rank == world - 1 and not np.array_equal(x, np.full(4, float(world + 1))):
                fails.append(f"reduce on a group: {x}")
            out = rr.gather(np.array([rank]), dst=0, group=g)
            if rank == 0 and out.tolist() != [[0], [world - 1]]:
                fails.append(f"gather on a group: {out}")
    _in_place(rank, world, fails)
    _aliasing(rank, world, fails)
    # bad input, before any data moves
    buf = np.zeros(2 * world + 1)
    bad = [
        ("reduce dst", lambda: rr.reduce(np.ones(3), dst=world)),
        ("gather out size", lambda: rr.gather(np.ones(3), dst=rank, out=np.ones(2))),
        ("scatter no x", lambda: rr.scatter(np.ones(3), src=rank)),
        ("all_to_all rows", lambda: rr.all_to_all(np.ones(world + 1)) if world > 1
         else (_ for _ in ()).throw(ValueError())),
        ("all_to_all counts", lambda: rr.all_to_all(np.ones(4), send_counts=[1] * (world + 1))),
        # rows of no elements where x's have 4: the peers' blocks went past out's end before
        ("all_to_all empty out rows", lambda: rr.all_to_all(np.ones((world, 4)),
                                                            out=np.zeros((world, 0)))),
        ("band float", lambda: rr.reduce(np.ones(3), dst=0, op="band")),
        # the source's out overlapping x other than as its own block (here: shifted by one)
        ("scatter out overlaps", lambda: rr.scatter(buf[1:3], src=rank,
                                                    x=buf[:2 * world].reshape(world, 2))),
    ]
    for what, call in bad:
        try:
            call()
            fails.append(f"bad {what} did not raise")
        except (ValueError, TypeError):
            pass
    rr.barrier()
    return fails


def count_mismatch(rank: int, world: int) -> str:
    """Rank 1 gathers 4 elements, the others 3: the root raises CollectiveMismatch naming
    rank 1; senders (whose frames left) learn it at their next collective, never a hang."""
    try:
        rr.gather(np.ones(4 if rank == 1 else 3), dst=0)
        rr.barrier()
        return "no error"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _clones_during(fn: Any) -> int:
    """How many times fn() cloned a tensor."""
    import torch

    n, clone = [0], torch.Tensor.clone

    def counted(*a: Any, **k: Any) -> Any:
        n[0] += 1
        return clone(*a, **k)
    torch.Tensor.clone = counted
    try:
        fn()
    finally:
        torch.Tensor.clone = clone
    return n[0]


def torch_rooted(rank: int, world: int) -> list:
    """dist.reduce / gather / scatter / all_to_all_single / reduce_scatter on the ringreduce
    backend, complex tensors included."""
    import torch
    import torch.distributed as dist

    fails: list = []
    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    t = torch.arange(6, dtype=torch.float32) + rank
    dist.reduce(t, dst=world - 1)
    if rank == world - 1 and not torch.equal(
            t, sum(torch.arange(6, dtype=torch.float32) + r for r in range(world))):
        fails.append(f"dist.reduce {t}")
    gl = [torch.empty(2, dtype=torch.int64) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank, -rank]), gather_list=gl, dst=0)
    if rank == 0 and [g.tolist() for g in gl] != [[r, -r] for r in range(world)]:
        fails.append(f"dist.gather {gl}")
    o = torch.empty(3)
    sl = [torch.full((3,), float(r)) for r in range(world)] if rank == 1 % world else None
    dist.scatter(o, scatter_list=sl, src=1 % world)
    if not torch.equal(o, torch.full((3,), float(rank))):
        fails.append(f"dist.scatter {o}")
    x = torch.arange(world * 2, dtype=torch.float64) + 100 * rank
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    want = torch.tensor([100.0 * p + 2 * rank + k for p in range(world) for k in range(2)],
                        dtype=torch.float64)
    if not torch.equal(y, want):
        fails.append(f"all_to_all_single {y} != {want}")
    dist.all_to_all_single(x, x)  # in place (gloo runs it; it was refused as overlapping)
    if not torch.equal(x, want):
        fails.append(f"all_to_all_single in place {x} != {want}")
    for lo in (2 * world, world):  # halves of one storage (apart: no copy), overlapping ones
        buf = torch.arange(4 * world, dtype=torch.float64) + 100 * rank
        x, y = buf[:2 * world], buf[lo:lo + 2 * world]
        copies = _clones_during(lambda: dist.all_to_all_single(y, x))  # noqa: B023
        if not torch.equal(y, want) or copies != (lo < 2 * world):
            fails.append(f"all_to_all_single on one storage ({lo}): {y}, {copies} copies")
    ins = [rank + 1] * world  # rank r sends r+1 rows to everyone
    x = torch.full((sum(ins),), float(rank))
    outs = [p + 1 for p in range(world)]
    y = torch.empty(sum(outs))
    dist.all_to_all_single(y, x, output_split_sizes=outs, input_split_sizes=ins)
    want = torch.cat([torch.full((p + 1,), float(p)) for p in range(world)])
    if not torch.equal(y, want):
        fails.append(f"all_to_all_single splits {y}")
    outl = [torch.empty(1) for _ in range(world)]
    dist.all_to_all(outl, [torch.tensor([float(rank * 10 + p)]) for p in range(world)])
    if [o.item() for o in outl] != [float(p * 10 + rank) for p in range(world)]:
        fails.append(f"dist.all_to_all {outl}")
    # complex: torch itself views all_reduce / broadcast / all_gather inputs as real pairs,
    # but hands reduce and reduce_scatter the complex tensor.
    c = torch.tensor([1 + 2j, rank - 1j], dtype=torch.complex64)
    dist.reduce(c, dst=0)
    want = sum(torch.tensor([1 + 2j, r - 1j], dtype=torch.complex64) for r in range(world))
    if rank == 0 and not torch.equal(c, want):
        fails.append(f"dist.reduce complex {c} != {want}")
    cin = torch.tensor([complex(p, rank) for p in range(world) for _ in range(2)],
                       dtype=torch.complex128)
    cout = torch.empty(2, dtype=torch.complex128)
    dist.reduce_scatter_tensor(cout, cin)
    want = torch.full((2,), complex(rank * world, sum(range(world))), dtype=torch.complex128)
    if not torch.equal(cout, want):
        fails.append(f"dist.reduce_scatter_tensor complex {cout} != {want}")
    # reduce_scatter of a list whose tensors differ in size: input_list[r] has rank r's
    # output size (r + 1 elements) on every rank.
    ins = [torch.arange(1.0, p + 2) * (rank + 1) for p in range(world)]
    out = torch.zeros(rank + 1)
    dist.reduce_scatter(out, ins)
    want = torch.arange(1.0, rank + 2) * sum(r + 1 for r in range(world))
    if not torch.equal(out, want):
        fails.append(f"dist.reduce_scatter uneven {out} != {want}")
    if [t.tolist() for t in ins] != [(torch.arange(1.0, p + 2) * (rank + 1)).tolist()
                                     for p in range(world)]:
        fails.append("dist.reduce_scatter uneven changed its inputs")
    try:  # this rank's own input does not match its output: refused here, nothing moves
        dist.reduce_scatter(torch.zeros(2), [torch.ones(1)] * world)
        fails.append("reduce_scatter with input_list[rank] != output size accepted")
    except ValueError as e:
        if "input_list[" not in str(e):
            fails.append(f"reduce_scatter size error unclear: {e}")
    dist.barrier()
    dist.destroy_process_group()
    return fails


def complex_sweep(rank: int, world: int) -> list:
    """complex64 / complex128 (numpy and torch) through every collective: they move and add
    as pairs of their real type; reductions other than sum / avg are refused on every rank
    before anything moves."""
    import torch

    fails: list = []

    def z(r: int, n: int, dt: Any, salt: int = 0) -> np.ndarray:
        k = np.arange(n)
        return ((k * 3 + r + salt) % 7 + 1j * ((k + 2 * r + salt) % 5 - 2)).astype(dt)

    def check(name: str, got: Any, want: np.ndarray) -> None:
        g = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
        if g.dtype != want.dtype or g.shape != want.shape or not np.allclose(g, want, rtol=1e-6):
            fails.append(f"{name}: got {g.dtype} {g.shape} {g.ravel()[:3]}, want {want.dtype} "
                         f"{want.shape} {want.ravel()[:3]}")

    last = world - 1
    for dt in (np.complex64, np.complex128):
        for kind in ("numpy", "torch"):
            wrap = (lambda a: torch.from_numpy(a)) if kind == "torch" else (lambda a: a)
            for n in (1, 5, 300_001):
                tag = f"{kind} {np.dtype(dt).name} n={n}"
                everyone = [z(r, n, dt) for r in range(world)]
                x = wrap(z(rank, n, dt))
                rr.allreduce(x, op="avg")
                check(f"allreduce avg {tag}", x, (sum(everyone) / world).astype(dt))
                x = wrap(z(rank, n, dt))
                rr.reduce(x, dst=last)
                if rank == last:
                    check(f"reduce {tag}", x, sum(everyone).astype(dt))
                x = wrap(z(rank, n, dt))
                rr.broadcast(x, src=last)
                check(f"broadcast {tag}", x, everyone[last])
                check(f"allgather {tag}", rr.allgather(wrap(z(rank, n, dt))), np.stack(everyone))
                g = rr.gather(wrap(z(rank, n, dt)), dst=0)
                if rank == 0:
                    check(f"gather {tag}", g, np.stack(everyone))
                out = wrap(np.empty(n, dt))
                src = wrap(np.stack([z(last, n, dt, salt=p) for p in range(world)]))
                rr.scatter(out, src=last, x=src if rank == last else None)
                check(f"scatter {tag}", out, z(last, n, dt, salt=rank))
                blocks = [z(rank, n, dt, salt=p) for p in range(world)]
                got = rr.all_to_all(wrap(np.concatenate(blocks)))
                check(f"all_to_all {tag}", got,
                      np.concatenate([z(p, n, dt, salt=rank) for p in range(world)]))
                rs = rr.reduce_scatter(wrap(np.concatenate([z(rank, n, dt, salt=p)
                                                            for p in range(world)])))
                check(f"reduce_scatter {tag}", rs,
                      sum(z(r, n, dt, salt=rank) for r in range(world)).astype(dt))
            for op in ("max", "prod"):
                try:
                    rr.allreduce(wrap(z(rank, 4, dt)), op=op)
                    fails.append(f"allreduce {op} on {kind} {np.dtype(dt).name} was accepted")
                except ValueError as e:
                    if "complex" not in str(e):
                        fails.append(f"allreduce {op} refusal does not say why: {e}")
    try:  # 3 complex numbers do not split over 2 ranks, though their 6 halves would
        rr.reduce_scatter(np.ones(3 * world - 1 if world > 1 else 2, np.complex64))
        if world > 1:
            fails.append("reduce_scatter of a complex count not divisible by world accepted")
    except ValueError as e:
        if world == 1:
            fails.append(f"world 1: {e}")
    # Its own out, where x's first dimension does not divide: k complex numbers, not their
    # 2k halves (refused: "out must hold 3 elements ..., got 6"; found by a helper)
    got = rr.reduce_scatter(np.full((3, world), 1 + 2j, np.complex64))
    if got.size != 3 or not np.array_equal(got.ravel(), np.full(3, world * (1 + 2j),
                                                                 np.complex64)):
        fails.append(f"reduce_scatter of complex (3, {world}): {got!r}")
    got = rr.reduce_scatter(np.array([1 + 2j] * world, np.complex64).reshape(world, 1)[:, 0])
    if not np.array_equal(got, np.full(1, world * (1 + 2j), np.complex64)):
        fails.append(f"reduce_scatter of {world} complex numbers: {got!r}")
    rr.barrier()
    return fails


def _aliasing(rank: int, world: int, fails: list) -> None:
    """An all-gather whose x straddles two blocks of out (shared memory published x after
    this rank's block had overwritten its first half: wrong on every rank); read-only
    buffers where the call only reads them (a broadcast's source, a send)."""
    ranks = list(range(world))
    for per in (8, 100_000) if world > 1 else ():
        out = np.zeros(world * per, np.float32)
        x = out[per // 2:per // 2 + per]
        x[:] = np.arange(per, dtype=np.float32) + 1000 * rank
        got = rr.allgather(x, out=out)
        want = np.concatenate([np.arange(per, dtype=np.float32) + 1000 * p for p in ranks])
        if not np.array_equal(got, want):
            fails.append(f"allgather with x straddling out's blocks, per={per}")
    # reduce_scatter whose out straddles x's blocks (shared memory: wrong on every rank with
    # a block after its own -- found by a helper), and in place as x's own block.
    for per, shift in ((8, 1), (100_003, 1), (100_003, 0)) if world > 1 else ((8, 0),):
        xs = [(np.arange(world * per, dtype=np.int64) * 7 + p * 1_000_003) % 2**31
              for p in ranks]
        x = xs[rank].copy()
        at = rank * per + (shift if rank < world - 1 else -shift)
        got = rr.reduce_scatter(x, out=x[at:at + per])
        if not np.array_equal(got, sum(xs)[rank * per:(rank + 1) * per]):
            fails.append(f"reduce_scatter with out at x[{at}:], per={per}")
    for xs in (np.zeros((world, 0), np.float32), np.zeros((world, 0, 3))):  # empty rows
        if rr.all_to_all(xs).shape != xs.shape:
            fails.append(f"all_to_all of shape {xs.shape}")
    ro = np.arange(5.0) if rank == 0 else np.zeros(5)
    ro.flags.writeable = rank != 0
    rr.broadcast(ro, src=0)
    if not np.array_equal(ro, np.arange(5.0)):
        fails.append("broadcast from a read-only source")
    if world > 1:
        if rank == 0:
            rr.send(ro, dst=world - 1, tag=7)
        elif rank == world - 1:
            got = np.zeros(5)
            rr.recv(got, src=0, tag=7)
            if not np.array_equal(got, np.arange(5.0)):
                fails.append("send of a read-only array")


def _in_place(rank: int, world: int, fails: list) -> None:
    """In place at the root: gather's x is its own block of out, scatter's out its own block
    of x (shared memory copies it while the peers read theirs)."""
    ranks = list(range(world))
    for root in {0, world - 1}:
        per = 1 << 20
        full = np.zeros((world, per), np.float32)
        x = full[rank] if rank == root else np.empty(per, np.float32)
        x[:] = np.arange(per, dtype=np.float32) + rank * 5 + root
        got = rr.gather(x, dst=root, out=full if rank == root else None)
        if rank == root and not np.array_equal(
                got, np.stack([np.arange(per, dtype=np.float32) + p * 5 + root for p in ranks])):
            fails.append(f"gather in place root={root}")
    for root in {0, world - 1}:
        per = 1 << 20
        blocks = np.stack([np.arange(per, dtype=np.float32) + p * 7 + root for p in ranks])
        got = blocks[rank] if rank == root else np.full(per, -1.0, np.float32)
        rr.scatter(got, src=root, x=blocks if rank == root else None)
        if not np.array_equal(got, np.arange(per, dtype=np.float32) + rank * 7 + root):
            fails.append(f"scatter in place root={root}")


def single_copy_paths(rank: int, world: int) -> dict:
    """Large shared-memory all_to_all: equal and uneven blocks (zeros included), several
    dtypes, torch tensors, a subgroup, and `out` overlapping `x` (refused); large scatter
    from two roots; every result checked. Returns the failures and the bytes this rank
    read from peers with process_vm_readv (RINGREDUCE_CMA)."""
    import torch

    fails: list = []
    ranks = list(range(world))

    def cnt(a: int, b: int) -> int:
        return (a * 3 + b * 5 + 1) % 4

    for dt in (np.float32, np.int64, np.float16, np.uint8):
        for scale in (70_001, 1 << 20):
            send = [cnt(rank, p) * scale for p in ranks]
            recv = [cnt(p, rank) * scale for p in ranks]
            x = np.concatenate([(np.arange(send[p]) * 7 + rank * 100 + p).astype(dt)
                                for p in ranks])
            out = rr.all_to_all(x, send_counts=send, recv_counts=recv)
            want = np.concatenate([(np.arange(recv[p]) * 7 + p * 100 + rank).astype(dt)
                                   for p in ranks])
            if out.shape != want.shape or not np.array_equal(out, want):
                fails.append(f"uneven {np.dtype(dt).name} x{scale}")
    rows = 1 << 19  # 2 MiB blocks of float32
    x = torch.stack([torch.full((rows,), float(rank * world + p)) for p in ranks]).reshape(-1)
    out = torch.empty_like(x)
    rr.all_to_all(x, out=out)
    if not torch.equal(out, torch.cat([torch.full((rows,), float(p * world + rank))
                                       for p in ranks])):
        fails.append("torch equal blocks")
    if world >= 3:
        members = [0, 2, world - 1] if world > 3 else [0, 2]
        g = rr.new_group(members)
        if (g is None) != (rank not in members):
            fails.append(f"new_group({members}) returned {g!r} on rank {rank}")
        elif g is not None:
            y = np.concatenate([np.full(rows, rank * 10 + q, np.float64) for q in g.ranks])
            got = rr.all_to_all(y, group=g)
            if not np.array_equal(got, np.concatenate([np.full(rows, q * 10 + rank, np.float64)
                                                       for q in g.ranks])):
                fails.append("group")
            g.destroy()
    # `out` is `x` shifted by one block: peers must not read x where this rank writes.
    buf = np.zeros((world + 1) * rows, np.float32)
    x = buf[:world * rows]
    x[:] = np.concatenate([np.full(rows, rank * world + p, np.float32) for p in ranks])
    try:
        got = rr.all_to_all(x, out=buf[rows:])
        want = np.concatenate([np.full(rows, p * world + rank, np.float32) for p in ranks])
        if not np.array_equal(got, want):
            fails.append("overlapping out")
    except ValueError as e:
        if "overlap" not in str(e):
            fails.append(f"overlapping out refused without saying why: {e}")
    comm = rr.world_group().comm
    before = comm.cma_bytes()
    for root in {0, world - 1}:
        for per in (300_001, 1 << 20):
            blocks = np.stack([(np.arange(per) * 3 + p * 11 + root).astype(np.float32)
                               for p in ranks]) if rank == root else None
            got = np.full(per, -1.0, np.float32)
            rr.scatter(got, src=root, x=blocks)
            if not np.array_equal(got, (np.arange(per) * 3 + rank * 11 + root).astype(np.float32)):
                fails.append(f"scatter root={root} per={per}")
    # the blocks this rank read in place, as a non-root (ranks 1..n-2 are never the root)
    scatter_read = comm.cma_bytes() - before
    _in_place(rank, world, fails)
    return {"fails": fails, "cma_bytes": int(comm.cma_bytes()), "scatter_read": scatter_read,
            "readable": bool(comm.cma_readable())}


_INTS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def _int_avg_inputs(dtype: str, rank: int, n: int) -> np.ndarray:
    """Values whose sum over ranks wraps every integer type: the type's extremes, their
    neighbours and random values (rank-dependent)."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1000 + rank)
    ext = [int(info.max) - rank, int(info.min) + rank, int(info.max) // 2 + rank, -rank - 1
           if info.min < 0 else rank, 0, 1 - (rank % 2)]
    vals = [ext[i % len(ext)] for i in range(min(n, 24))]
    vals += [int(v) for v in rng.integers(int(info.min), int(info.max), n - len(vals),
                                          dtype=dtype, endpoint=True)]
    return np.array(vals[:n], dtype=object).astype(dtype)


def _exact_avg(xs: list, world: int, dtype: str) -> np.ndarray:
    total = sum(x.astype(object) for x in xs)
    return np.array([abs(int(t)) // world * (1 if t >= 0 else -1) for t in total],
                    dtype=object).astype(dtype)


def int_avg(rank: int, world: int) -> list:
    """op=avg on every integer type is the exact mean rounded toward zero (NCCL's), although
    the sum wraps the type: all-reduce, coalesced, reduce (every root), reduce_scatter."""
    fails = []
    for dtype in _INTS:
        n = 3 * world + 7
        xs = [_int_avg_inputs(dtype, r, n) for r in range(world)]
        want = _exact_avg(xs, world, dtype)
        x = xs[rank].copy()
        rr.allreduce(x, op="avg")
        if not np.array_equal(x, want):
            fails.append(f"allreduce {dtype}: {x[:8]} != {want[:8]}")
        a, b = xs[rank][:5].copy(), xs[rank][5:].copy()
        rr.allreduce_coalesced([a, b], op="avg")
        if not np.array_equal(np.concatenate([a, b]), want):
            fails.append(f"allreduce_coalesced {dtype}")
        for root in range(world):
            y = xs[rank].copy()
            rr.reduce(y, dst=root, op="avg")
            exp = want if rank == root else xs[rank]
            if not np.array_equal(y, exp):
                fails.append(f"reduce {dtype} dst={root} on rank {rank}: {y[:6]} != {exp[:6]}")
        k = 4
        zs = [_int_avg_inputs(dtype, r, k * world) for r in range(world)]
        out = rr.reduce_scatter(zs[rank].copy(), op="avg")
        exp = _exact_avg(zs, world, dtype)[rank * k:(rank + 1) * k]
        if not np.array_equal(out, exp):
            fails.append(f"reduce_scatter {dtype}: {out} != {exp}")
    return fails


def torch_int_avg(rank: int, world: int) -> list:
    """dist.all_reduce(int64, ReduceOp.AVG) on the ringreduce backend: what Lightning's
    self.log(..., sync_dist=True) sends for its batch-size counter (gloo refuses it)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    try:
        fails = []
        t = torch.tensor([4 + rank, -7 * rank, 2**62 + rank], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        s = sum(range(world))
        want = [(4 * world + s) // world, -((7 * s) // world), 2**62 + s // world]
        if t.tolist() != want:
            fails.append(f"int64 AVG: {t.tolist()} != {want}")
        u = torch.full((5,), 200 + rank, dtype=torch.uint8)
        dist.all_reduce(u, op=dist.ReduceOp.AVG)
        if u.tolist() != [(200 * world + s) // world] * 5:
            fails.append(f"uint8 AVG: {u.tolist()}")
        return fails
    finally:
        dist.destroy_process_group()


def mixed_containers_alone(rank: int, world: int) -> list:
    """On each rank's group of one (no data moves: a local copy), every copying collective
    with a numpy `x` and a torch `out` and the other way round, checked (a numpy `x` with a
    torch `out` raised TypeError in torch's copy_; groups of 2+ ranks ran it)."""
    import torch

    g = [rr.new_group([r]) for r in range(world)][rank]
    fails = []
    x = _x(rank, 8, np.float32)
    for out_torch in (True, False):
        src = x if out_torch else torch.from_numpy(x.copy())  # the other kind than `out`
        for name in ("allgather", "reduce_scatter", "all_to_all", "gather", "scatter"):
            shape = (1, 8) if name in ("allgather", "gather") else (8,)
            out = torch.zeros(shape) if out_torch else np.zeros(shape, np.float32)
            try:
                if name == "scatter":
                    rr.scatter(out, rank, x=src.reshape(1, 8), group=g)
                elif name == "gather":
                    rr.gather(src, rank, out=out, group=g)
                else:
                    getattr(rr, name)(src, out=out, group=g)
                got = out.numpy() if out_torch else out
                if not np.array_equal(got.reshape(-1), x):
                    fails.append(f"{name} (out torch={out_torch}): {got} != {x}")
            except Exception as e:  # noqa: BLE001
                fails.append(f"{name} (out torch={out_torch}): {type(e).__name__}: {e}")
    return fails
