"""Public API: init/destroy and collectives on torch tensors (CPU or CUDA), numpy arrays and
CUDA arrays (CuPy, ``__cuda_array_interface__``, DLPack).

Collectives work in place (allreduce, broadcast) or into an output buffer (allgather,
reduce_scatter). With async_op=True they return a Work handle; otherwise they block until
done and return None. Every rank must call the same collectives in the same order.

CUDA inputs go through ringreduce/gpu/route.py (``backend="auto"|"nccl"|"staged"``): NCCL
when every rank can use it, else staged through pinned host memory. The CUDA checks run only
after the CPU fast paths' type checks failed, so host calls pay nothing for them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import operator
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as _np

from . import _buffers, _comm, _env, _fds, _parent_stores, _rendezvous, _state, _trace, groups
from ._buffers import algo_code, as_buffer, op_code
from ._work import Work, _finish

log = logging.getLogger("ringreduce")


def init(rank: int | None = None, world_size: int | None = None, *,
         master_addr: str | None = None, master_port: int | None = None,
         store: Any = None, timeout: float | None = None, secret: str | None = None,
         ifname: str | None = None) -> None:
    """Join the job. Arguments left as None come from the environment (torchrun,
    ringreduce-run, SLURM, Open MPI or PMI variables; see ringreduce._env).

    timeout: seconds a collective may wait for a peer before raising CollectiveTimeout
    (default RINGREDUCE_TIMEOUT, 600). store: a torch.distributed Store to rendezvous
    through instead of a TCPStore at MASTER_ADDR:MASTER_PORT.
    """
    # One init at a time: two threads' calls both passed the check below and made two
    # worlds, and ranks could pick different ones as their default (found by a helper).
    with _INIT_LOCK:
        _init(rank, world_size, master_addr, master_port, store, timeout, secret, ifname)


_INIT_LOCK = threading.Lock()


def _init(rank: int | None, world_size: int | None, master_addr: str | None,
          master_port: int | None, store: Any, timeout: float | None, secret: str | None,
          ifname: str | None) -> None:
    if _state._DEFAULT[0] is not None:
        if _state._DEFAULT[0].by_torch:  # "destroy() first" would end torch's group's world
            raise RuntimeError(
                "ringreduce is already initialised: dist.init_process_group('ringreduce') "
                "made its world, which ringreduce's own calls use as is; do not call "
                "ringreduce.init() (dist.destroy_process_group() ends that world)")
        raise RuntimeError("ringreduce is already initialised; call ringreduce.destroy() first")
    if timeout is not None:
        timeout = _env.check_seconds("init(timeout)", timeout)
    _check_address(master_addr, master_port)
    rank = None if rank is None else _state.as_rank(rank, "init(rank)")
    world_size = None if world_size is None else _state.as_rank(world_size, "init(world_size)",
                                                                "size")
    if rank is not None and world_size is not None:
        info = _env.launch_given(rank, world_size)
    else:
        info = _env.detect_launch()
        if info.source == "default" and (rank, world_size) not in ((None, None), (None, 1)):
            # As torch's env:// ("rank expected"): the other one is not rank 0 / size 1.
            given, miss = ("rank", "world_size") if world_size is None else ("world_size",
                                                                              "rank")
            raise ValueError(f"init({given}=...) without {miss}, and no launcher variable "
                             f"(RANK/WORLD_SIZE, SLURM_*, OMPI_*, PMI_*) gives it; pass "
                             f"{miss}= too")
    from . import _C

    rank = info.rank if rank is None else rank
    world = info.world_size if world_size is None else world_size
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is out of range for world_size {world}")
    maddr = master_addr if master_addr is not None else info.master_addr
    mport = master_port if master_port is not None else info.master_port
    _env.note_launch(info, world_given=world_size is not None,
                     addr_given=master_addr is not None, port_given=master_port is not None)
    try:
        tun, options = _settings(timeout)
        _trace.check_writable(tun, rank, world)
        if tun.fault is not None and tun.fault["rank"] >= world:  # tests only: say why not
            raise ValueError(f"RINGREDUCE_FAULT names rank {tun.fault['rank']}, but this job "
                             f"has ranks 0-{world - 1}: no fault would fire. Name one of them "
                             f"or unset RINGREDUCE_FAULT")
        _C.set_log_prefix(f"rank {rank}")
        _C.forget_first_failure()  # an earlier job's failure is not this one's goodbye reason
        if world > 1:  # before the store (rank 0's server needs descriptors too)
            _fds.ensure(world, _fds.eager_peers(rank, world, options),
                        f"rank {rank}")
    except Exception as e:
        _tell_others(e, rank, world, maddr, mport, store)
        raise
    if world == 1:
        _state.set_default(_state.Group(rank=0, world_size=1, comm=None, options=options,
                                        timeout_from=_timeout_from(timeout),
                                        hosts=[_env.host_identity()], ranks=[0],
                                        default_algo=algo_code(tun.algo), tunables=tun))
        _gpu().bind(_state._DEFAULT[0], None, "ringreduce/")
        return
    if store is None:
        store = _rendezvous.torch_default_store()
    _parent_stores.refuse(store, None)
    if maddr is None and store is not None:
        # No MASTER_ADDR (init_method="tcp://host:port", an explicit store): listen on the
        # interface that routes to the store's host, as peers on other hosts reach it.
        maddr = _rendezvous.store_host(store)
    made = None  # registry key of a store made here: released at destroy
    if store is None:
        _rendezvous.release_lingering(keep=(maddr, mport))
        store = _rendezvous.make_store(maddr, mport, rank, world, options["connect_timeout"],
                                       tun.use_agent_store)
        made = _rendezvous.store_key(store)
    try:
        g = _comm.connect(rank, world, tun, options, store, maddr, ifname, secret or tun.secret)
        g.local_rank, g.store_key, g.store = info.local_rank, made, store
        g.ranks, g.net = list(range(world)), (maddr, ifname)
        g.timeout_from = _timeout_from(timeout)
        _state.set_default(g)
        # The store serves the group's first CUDA collective (NCCL verdict and unique id),
        # under this init's own key prefix.
        _gpu().bind(g, store, g.store_prefix + "cuda/")
    except BaseException:
        # Ranks still joining read why from the store: keep it up until the next init()
        # or destroy() (both release it).
        _rendezvous.linger(made)
        raise


def _timeout_from(timeout: float | None) -> str:
    return "RINGREDUCE_TIMEOUT" if timeout is None else "init(timeout=)"


def _settings(timeout: float | None) -> tuple:
    """This rank's tunables (logging set up from them) and the options the core reads."""
    from . import _C

    tun = _env.tunables()
    level = _C.LOG_LEVELS[tun.debug]
    _C.set_log_level(level)
    _configure_logging(level)
    options = _env.core_options(tun)  # what the core reads (csrc/core/tunables.def)
    if timeout is not None:
        options["timeout"] = float(timeout)
    # The file's fit, unless the environment sets a value itself (RINGREDUCE_TREE_THRESHOLD_
    # BYTES beside a tuning file: the explicit variable wins, as every other setting's).
    options.update({k: v for k, v in _load_tuning(tun.tuning_file).items()
                    if k != "tree_threshold_bytes" or not _env.is_set(k)})
    return tun, options


