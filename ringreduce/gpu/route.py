"""CUDA tensors in ringreduce's collectives: which path a call takes, and the two paths.

``backend`` (a keyword of every collective in ringreduce.api):
  "auto"            NCCL when every rank of the group can use it on its own device, else
                    staged. The choice is agreed once per group (see below), so all ranks
                    take the same path.
  "nccl"            NCCL, or a clear NcclUnavailable on every rank saying which rank lacks it.
  "staged"/"host"   copy into pinned host memory on the caller's stream, run the CPU
                    (TCP/shm) collective, copy back on the same stream (staging.py).
Host arrays always take the CPU path ("nccl" with a host array is an error).

Collective safety: the first collective on a CUDA buffer in a group is itself collective.
Every rank publishes (NCCL usable?, host, device) through the store init used, reads every
other rank's entry, and the group then uses NCCL for "auto" only if all ranks can and no two
ranks of a host share a device; the NcclCommunicator is created lazily, by the first call
that takes the NCCL path, with the unique id shared through the same store. So every rank
must issue the same first CUDA collective (it must anyway: collectives match in order).

Semantics: NCCL calls are stream-ordered like torch's NCCL backend (a sync call has only
enqueued; later work on the stream sees the result; async returns a Work whose wait() blocks
the host). Staged calls are host-synchronous: a sync call returns with the result in device
memory and the stream synchronized; an async one returns a Work whose wait() finishes the
copy back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable

from .. import _C
from .._buffers import OP_NAMES, algo_code, op_code
from . import arrays
from . import device as cuda_device
from . import staging as stg
from .nccl import NcclCommunicator

BACKENDS = ("auto", "nccl", "staged", "host")
_HOST_PATHS = ("cpu", "tcp", "shm")  # what select_backend may name for host arrays
_KEY = "cuda/"


def normalize_backend(backend: Any) -> str:
    name = str(backend).lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    return "staged" if name == "host" else name


def wants(xs: Sequence[Any], backend: Any) -> bool:
    """True when the call must go through this module (some input is a CUDA array). Host
    inputs with backend='nccl' raise; host inputs with any other backend return False."""
    name = normalize_backend(backend)
    cuda = [arrays.is_cuda_array(x) for x in xs if x is not None]
    if any(cuda):
        return True
    if name == "nccl":
        raise _not_for_nccl(next((x for x in xs if x is not None), None))
    return False


def _not_for_nccl(x: Any) -> ValueError:
    """backend='nccl' on a buffer that is not a CUDA array."""
    if arrays._is_torch_tensor(x) and x.device.type == "meta":
        return ValueError("backend='nccl' needs CUDA tensors; this one is on the meta device "
                          "and has no memory (materialise it on a GPU first, e.g. "
                          "torch.empty_like(x, device='cuda'))")
    return ValueError("backend='nccl' needs CUDA tensors; this one is in host memory (move it "
                      "with .cuda(), or use backend='auto')")


def decide(backend: str, nccl: tuple, staging: tuple) -> str:
    """"nccl" or "staged" for a CUDA call. ``nccl``/``staging``: (usable, reason), the
    group-wide NCCL verdict and this buffer kind's staging status."""
    if backend == "nccl":
        if not nccl[0]:
            raise arrays.NcclUnavailable(
                f"backend='nccl' cannot be used: {nccl[1]}; use backend='auto' (falls back to "
                f"staging through host memory) or backend='staged'")
        return "nccl"
    if backend == "auto" and nccl[0]:
        return "nccl"
    if not staging[0]:
        why = "" if backend != "auto" else f" and NCCL is not usable ({nccl[1]})"
        raise arrays.CudaUnavailable(
            f"CUDA tensors cannot be staged through host memory here: {staging[1]}{why}; move "
            f"the data to the CPU first (.cpu()), or fix the CUDA/NCCL set-up")
    return "staged"