def _tell_others(e: Exception, rank: int, world: int, maddr: str | None, mport: int | None,
                 store: Any) -> None:
    """This rank refused its own settings before the rendezvous (a bad RINGREDUCE_*
    value, too few descriptors): tell the others through the store, as a failure during
    set-up is told -- they waited for its address until the connect timeout, then asked
    whether it had started (found by a helper). Best effort, bounded by a short wait for
    the store; `e` is what this rank raises either way."""
    if world < 2:
        return
    tun = _env.store_tunables()
    with contextlib.suppress(Exception):
        store = store if store is not None else _rendezvous.torch_default_store()
        made = None
        if store is None:
            _rendezvous.release_lingering(keep=(maddr, mport))
            store = _rendezvous.make_store(maddr, mport, rank, world,
                                           min(tun.connect_timeout, _TELL_S),
                                           tun.use_agent_store)
            made = _rendezvous.store_key(store)
        _rendezvous.fail_setup(store, rank, world, None, e)
        _rendezvous.linger(made)  # released by the next init() or destroy(), as a failed init's


_TELL_S = 5.0  # at most this long a rank that refused its settings looks for the store


def _check_address(addr: Any, port: Any) -> None:
    """init(master_addr=, master_port=) as MASTER_ADDR/MASTER_PORT are checked: a port
    out of range or of another type failed later as a store timeout blaming a port in use,
    and port 0 fell back to the environment (found by a helper)."""
    if addr is not None and (not isinstance(addr, str) or not addr.strip()):
        raise ValueError(f"init(master_addr={addr!r}): give rank 0's host name or address as "
                         f"a non-empty string")
    if port is not None:
        try:
            p = operator.index(port)
        except TypeError:
            raise TypeError(f"init(master_port={port!r}) must be an int port") from None
        if not 0 < p < 65536:
            raise ValueError(f"init(master_port={p}) is not a TCP port; pass a free port in "
                             f"1..65535")