def select_backend(x: Any, backend: str = "auto") -> str:
    """The path a collective on ``x`` takes on this process: "cpu" for host arrays,
    "nccl" or "staged" for CUDA arrays.

    ``backend``: "auto" (NCCL for CUDA arrays when it is usable here, else staged through
    pinned host memory), "nccl" (required), "staged"/"host" (required), or a host path name
    ("cpu", "tcp", "shm", returned for host arrays). A CUDA array that can take neither
    path raises with the reason and what to do. The collectives agree on NCCL across ranks
    first (this module); this is the local half of that decision.
    """
    backend = str(backend).lower()
    if not arrays.is_cuda_array(x):
        if backend == "nccl":
            raise _not_for_nccl(x)
        if backend in _HOST_PATHS:
            return backend
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; use one of "
                             f"{', '.join(BACKENDS + _HOST_PATHS)}")
        return "cpu"
    if backend not in BACKENDS:
        raise ValueError(
            f"backend={backend!r} moves host memory only; for a CUDA tensor use backend='auto', "
            f"'nccl' or 'staged', or move it to the CPU with .cpu()"
        )
    name = normalize_backend(backend)
    cannot = nccl_cannot(_buf(x, "select_backend(x)", writable=False).dtype) \
        if name == "auto" else None  # the collectives stage these too (the op aside)
    nccl = (False, cannot or "not needed") if name == "staged" or cannot else \
        cuda_device.nccl_available()
    staging = (True, "") if name == "nccl" else stg.stager_status(arrays._is_torch_tensor(x))
    return decide(name, nccl, staging)


def agree(entries: list, hosts: list) -> tuple:
    """Group-wide NCCL verdict from every rank's (usable, device, reason) entry."""
    for r, (ok, _dev, reason) in enumerate(entries):
        if not ok:
            return False, f"rank {r}: {reason}"
    seen: dict = {}
    for r, (_ok, dev, _reason) in enumerate(entries):
        key = (hosts[r] if r < len(hosts) else "?", dev)
        if key in seen:
            return False, (f"ranks {seen[key]} and {r} share cuda:{dev} on one host; NCCL "
                           f"needs one device per rank (set the device from LOCAL_RANK)")
        seen[key] = r
    return True, "NCCL usable on every rank"


class CudaState:
    """Per-group CUDA state: the store and key prefix init used, the agreed NCCL verdict,
    the lazily created NcclCommunicator and the pinned-host pools."""

    def __init__(self, group: Any, store: Any, prefix: str):
        self.group, self.store, self.prefix = group, store, prefix
        self.verdict: tuple | None = None
        self.nccl: Any = None
        self.pools: dict = {}

    def nccl_verdict(self, device: int | None) -> tuple:
        if self.verdict is None:
            ok, reason = cuda_device.nccl_available()
            g = self.group
            if g.world_size == 1 or self.store is None:
                self.verdict = (ok, reason)
            else:
                mine = f"{int(ok)}|{-1 if device is None else device}|{reason[:500]}"
                self.store.set(f"{self.prefix}{_KEY}{g.rank}", mine)
                keys = [f"{self.prefix}{_KEY}{r}" for r in range(g.world_size)]
                _wait_verdicts(self.store, keys, g.rank,
                               g.timeout)
                entries = []
                for k in keys:
                    o, d, why = bytes(self.store.get(k)).decode().split("|", 2)
                    entries.append((o == "1", int(d), why))
                self.verdict = agree(entries, g.hosts)
        return self.verdict

    def communicator(self, device: int | None) -> Any:
        if self.nccl is None:
            store = self.store if self.store is not None else _DictStore()
            self.nccl = NcclCommunicator(
                store, self.group.rank, self.group.world_size, device=device,
                timeout=self.group.timeout,
                key_prefix=f"{self.prefix}nccl")
        return self.nccl

    def pool(self, torch_tensor: bool) -> stg.HostPool:
        p = self.pools.get(torch_tensor)
        if p is None:
            p = self.pools[torch_tensor] = stg.HostPool(
                stg.make_stager(torch_tensor))
        return p

    def close(self) -> None:
        for p in self.pools.values():
            p.clear()
        self.pools.clear()
        if self.nccl is not None:
            nccl, self.nccl = self.nccl, None
            nccl.destroy()


def _wait_verdicts(store: Any, keys: list, rank: int, timeout: float) -> None:
    """Wait, at most `timeout` (the communicator's), until every rank published its NCCL
    verdict (keys[r] is rank r's). Polls with store.check: store.get would block for the
    store's own timeout and could not say who is missing."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            if not missing:
                return  # they arrived just now
            from .._C import CollectiveTimeout

            shown = ", ".join(str(r) for r in missing[:16]) + (" ..." if len(missing) > 16 else "")
            raise CollectiveTimeout(
                f"rank {rank}: the first CUDA collective waited {timeout:g} s for the NCCL "
                f"verdict of rank{'s' if len(missing) > 1 else ''} {shown}, which never "
                f"published it (did {'they' if len(missing) > 1 else 'it'} issue the same "
                f"CUDA collective? every rank must call the same collectives in the same "
                f"order; raise timeout= or RINGREDUCE_TIMEOUT if a rank is slow to get there)")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class _DictStore:
    """The two Store methods NcclCommunicator needs, for a group without a store (world 1)."""

    def __init__(self) -> None:
        self._d: dict = {}

    def set(self, key: str, value: Any) -> None:
        self._d[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key: str) -> bytes:
        return self._d[key]


_STATE: list = [None]


def bind(group: Any, store: Any, prefix: str) -> None:
    """Called by init(): remember the store for this group's first CUDA call."""
    reset()
    _STATE[0] = CudaState(group, store, prefix)


def state(group: Any) -> CudaState:
    st = _STATE[0]
    if st is None or st.group is not group:
        st = _STATE[0] = CudaState(group, None, "ringreduce/")
    return st


def abort(reason: str) -> None:
    """Abort the group's NCCL communicator, if any (thread-safe; see api.abort)."""
    st = _STATE[0]
    nccl = st.nccl if st is not None else None
    if nccl is not None:
        nccl.abort(reason)


def reset() -> None:
    st, _STATE[0] = _STATE[0], None
    if st is not None:
        st.close()


# ---------------------------------------------------------------------------------------
# Argument checks (all before any byte moves)
# ---------------------------------------------------------------------------------------


def _buf(x: Any, what: str, writable: bool = True) -> arrays.CudaBuffer:
    if not arrays.is_cuda_array(x):
        raise ValueError(
            f"{what}: is in host memory but the other buffers of this call are on a CUDA "
            f"device; pass all buffers on the same device (e.g. .cuda() or .cpu() for all)")
    # torch: the stream is read later, from the stager (torch.cuda.current_stream).
    return arrays.as_cuda_buffer(x, what, writable, stream=0 if arrays._is_torch_tensor(x) else None)


def _same_kind(bufs: list, call: str) -> tuple:
    """(is_torch, device) shared by all buffers; raises on a mix."""
    kinds = {arrays._is_torch_tensor(b.obj if not isinstance(b.obj, tuple) else b.obj[0])
             for b in bufs}
    if len(kinds) > 1:
        raise ValueError(f"{call}: mixes torch CUDA tensors with other CUDA arrays; use one "
                         f"library for all buffers of a call")
    devs = {b.device for b in bufs if b.device is not None}
    if len(devs) > 1:
        raise ValueError(
            f"{call}: buffers are on different devices ({', '.join(f'cuda:{d}' for d in sorted(devs))}); "
            f"put them on one device (the one this rank uses)")
    dts = {b.dtype for b in bufs}
    if len(dts) > 1:
        raise ValueError(f"{call}: all buffers need one dtype, got {sorted(dts)}")
    return kinds.pop(), (devs.pop() if devs else None)