def _configure_logging(level: int) -> None:
    """RINGREDUCE_DEBUG=INFO|DEBUG|TRACE also shows the Python side's messages on stderr;
    OFF keeps its warnings quiet too (the errors it raises still say everything)."""
    if level == 0 or getattr(log, "_ringreduce_off", False):  # set by OFF, undone by others
        log._ringreduce_off = level == 0  # type: ignore[attr-defined]
        log.setLevel(logging.ERROR if level == 0 else logging.NOTSET)
    if level < 2 or any(getattr(h, "_ringreduce", False) for h in log.handlers):
        return
    h = logging.StreamHandler()
    h._ringreduce = True  # type: ignore[attr-defined]
    h.setFormatter(logging.Formatter("[ringreduce %(levelname)s] %(message)s"))
    log.addHandler(h)
    log.setLevel(logging.INFO if level == 2 else logging.DEBUG)


def _load_tuning(path: str | None) -> dict:
    if not path:
        return {}
    import json

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"RINGREDUCE_TUNING_FILE={path}: cannot read tuning file: {e}") from e
    keys = ("alpha_us", "beta_ns_per_byte", "tree_threshold_bytes")
    if not isinstance(data, dict):
        raise ValueError(  # noqa: TRY004 - a bad setting, as every other one here
            f"RINGREDUCE_TUNING_FILE={path}: expected a JSON object with {', '.join(keys)} "
            f"(what ringreduce-bench --tune writes), got {type(data).__name__}")
    out = {}
    for k in keys:
        if k in data:
            v = data[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 \
                    or v == float("inf"):
                raise ValueError(f"RINGREDUCE_TUNING_FILE={path}: {k}={v!r}: expected a "
                                 f"finite number >= 0")
            out[k] = int(v) if k == "tree_threshold_bytes" else float(v)
    return out


def destroy() -> None:
    """Tear down the communicator (returns promptly even if peers are gone).

    With RINGREDUCE_TRACE set, writes this rank's Chrome trace first.
    """
    groups.destroy_default()


def abort() -> None:
    """Make the collective running now, and every later one, fail at once; thread-safe.

    For a watchdog thread of your own that decides the job must stop: the blocked call
    raises ``RingReduceError`` ("communicator aborted during ...") within milliseconds, its
    peers are told (they raise naming this rank), and later calls are refused until
    ``destroy()`` and ``init()``. The world's groups and point-to-point channels are aborted
    with it. No-op when not initialised. A Python signal handler runs only once the blocked
    call returns (as with gloo; see README, Ctrl-C), so call it from a thread: e.g. a
    SIGTERM handler that sets an Event a watchdog thread waits on.
    """
    g = _state._DEFAULT[0]
    if g is None:
        return
    g.aborted = True  # groups and p2p channels not made yet are refused too
    for c in _state.communicators(g):
        if c.comm is not None and not c.destroyed:
            c.comm.abort()
    _gpu().abort("ringreduce.abort() was called")


@atexit.register
def _destroy_at_exit() -> None:
    # A script that forgets destroy() still says goodbye to its peers and writes its trace.
    try:
        if _state._DEFAULT[0] is not None:
            destroy()
    finally:
        _rendezvous.join_connects_at_exit()
        if "ringreduce._futures" in sys.modules:  # end the completer threads before Python
            sys.modules["ringreduce._futures"]._COMPLETER.join_at_exit()  # finalizes


def is_initialized() -> bool:
    """Whether this process has a world: also in a forked child of a process that had one
    (a DataLoader worker), as torch.distributed's; get_rank()/get_world_size() answer there,
    collectives are refused (the connections are the parent's)."""
    return _state._DEFAULT[0] is not None or bool(_state._FORKED)


def get_rank(group: Any = None) -> int:
    """This process's rank in the world (or in `group`)."""
    return _state.resolve(group, "get_rank()", runs=False).rank


def get_world_size(group: Any = None) -> int:
    """Number of ranks in the world (or in `group`)."""
    return _state.resolve(group, "get_world_size()", runs=False).world_size


def _gpu() -> Any:
    from .gpu import route

    return route


def _cuda(xs: Sequence[Any], backend: str, g: Any) -> bool:
    """True when some input is a CUDA array (or backend says so): gpu.route takes the call.
    numpy arrays and CPU tensors with backend "auto" answer without importing anything."""
    if backend == "auto":
        for x in xs:
            tx = type(x)
            if tx is _np.ndarray or x is None:
                continue
            if isinstance(x, _buffers.torch_tensor_type()):
                if x.is_cuda:
                    break
                continue
            if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack_device__") \
                    or getattr(x, "is_cuda", False):
                break
        else:
            return False
    if _gpu().wants(xs, backend):
        if g is not _state._DEFAULT[0]:
            raise NotImplementedError(
                f"CUDA buffers on group {g.name!r}: the CUDA paths (NCCL, staged) run on the "
                f"world only for now; copy to host memory, or use torch.distributed with NCCL "
                f"for this group")
        return True
    return False


def allreduce(x: Any, op: Any = "sum", algo: str = "auto", async_op: bool = False,
              backend: str = "auto", group: Any = None) -> Work | None:
    """Reduce `x` over all ranks, in place. op: sum, avg, prod, min, max, and on integer
    and bool types band, bor, bxor.

    backend (CUDA inputs): "auto" (NCCL when every rank can use it, else staged), "nccl",
    "staged" (alias "host": through pinned host memory and the CPU collective)."""
    g = (_state._DEFAULT[0] if group is None else None) or _state.resolve(group, "allreduce()")
    if not async_op and g.comm is not None and backend == "auto":
        # Fast paths for latency-bound calls (a few microseconds matter for small
        # messages); anything unusual falls through to the checks below.
        opc = _buffers.OP_CODES.get(op) if type(op) is str else None
        alc = _buffers.ALGO_CODES.get(algo) if type(algo) is str else None
        if opc is not None and alc is not None:
            tx = type(x)
            if tx is _np.ndarray:
                if g.comm.allreduce_fast(x, opc, alc or g.default_algo):
                    return None
            elif tx is _buffers.torch_tensor_type():
                code = _buffers.torch_fast_code(x)
                if code is not None:
                    g.comm.allreduce(x.data_ptr(), x.numel(), code, opc, alc or g.default_algo,
                                     False)
                    return None
    if _cuda((x,), backend, g):
        return _gpu().allreduce(g, x, op, algo, async_op, backend)
    b = as_buffer(x, "allreduce(x)")
    opc, alc = op_code(op), algo_code(algo) or g.default_algo
    _buffers.check_reduction(b, opc)
    if g.comm is None:  # (x,): what Work.get_future() hands out, as for a real collective
        _state.check_aborted(_state._DEFAULT[0], "allreduce()")
        return _finish(None, (x,), async_op=async_op)
    if async_op and alc:
        _check_algo(g, alc)
    cw = g.comm.allreduce(b.ptr, b.count, b.code, opc, alc, async_op)
    return Work(cw, (x,)) if async_op else None


def _check_algo(g: _state.Group, alc: int) -> None:
    """An algorithm this group cannot run (algo="shm" across hosts or over TCP, "hier" on
    one host) is refused at the call, as a synchronous call refuses it -- not at wait(). The
    planner's own check (planner.cc), in the caller's thread."""
    g.comm.plan_of("allreduce", 0, alc)


def broadcast(x: Any, src: int = 0, async_op: bool = False,
              backend: str = "auto", group: Any = None) -> Work | None:
    """Copy rank `src`'s `x` into `x` on every rank of the group. `src` is a world rank
    (as in torch). backend: as for allreduce."""
    g = _state.resolve(group, "broadcast()")
    root = g.group_rank(src, "broadcast src")
    if _cuda((x,), backend, g):
        return _gpu().broadcast(g, x, root, async_op, backend)
    b = as_buffer(x, "broadcast(x)", writable=g.rank != root)  # the source only reads x
    if g.comm is None:
        return _finish(None, (x,), async_op=async_op)
    return _finish(g.comm.broadcast(b.ptr, b.count, b.code, root, async_op), (x,),
                   async_op=async_op)


def barrier(async_op: bool = False, group: Any = None) -> Work | None:
    """Wait until every rank (of the group) reached this barrier."""
    g = _state.resolve(group, "barrier()")
    if g.comm is None:
        return _finish(None, (), async_op=async_op)
    return _finish(g.comm.barrier(async_op), (), async_op=async_op)


def allgather(x: Any, out: Any = None, async_op: bool = False, backend: str = "auto",
              group: Any = None) -> Any:
    """Gather every rank's `x` into `out` of shape (world_size, *x.shape). backend: as for
    allreduce.

    Returns `out` (allocated when None), or a Work whose result() is `out` when async.
    """
    g = _state.resolve(group, "allgather()")
    if _cuda((x, out), backend, g):
        return _gpu().allgather(g, x, out, async_op, backend)
    b = as_buffer(x, "allgather(x)", writable=False)
    if out is None:
        out = _buffers.empty_like_shape(x, (g.world_size,) + b.shape)
    o = as_buffer(out, "allgather(out)")
    if o.count != b.count * g.world_size or o.dtype != b.dtype:
        raise ValueError(
            f"allgather: out must hold world_size * x.numel() = {b.units() * g.world_size} "
            f"elements of {b.dtype}, got {o.units()} of {o.dtype}")
    if g.comm is None:
        _buffers.copy_flat(out, x)
        w = Work(None, result=out)
        return w if async_op else out
    cw = g.comm.allgather(b.ptr, o.ptr, b.count, b.code, async_op)
    if async_op:
        return Work(cw, (x, out), result=out)
    return out


def reduce_scatter(x: Any, out: Any = None, op: Any = "sum", async_op: bool = False,
                   backend: str = "auto", group: Any = None) -> Any:
    """Reduce `x` (world_size * k elements) over ranks; rank r gets block r (k elements).

    `out` defaults to shape (x.shape[0] // world_size, *x.shape[1:]) when the first
    dimension divides, else a flat array of k elements. backend: as for allreduce.
    """
    g = _state.resolve(group, "reduce_scatter()")
    if _cuda((x, out), backend, g):
        return _gpu().reduce_scatter(g, x, out, op, async_op, backend)
    b = as_buffer(x, "reduce_scatter(x)", writable=False)
    n = g.world_size
    if b.units() % n:
        raise ValueError(
            f"reduce_scatter: x has {b.units()} elements, not a multiple of world_size {n}; "
            f"pad it to {(b.units() + n - 1) // n * n}")
    k = b.count // n
    if out is None:
        shape = ((b.shape[0] // n,) + b.shape[1:]) if b.shape and b.shape[0] % n == 0 \
            else (b.units() // n,)  # k counts a complex number's halves
        out = _buffers.empty_like_shape(x, shape)
    o = as_buffer(out, "reduce_scatter(out)")
    if o.count != k or o.dtype != b.dtype:
        raise ValueError(
            f"reduce_scatter: out must hold {b.units() // n} elements of {b.dtype}, got {o.units()} "
            f"of {o.dtype}")
    ob = _buffers.overlap(b, o)
    if ob and o.ptr != b.ptr + g.rank * ob:
        # out straddles x's blocks: writing it would change blocks still to be sent (shared
        # memory: wrong results). Reduce from a copy; x's own block r is in place (NCCL's).
        x = _buffers.copy_of(x)
        b = as_buffer(x, "reduce_scatter(x)", writable=False)
    opc = op_code(op)
    _buffers.check_reduction(b, opc)
    if g.comm is None:
        _buffers.copy_flat(out, x)
        w = Work(None, result=out)
        return w if async_op else out
    cw = g.comm.reduce_scatter(b.ptr, o.ptr, k, b.code, opc, async_op)
    if async_op:
        return Work(cw, (x, out), result=out)
    return out


# What makes an object one buffer (numpy, torch, CuPy, any DLPack producer), not a list.
_ONE_BUFFER = ("__array_interface__", "__cuda_array_interface__", "__dlpack__")


def allreduce_coalesced(xs: Sequence[Any], op: Any = "sum", algo: str = "auto",
                        async_op: bool = False, backend: str = "auto",
                        group: Any = None) -> Work | None:
    """All-reduce a list of same-dtype tensors/arrays as one collective (as if
    concatenated; one collective instead of len(xs)), each in place. backend: as for
    allreduce (all of xs on one CUDA device, or all in host memory)."""
    g = _state.resolve(group, "allreduce_coalesced()")
    if not hasattr(xs, "__iter__") or any(hasattr(xs, a) for a in _ONE_BUFFER):  # a CuPy array
        raise TypeError(f"allreduce_coalesced takes a list of tensors/arrays, got "
                        f"{type(xs).__name__}: pass [x], or call allreduce(x)")
    xs = list(xs)  # a generator or map() was used up by the first look (nothing reduced)
    if xs and _cuda(tuple(xs), backend, g):
        return _gpu().allreduce_coalesced(g, xs, op, algo, async_op, backend)
    bufs = [as_buffer(x, f"allreduce_coalesced(xs[{i}])") for i, x in enumerate(xs)]
    if not bufs:
        return _finish(None, (), async_op=async_op)
    dt = {b.dtype for b in bufs}
    if len(dt) > 1:
        raise ValueError(f"allreduce_coalesced: all inputs need one dtype, got {sorted(dt)}; "
                         f"group them by dtype")
    opc, alc = op_code(op), algo_code(algo) or g.default_algo
    _buffers.check_reduction(bufs[0], opc)
    if g.comm is None:  # (xs: get_future()'s value, as for a real collective)
        return _finish(None, tuple(xs), async_op=async_op)
    if async_op and alc:
        _check_algo(g, alc)
    # One collective over the inputs in place (shared memory reads and writes them
    # directly; other transports go through one flat copy inside the core).
    cw = g.comm.allreduce_coalesced([b.ptr for b in bufs], [b.count for b in bufs],
                                    bufs[0].code, opc, alc, async_op)
    return _finish(cw, tuple(xs), async_op=async_op)