def _empty_like(x: Any, shape: tuple, what: str) -> Any:
    if arrays._is_torch_tensor(x):
        import torch

        return torch.empty(shape, dtype=x.dtype, device=x.device)
    cupy = arrays._imported("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        with x.device:
            return cupy.empty(shape, dtype=x.dtype)
    raise ValueError(f"{what}: pass out= (ringreduce can allocate CUDA outputs only for torch "
                     f"tensors and CuPy arrays, got {type(x).__name__})")


# ---------------------------------------------------------------------------------------
# The staged path
# ---------------------------------------------------------------------------------------


def staged(g: Any, pool: stg.HostPool, srcs: list, dsts: list, n_in: int,
           n_out: int | None, launch: Callable[[int, int, bool], Any], async_op: bool,
           result: Any = None) -> Any:
    """Copy ``srcs`` (concatenated) into pinned host memory, run ``launch(in_ptr, out_ptr,
    async_op)`` (the CPU collective; returns its C++ work or None), copy the host output
    (``n_out`` elements, or the input buffer when None: in place) into ``dsts``
    (consecutive slices). Returns an api.Work when async_op, else None."""
    from .._work import Work

    st = pool.stager
    dtype, device = srcs[0].dtype, srcs[0].device
    s_in = [st.stream_of(b) for b in srcs]
    s_out = [st.stream_of(b) for b in dsts]
    hin = pool.take(dtype, n_in, device)
    hout = hin if n_out is None else pool.take(dtype, n_out, device)
    off = 0
    for b, s in zip(srcs, s_in):
        st.to_host(hin, off, b, s)
        off += b.count
    for s in _unique(s_in):
        st.synchronize(s)
    cw = launch(hin.ptr, hout.ptr, async_op)

    def copy_back() -> None:
        o = 0
        for b, s in zip(dsts, s_out):
            st.to_device(b, hout, o, s)
            o += b.count
        for s in _unique(s_out):
            st.synchronize(s)
        pool.give(hin)
        if hout is not hin:
            pool.give(hout)

    if async_op and cw is not None:
        keep = tuple(b.obj for b in srcs + dsts) + (hin, hout)
        return Work(cw, keep, after=copy_back, result=result,
                    outputs=tuple(b.obj for b in dsts))
    copy_back()
    return Work(None, result=result) if async_op else None


def _unique(streams: list) -> list:
    out: list = []
    for s in streams:
        if not any(s is t or s == t for t in out):
            out.append(s)
    return out


# ---------------------------------------------------------------------------------------
# Collectives (called by ringreduce.api when an input is a CUDA array)
# ---------------------------------------------------------------------------------------


# What ringreduce's NCCL calls cannot do as the host path defines it (csrc/nccl/comm.cc's
# toNccl refuses the dtypes and ops; NCCL's avg of integers sums in the type and wraps,
# where ringreduce's is the exact mean): backend="auto" stages these.
_NCCL_NO_DTYPES = ("bool", "int16", "uint16")
_NCCL_NO_OPS = ("band", "bor", "bxor")
_FLOATS = ("float32", "float64", "float16", "bfloat16")


def nccl_cannot(dtype: str, opc: int | None = None, torch_kind: bool = True,
                coalesced: bool = False) -> str | None:
    """Why NCCL cannot run this call (backend="auto" then stages it), or None. The same on
    every rank (they pass the same dtype and op), so all take the same path."""
    op = OP_NAMES.get(opc)
    if dtype in _NCCL_NO_DTYPES:
        return f"NCCL has no {dtype} reductions in ringreduce"
    if op in _NCCL_NO_OPS:
        return f"NCCL has no bitwise reductions (op={op})"
    if op == "avg" and dtype not in _FLOATS:
        return "NCCL's integer avg wraps its sum (ringreduce's is the exact mean)"
    if coalesced and not torch_kind:
        return "NCCL's coalesced path takes torch tensors"
    return None


def _path(g: Any, backend: Any, torch_kind: bool, device: int | None,
          cannot: str | None = None) -> tuple:
    name = normalize_backend(backend)
    st = state(g)
    if name == "staged" or (name == "auto" and cannot):
        verdict = (False, cannot or "not needed")
    else:
        verdict = st.nccl_verdict(device)
    staging = (True, "") if name == "nccl" else stg.stager_status(torch_kind)
    return decide(name, verdict, staging), st


def _gpu_work(w: Any, keep: tuple, async_op: bool, result: Any = None) -> Any:
    from .._work import Work

    if not async_op:
        return None
    return Work(w._w, keep, result=result) if w is not None else Work(None, result=result)


def allreduce(g: Any, x: Any, op: Any, algo: str, async_op: bool, backend: Any) -> Any:
    b = _buf(x, "allreduce(x)")
    opc, alc = op_code(op), algo_code(algo) or g.default_algo
    _C.check_reduction(b.code, opc)  # ValueError before anything moves (one rank too)
    torch_kind, dev = _same_kind([b], "allreduce")
    path, st = _path(g, backend, torch_kind, dev, nccl_cannot(b.dtype, opc))
    if path == "nccl":
        return _gpu_work(st.communicator(dev).allreduce(x, op, async_op=True), (x,), async_op)
    if g.comm is None or b.count == 0:
        return _gpu_work(None, (), async_op)
    return staged(g, st.pool(torch_kind), [b], [b], b.count, None,
                  lambda i, _o, a: g.comm.allreduce(i, b.count, b.code, opc, alc, a), async_op)


def broadcast(g: Any, x: Any, src: int, async_op: bool, backend: Any) -> Any:
    b = _buf(x, "broadcast(x)")
    torch_kind, dev = _same_kind([b], "broadcast")
    path, st = _path(g, backend, torch_kind, dev, nccl_cannot(b.dtype))
    if path == "nccl":
        return _gpu_work(st.communicator(dev).broadcast(x, src, async_op=True), (x,), async_op)
    if g.comm is None or b.count == 0:
        return _gpu_work(None, (), async_op)
    return staged(g, st.pool(torch_kind), [b], [b], b.count, None,
                  lambda i, _o, a: g.comm.broadcast(i, b.count, b.code, int(src), a), async_op)


def _gathered(g: Any, x: Any, out: Any, call: str, scatter: bool) -> tuple:
    b = _buf(x, f"{call}(x)", writable=False)
    n = g.world_size
    if scatter and b.count % n:
        raise ValueError(f"{call}: x has {b.count} elements, not a multiple of world_size {n}; "
                         f"pad it to {(b.count + n - 1) // n * n}")
    if out is None:
        if scatter:
            k = b.count // n
            shape = ((b.shape[0] // n,) + b.shape[1:]) if b.shape and b.shape[0] % n == 0 else (k,)
        else:
            shape = (n,) + b.shape
        out = _empty_like(x, shape, f"{call}(out)")
    o = _buf(out, f"{call}(out)")
    want = b.count // n if scatter else b.count * n
    torch_kind, dev = _same_kind([b, o], call)
    if o.count != want:
        raise ValueError(f"{call}: out must hold {want} elements of {b.dtype}, got {o.count}")
    return b, o, out, torch_kind, dev


def allgather(g: Any, x: Any, out: Any, async_op: bool, backend: Any) -> Any:
    b, o, out, torch_kind, dev = _gathered(g, x, out, "allgather", scatter=False)
    path, st = _path(g, backend, torch_kind, dev, nccl_cannot(b.dtype))
    if path == "nccl":
        w = st.communicator(dev).allgather(x, out, async_op=True)
        return _gpu_work(w, (x, out), async_op, out) if async_op else out
    if g.comm is None:  # world 1: out = x, through the host like any staged call
        w = staged(g, st.pool(torch_kind), [b], [o], b.count, None, lambda *a: None, async_op, out)
    else:
        w = staged(g, st.pool(torch_kind), [b], [o], b.count, o.count,
                   lambda i, p, a: g.comm.allgather(i, p, b.count, b.code, a), async_op, out)
    return w if async_op else out


def reduce_scatter(g: Any, x: Any, out: Any, op: Any, async_op: bool, backend: Any) -> Any:
    b, o, out, torch_kind, dev = _gathered(g, x, out, "reduce_scatter", scatter=True)
    opc = op_code(op)
    _C.check_reduction(b.code, opc)
    path, st = _path(g, backend, torch_kind, dev, nccl_cannot(b.dtype, opc))
    if path == "nccl":
        w = st.communicator(dev).reduce_scatter(x, out, op, async_op=True)
        return _gpu_work(w, (x, out), async_op, out) if async_op else out
    if g.comm is None:
        w = staged(g, st.pool(torch_kind), [b], [o], b.count, None, lambda *a: None, async_op, out)
    else:
        w = staged(g, st.pool(torch_kind), [b], [o], b.count, o.count,
                   lambda i, p, a: g.comm.reduce_scatter(i, p, o.count, b.code, opc, a),
                   async_op, out)
    return w if async_op else out


def allreduce_coalesced(g: Any, xs: Sequence[Any], op: Any, algo: str, async_op: bool,
                        backend: Any) -> Any:
    bufs = [_buf(x, f"allreduce_coalesced(xs[{i}])") for i, x in enumerate(xs)]
    opc, alc = op_code(op), algo_code(algo) or g.default_algo
    _C.check_reduction(bufs[0].code, opc)  # api calls this with at least one buffer
    torch_kind, dev = _same_kind(bufs, "allreduce_coalesced")
    path, st = _path(g, backend, torch_kind, dev,
                     nccl_cannot(bufs[0].dtype, opc, torch_kind, coalesced=True))
    total = sum(b.count for b in bufs)
    if path == "nccl":
        if not torch_kind:
            raise ValueError("allreduce_coalesced with backend NCCL takes torch tensors; call "
                             "allreduce per array for other CUDA arrays")
        import torch

        flat = torch.cat([x.detach().reshape(-1) for x in xs])
        w = st.communicator(dev).allreduce(flat, op, async_op=True)
        off = 0
        with torch.no_grad():  # stream-ordered after the all-reduce: no host wait needed
            for x in xs:
                x.view(-1).copy_(flat[off:off + x.numel()])
                off += x.numel()
        return _gpu_work(w, (flat,) + tuple(xs), async_op)
    if g.comm is None or total == 0:
        return _gpu_work(None, (), async_op)
    return staged(g, st.pool(torch_kind), bufs, bufs, total, None,
                  lambda i, _o, a: g.comm.allreduce(i, total, bufs[0].code, opc, alc, a),
                  async_op)
