"""The "ringreduce" torch.distributed backend.

Registered with torch (``torch.distributed.Backend.register_backend(..., extended_api=True,
devices=["cpu"])``) by ``import ringreduce`` and, in processes that never import it, by
torch's ``torch.backends`` entry point (_ringreduce_autoload)::

    dist.init_process_group("ringreduce")        # or "cpu:ringreduce,cuda:nccl"
    model = torch.nn.parallel.DistributedDataParallel(model)

runs torch's own DDP -- and all_reduce (+ coalesced), broadcast, barrier, all_gather (+
into_tensor, coalesced), reduce_scatter (+ _tensor), reduce, gather, scatter, all_to_all
(+ _single), send/recv (+ batch_isend_irecv) -- on the ringreduce core, natively.

What torch holds is a C++ ``c10d::Backend`` (csrc/torch_adapter/c10d_backend.cc, compiled
against the installed torch on first use by ringreduce._c10d_build): torch gives it a group
name, ``_get_backend`` returns it, and DeviceMesh, DTensor, FSDP2 and functional collectives
use it like gloo's. Each of its operations calls :class:`_Ops` below, which runs it on a
ringreduce group. Where the adapter cannot be built (no C++ compiler), the backend falls
back, with one warning saying what is lost, to :class:`ProcessGroupRingReduce`, a Python
subclass of ProcessGroup running the same operations.

Collectives are asynchronous: each returns a Work whose wait() releases the GIL and whose
future is completed by a thread (ringreduce._futures), as DDP's reducer expects. The default
process group creates ringreduce's world (rendezvous through the store torch hands to the
backend) unless the program already called ringreduce.init(), which it then reuses; every
other torch group (dist.new_group, DeviceMesh dimensions) is a ringreduce group made through
torch's store for it.
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import sys
import threading
import warnings
import weakref
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from . import _C, _buffers, _env, _monitored, _state, api, groups, p2p
from . import _rooted as rooted
from ._futures import Completion, WaitAll
from ._torch_tensors import (
    _as_bytes,
    _chain,
    _copy,
    _flat,
    _inplace,
    _outputs,
    _overlaps,
    _same_dtype,
    _same_dtypes,
    _usable,
)
from ._torch_work import _done, _Work, _work

__all__ = ["BACKEND_NAME", "ArgumentError", "ProcessGroupRingReduce", "create_backend",
           "impl_of"]

BACKEND_NAME = "ringreduce"

# torch's ReduceOps the core has, by enum value (a dict lookup: a ReduceOp.name took ~10 us)
_BY_TYPE = {kind: ours for name, kind in dist.ReduceOp.RedOpType.__members__.items()
            if (ours := _buffers.op_name(name)) is not None}


class ArgumentError(ValueError, RuntimeError):
    """A bad argument to a torch.distributed call on this backend, refused before anything
    moved. A ValueError, as ringreduce's own calls raise, and a RuntimeError, as gloo raises
    for the same mistakes: code written against gloo (`except RuntimeError`) catches it."""


def _torch_errors(fn: Callable) -> Callable:
    """`fn` with its ValueErrors (argument checks, here and in ringreduce's API) raised as
    ArgumentError; ringreduce's runtime errors are RuntimeErrors already."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            if isinstance(e, RuntimeError):
                raise
            raise ArgumentError(*e.args).with_traceback(e.__traceback__) from None
    return call


def _op(opts: Any) -> str:
    red = getattr(opts, "reduceOp", None)
    if red is None:
        return "sum"
    kind = getattr(red, "op", red)
    found = _BY_TYPE.get(kind)
    if found is not None:
        return found
    name = getattr(kind, "name", str(kind).rsplit(".", 1)[-1]).upper()
    ours = _buffers.op_name(name)
    if ours is None:
        raise ValueError(
            f"the ringreduce backend does not support ReduceOp.{name}; use "
            f"{', '.join(k.name for k in _BY_TYPE)} or PREMUL_SUM (the latter through the c10d "
            f"adapter), or a gloo group: dist.new_group(backend='gloo')")
    return ours


_NAMES = itertools.count(1)


def _next_name() -> int:
    return next(_NAMES)


def _no_world() -> None:
    """A ringreduce subgroup without ringreduce's world (default group another backend's, or
    destroyed; a forked child's: the parent's): refused, naming which (found by helpers)."""
    if _state._FORKED:
        _state.current("a ringreduce process group")
    raise RuntimeError(
        "a ringreduce process group needs ringreduce's world, and there is none: the default "
        "process group is another backend's, or ringreduce.destroy() ended it; use "
        "init_process_group('ringreduce') (or 'cpu:ringreduce,cuda:nccl'), or call "
        "ringreduce.init() before creating ringreduce subgroups")


class _Ops:
    """The backend's operations on one ringreduce group (torch's argument conventions:
    group ranks for roots and peers, options objects, lists of tensors)."""

    def _setup(self, store: Any, rank: int, size: int, timeout: timedelta,
               name: str | None = None, members: list[int] | None = None) -> None:
        """members: the group's world ranks where torch gives them (global_ranks_in_group)."""
        self._rank = rank
        self._size = size
        self._store = store  # torch's store for this process group (monitored_barrier)
        self._monitored = 0  # monitored_barrier calls so far
        self._owns = False
        self._lock = threading.Lock()
        self._running: collections.deque = collections.deque()  # issued, maybe not done
        self._last_copy: Completion | None = None  # the latest with outputs to copy out
        self._copy_flag = bytearray(1)  # 1: a copy may be pending (read by the C++ adapter)
        _LIVE.add(self)
        g = _state._DEFAULT[0]
        # torch passes its 30-minute default when nobody gave a timeout: RINGREDUCE_TIMEOUT,
        # when set, wins it -- for subgroups too (they waited 30 minutes; found by a helper).
        env_wins = timeout == default_pg_timeout and _env.is_set("timeout")
        if g is None and dist.is_initialized():
            _no_world()
        if g is None:  # the default process group: it makes ringreduce's world
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else None
            api.init(rank=rank, world_size=size, store=store, timeout=None if env_wins else secs)
            self._owns = True
            g = _state._DEFAULT[0]
            g.by_torch = True
            if not env_wins:
                g.timeout_from = ("init_process_group(timeout=)" if timeout != default_pg_timeout
                                  else "torch's default process-group timeout")
        elif dist.is_initialized() or g.world_size != size or g.rank != rank:
            # A torch subgroup (dist.new_group, DeviceMesh, ...): its own ringreduce group,
            # set up through the PrefixStore torch gave it. (The default process group of a
            # job that called ringreduce.init() first shares the world instead.)
            g = groups.from_store(store, rank, size, f"torch group {name or _next_name()}",
                                  _env.tunables().timeout if env_wins else timeout, members)
            self._owns = True
        self._g = g

    def _world(self, r: Any, what: str) -> int:
        """The world rank of group rank `r` (torch passes group ranks: group_src, group_dst,
        or a global rank it translated), checked before anything moves."""
        r = int(r)
        if not 0 <= r < self._size:
            raise ValueError(f"{what}: rank {r} is not a rank of this process group (size "
                             f"{self._size}, ranks 0..{self._size - 1}); pass a member's rank")
        return self._g.ranks[r] if self._g.ranks else r

    @property
    def group(self) -> Any:
        """The ringreduce Group this process group runs on."""
        return self._g

    def native(self) -> tuple | None:
        """What the C++ adapter needs to run synchronous calls on the core directly
        (csrc/torch_adapter/native_api.h): (entry points, this group's communicator handle,
        default algorithm code, {torch dtype: code}, {ReduceOp.RedOpType value: code}, a
        byte that is 1 while a collective's copy out may be pending: see _issued); None
        where there is no communicator (a group of one)."""
        comm = getattr(self._g, "comm", None)
        if comm is None:
            return None
        ops = {int(k): _C.OP_CODES[v] for k, v in _BY_TYPE.items()}
        return (_C.NATIVE_API, comm.native_handle(), int(self._g.default_algo),
                _buffers.torch_dtype_codes(), ops, self._copy_flag)

    def set_timeout(self, seconds: float) -> None:
        """torch's Backend.setTimeout (`backend._set_default_timeout(td)`): the group's calls
        begun from now on wait at most `seconds` (ringreduce.groups.set_timeout)."""
        groups.set_timeout(self._g, seconds)

    def timeout_seconds(self) -> float:
        """This group's collective deadline (the adapter's getBackendOptions)."""
        return self._g.timeout

    def split(self, store: Any, ranks: list, timeout: float, name: str) -> Any:
        """ProcessGroup.split_group: this rank's backend of the group of `ranks` (sorted
        ranks *of this parent group*, as torch documents them), set up through `store` as
        dist.new_group's groups are; None when this rank is not one of them. Every parent
        rank calls it; only members rendezvous."""
        if self._rank not in ranks:
            return None
        world = [self._g.ranks[r] if self._g.ranks else r for r in ranks]
        # Keys of their own (world ranks: parents differ): torch's store for a split is not
        # guaranteed to be per group.
        store = dist.PrefixStore(f"ringreduce-split/{name}/{','.join(map(str, world))}/", store)
        rank, size = ranks.index(self._rank), len(ranks)
        secs = timedelta(seconds=timeout) if timeout > 0 else None
        return _adapter().RingReduceBackend(rank, size, _Impl(store, rank, size, secs,
                                                              name or None, world))

    # -- collectives
    def allreduce(self, tensors: list, opts: Any = None) -> _Work:
        op = _op(opts)
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        if tensors[0].layout is torch.sparse_coo:
            return self._sparse_allreduce(tensors, op)
        buf, back = _inplace(tensors[0])
        return _work(api.allreduce(buf, op=op, async_op=True, group=self._g), tensors, back)

    def _sparse_allreduce(self, tensors: list, op: str) -> _Work:
        """gloo's sparse all_reduce: every rank's indices and values are gathered (padded to
        the largest count) and summed by coalescing; the result replaces the tensor."""
        t = tensors[0]
        if op != "sum":
            raise ValueError(f"sparse all_reduce supports SUM only (as gloo does), not {op}; "
                             f"call .to_dense() first for other ops")
        if t.device.type != "cpu":
            raise ValueError(f"the ringreduce backend handles CPU tensors; got one on {t.device}")
        s = t.detach().coalesce()
        idx, val = s.indices(), s.values()
        nnz = idx.shape[1]
        counts = api.allgather(torch.tensor([nnz], dtype=torch.int64), group=self._g)
        m = int(counts.max())
        pad_i = idx.new_zeros((idx.shape[0], m))
        pad_i[:, :nnz] = idx
        pad_v = val.new_zeros((m,) + tuple(val.shape[1:]))
        pad_v[:nnz] = val
        all_i = api.allgather(pad_i, group=self._g)
        all_v = api.allgather(pad_v, group=self._g)
        k = [int(c) for c in counts.view(-1)]
        res = torch.sparse_coo_tensor(torch.cat([all_i[r, :, :k[r]] for r in range(len(k))], 1),
                                      torch.cat([all_v[r, :k[r]] for r in range(len(k))]),
                                      s.shape).coalesce()
        with torch.no_grad():
            t.copy_(res)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list, opts: Any = None) -> _Work:
        op = _op(opts)
        if not tensors:
            return _done(tensors)
        pairs = [_inplace(t) for t in tensors]  # non-contiguous ones too, as all_reduce
        return _work(api.allreduce_coalesced([d for d, _ in pairs], op=op, async_op=True,
                                             group=self._g), tensors,
                     _chain(*(b for _, b in pairs)))

    def broadcast(self, tensors: list, opts: Any = None) -> _Work:
        root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
        if len(tensors) != 1:
            raise ValueError("the ringreduce backend broadcasts one tensor per call")
        source = root == self._rank  # only reads its tensor (an expand()ed one too, as gloo)
        buf, back = _inplace(tensors[0], written=not source)
        return _work(api.broadcast(buf, src=self._world(root, "broadcast"), async_op=True,
                                   group=self._g), tensors, None if source else back)

    def barrier(self, opts: Any = None) -> _Work:
        return _work(api.barrier(async_op=True, group=self._g), [])

    def monitored_barrier(self, timeout: Any, wait_all_ranks: bool = False) -> None:
        """torch's dist.monitored_barrier (torch 2.14 runs it on any CPU backend): rank 0
        names the ranks that did not arrive within `timeout` (ringreduce._monitored)."""
        with self._lock:
            self._monitored += 1
            n = self._monitored
        # Keys under the group's store prefix: fresh per group and init, the same on all
        # its ranks (torch's store for a default group is reused by a later init).
        _monitored.barrier(self._store, self._g.store_prefix, self._rank, self._size, n,
                           timeout, wait_all_ranks, self.timeout_seconds(),
                           self._world(self._rank, "monitored_barrier"))

    def allgather(self, output_tensors: list, input_tensors: list, opts: Any = None) -> _Work:
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("the ringreduce backend gathers one tensor per call")
        self._check_allgather(output_tensors[0], input_tensors[0])
        return self._allgather(output_tensors[0], input_tensors[0])

    def _check_allgather(self, outs: list, inp: torch.Tensor) -> None:
        _usable(inp, written=False)
        _buffers.check_torch_values(inp, "all_gather")  # as _check_single's
        if len(outs) != self._size:
            raise ValueError(f"all_gather: tensor_list has {len(outs)} tensors; it needs "
                             f"world_size = {self._size}")
        for o in outs:
            if o.numel() != inp.numel() or o.dtype != inp.dtype:
                raise ValueError(
                    f"all_gather: every output must match the input ({inp.numel()} elements "
                    f"of {inp.dtype}); got {o.numel()} of {o.dtype} (use all_gather_object "
                    f"or pad for uneven sizes)")
        _outputs("all_gather", "tensor_list", outs)

    def _allgather(self, outs: list, inp: torch.Tensor) -> _Work:
        src, _ = _inplace(inp, written=False)
        flat = torch.empty((self._size,) + tuple(src.shape), dtype=src.dtype)

        def scatter_out() -> None:
            for r, o in enumerate(outs):
                _copy(o, flat[r])
        # The Work's value (result(), the future's): the output tensors, one flat list, as
        # gloo's (torch casts it to a list of tensors; a list of lists failed there).
        return _work(api.allgather(src, out=flat, async_op=True, group=self._g), list(outs),
                     scatter_out)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> _Work:
        self._check_single("all_gather_into_tensor", output, input)
        return self._all_gather_single(output, input)

    def _check_single(self, what: str, output: torch.Tensor, input: torch.Tensor,
                      op: str | None = None) -> None:
        """all_gather_into_tensor's / reduce_scatter_tensor's checks (the larger is world_size
        times the other; values and reduction op as the core's), before anything moves."""
        _usable(input, written=False)
        _usable(output)
        for t in (input, output):
            _buffers.check_torch_values(t, what, op)
        big, small = ("output", "input") if what.startswith("all_gather") else ("input", "output")
        sizes = {"output": output.numel(), "input": input.numel()}
        if sizes[big] != sizes[small] * self._size:
            raise ValueError(f"{what}: {big} has {sizes[big]} elements; it needs world_size * "
                             f"{small}.numel() = {sizes[small] * self._size}")
        _same_dtype(what, output, input)

    def _all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> _Work:
        src, _ = _inplace(input, written=False)
        dst, back = _inplace(output)
        return _work(api.allgather(src, out=dst, async_op=True, group=self._g), [output], back)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor,
                        opts: Any = None) -> _Work:
        return self.all_gather_single(output, input, opts)

    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list,
                                        opts: Any = None) -> _Work:
        for o, i in _pairs("all_gather_into_tensor coalesced", outputs, inputs):
            self._check_single("all_gather_into_tensor", o, i)
        return self._last([self._all_gather_single(o, i) for o, i in zip(outputs, inputs)],
                          outputs)

    def allgather_coalesced(self, output_lists: list, inputs: list, opts: Any = None) -> _Work:
        """torch's layout: output_lists[rank][i] receives rank's inputs[i]. Every list is
        checked before the first all-gather is issued."""
        if len(output_lists) != self._size:
            raise ValueError(f"all_gather_coalesced: output_tensor_lists has "
                             f"{len(output_lists)} lists; it needs world_size = {self._size}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise ValueError(f"all_gather_coalesced: output_tensor_lists[{r}] has "
                                 f"{len(outs)} tensors; it needs one per input "
                                 f"({len(inputs)})")
        per_input = [[outs[i] for outs in output_lists] for i in range(len(inputs))]
        for outs, t in zip(per_input, inputs):
            self._check_allgather(outs, t)
        return self._last([self._allgather(outs, t) for outs, t in zip(per_input, inputs)],
                          output_lists)

    def reduce_scatter(self, output_tensors: list, input_tensors: list,
                       opts: Any = None) -> _Work:
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError("the ringreduce backend reduce-scatters one tensor per call")
        out, ins = output_tensors[0], input_tensors[0]
        if len(ins) != self._size:
            raise ValueError(f"reduce_scatter: input_list has {len(ins)} tensors; it needs "
                             f"world_size = {self._size}")
        me = self._g.rank
        if ins[me].numel() != out.numel():
            raise ValueError(
                f"reduce_scatter: input_list[{me}] has {ins[me].numel()} elements but this "
                f"rank's output has {out.numel()}; input_list[r] is reduced into rank r's "
                f"output and must have its size")
        _same_dtypes("reduce_scatter", "input_list", ins, out, "the output")
        dst, back = _inplace(out)
        if any(t.numel() != out.numel() for t in ins):
            return self._reduce_scatter_uneven(dst, ins, _op(opts), output_tensors, back)
        flat = _flat(ins)
        return _work(api.reduce_scatter(flat, out=dst.view(-1), op=_op(opts), async_op=True,
                                        group=self._g), output_tensors, back)

    def _reduce_scatter_uneven(self, dst: torch.Tensor, ins: list, op: str,
                               output_tensors: list, back: Callable[[], None] | None) -> _Work:
        """Outputs of different sizes (input_list[r] has rank r's output size, the same on
        every rank): one reduce per rank onto it, on copies (the inputs stay as they were).
        Each reduce's header carries its count, so ranks whose sizes disagree fail with a
        CollectiveMismatch instead of mixing data."""
        bufs = [t.detach().reshape(-1).clone() for t in ins]
        works = [_work(rooted.reduce(b, self._g.ranks[j], op=op, group=self._g,
                                     async_op=True), None) for j, b in enumerate(bufs)]
        mine = bufs[self._g.rank]

        def copy_out() -> None:
            _copy(dst.view(-1), mine)
        return self._last(works, output_tensors, _chain(copy_out, back))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> _Work:
        self._check_single("reduce_scatter_tensor", output, input, _op(opts))
        return self._reduce_scatter_single(output, input, opts)

    def _reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                               opts: Any) -> _Work:
        src, _ = _inplace(input, written=False)
        dst, back = _inplace(output)
        return _work(api.reduce_scatter(src.view(-1), out=dst.view(-1), op=_op(opts),
                                        async_op=True, group=self._g), [output], back)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,
                             opts: Any = None) -> _Work:
        return self.reduce_scatter_single(output, input, opts)

    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list,
                                        opts: Any = None) -> _Work:
        for o, i in _pairs("reduce_scatter_tensor coalesced", outputs, inputs):
            self._check_single("reduce_scatter_tensor", o, i, _op(opts))
        return self._last([self._reduce_scatter_single(o, i, opts)
                           for o, i in zip(outputs, inputs)], outputs)

    def reduce(self, tensors: list, opts: Any = None) -> _Work:
        root = self._world(getattr(opts, "rootRank", 0), "reduce")
        buf, back = _inplace(tensors[0])
        return _work(rooted.reduce(buf, root, op=_op(opts), group=self._g, async_op=True),
                     tensors, back)

    def gather(self, output_tensors: list, input_tensors: list, opts: Any = None) -> _Work:
        root = int(getattr(opts, "rootRank", 0))
        inp, _ = _inplace(input_tensors[0], written=False)
        outs = output_tensors[0] if self._rank == root and output_tensors else []
        if self._rank == root:
            self._check_list("gather", "gather_list", outs, inp)
            _outputs("gather", "gather_list", outs)
        flat = torch.empty((self._size,) + tuple(inp.shape), dtype=inp.dtype) if outs else None

        def copy_out() -> None:
            for r, o in enumerate(outs):
                _copy(o, flat[r])
        return _work(rooted.gather(inp, self._world(root, "gather"), out=flat, group=self._g,
                                   async_op=True), list(outs), copy_out)

    def _check_list(self, what: str, name: str, ts: Any, like: torch.Tensor) -> None:
        """The root's gather_list / scatter_list: world_size tensors of like's size and dtype
        (checked before anything moves, as gloo does)."""
        if len(ts) != self._size:
            raise ValueError(f"{what}: {name} has {len(ts)} tensors; it needs one per rank of "
                             f"the group (world_size = {self._size})")
        mine = f"this rank's {'input' if what == 'gather' else 'output'} tensor"
        for i, t in enumerate(ts):
            if t.numel() != like.numel():
                raise ValueError(f"{what}: {name}[{i}] has {t.numel()} elements; each must "
                                 f"have {like.numel()}, as {mine}")
        _same_dtypes(what, name, ts, like, mine)

    def scatter(self, output_tensors: list, input_tensors: list, opts: Any = None) -> _Work:
        root = int(getattr(opts, "rootRank", 0))
        out, back = _inplace(output_tensors[0])
        flat = None
        if self._rank == root:
            self._check_list("scatter", "scatter_list", input_tensors[0], out)
            flat = _flat(input_tensors[0])
        return _work(rooted.scatter(out, self._world(root, "scatter"), x=flat, group=self._g,
                                    async_op=True), output_tensors, back)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list,
                      input_split_sizes: list, opts: Any = None) -> _Work:
        src, _ = _inplace(input, written=False)
        dst, back = _inplace(output)
        if _overlaps(src, dst):
            src = src.clone()  # output is (or overlaps) input: gloo runs it so
        return _work(rooted.all_to_all(src, out=dst, send_counts=input_split_sizes or None,
                                       recv_counts=output_split_sizes or None, group=self._g,
                                       async_op=True), [output], back)

    def alltoall(self, output_tensors: list, input_tensors: list, opts: Any = None) -> _Work:
        for name, ts in (("input_tensor_list", input_tensors),
                         ("output_tensor_list", output_tensors)) if input_tensors else ():
            _same_dtypes("all_to_all", name, ts, input_tensors[0], "input_tensor_list[0]")
        _outputs("all_to_all", "output_tensor_list", output_tensors)
        ins = [t.detach().reshape(-1) for t in input_tensors]
        flat_in = _flat(ins)
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)

        def copy_out() -> None:
            off = 0
            for t in output_tensors:
                _copy(t, flat_out[off:off + t.numel()])
                off += t.numel()
        return _work(rooted.all_to_all(flat_in, out=flat_out,
                                       send_counts=[t.numel() for t in ins],
                                       recv_counts=[t.numel() for t in output_tensors],
                                       group=self._g, async_op=True), output_tensors, copy_out)

    def send(self, tensors: list, dst: int, tag: int = 0) -> _Work:
        buf, _ = _inplace(_as_bytes(tensors[0]), written=False)
        # A small first message on its channel is copied and sent later, so the Work is
        # complete now (gloo's sends complete before the receiver posts, too).
        w = p2p.send_buffered(buf, self._world(dst, "send"), tag=tag, group=self._g)
        return _done(tensors) if w is None else _work(w, tensors)

    def recv(self, tensors: list, src: int, tag: int = 0) -> _Work:
        buf, back = _inplace(_as_bytes(tensors[0]))
        w = _work(p2p.irecv(buf, self._world(src, "recv"), tag=tag, group=self._g), tensors,
                  back)
        w.source = src
        return w

    def recv_anysource(self, tensors: list, tag: int = 0) -> _Work:
        buf, back = _inplace(_as_bytes(tensors[0]))
        rw = p2p.irecv(buf, None, tag=tag, group=self._g)
        w = _work(rw, tensors, back)
        w.source = lambda: self._g.ranks.index(rw.source_rank())  # torch wants a group rank
        return w

    # -- lifecycle
    def _issued(self, w: _Work) -> _Work:
        """A collective's Work, remembered until done: gloo's worker thread runs a group's
        collectives and their copies out in order, so the lists of an all_gather whose
        handle was dropped, or that was not the last waited for, are written by the time a
        later collective of the group returns -- here they were written only when their own
        Work was waited for or polled (found by a helper). So: the copies of those done are
        made now, this one's finish() makes the pending ones' first (a chain, `before`), and
        the C++ adapter's synchronous path defers to this one while a copy is pending
        (the flag byte of native()). Collectives of a group complete in order: the done ones
        are at the front. Their Futures are completed after the lock is released: a
        Future's callback may issue the group's next collective (found by a helper: a
        ``.then()`` calling all_reduce deadlocked here, as did ZeRO's interleaved DDP hook)."""
        c = w._c
        ended = []
        with self._lock:
            running = self._running
            while running and running[0].poll():  # writes its copy if it has one
                ended.append(running.popleft())
            last = self._last_copy
            if last is not None and last.after is not None:  # its copy still to make
                c.before = [last]
            else:
                last = None
            if c.after is not None:
                self._last_copy = c
            running.append(c)
            self._copy_flag[0] = int(c.after is not None or last is not None)
        for e in ended:
            e.complete_future()
        return w

    def _finish_running(self) -> None:
        """Wait for the collectives still running (each ends by its own deadline): torch's
        destroy_process_group() -- or the process's exit -- with an async_op=True collective
        never waited for finishes it, as gloo's does (it was cancelled, losing the result
        here and failing the peers'). Their errors are their waiters'."""
        with self._lock:
            running, self._running = self._running, collections.deque()
        for c in running:
            c.finish()

    def _last(self, works: list, value: Any, then: Callable[[], None] | None = None) -> _Work:
        # Collectives complete in submission order: the last one done means all are.
        # `then` runs once all succeeded (e.g. copying results out).
        if not works:
            return _done(value)
        return _work(WaitAll([w._c for w in works]), value, then)

    def shutdown(self) -> None:
        if self._owns and not self._g.destroyed:
            # The world takes every group with it: finish theirs too.
            for ops in list(_LIVE) if self._g is _state._DEFAULT[0] else [self]:
                ops._finish_running()
            self._g.destroy()
        self._owns = False

    def abort(self) -> None:
        # torch's _abort_process_group(): the group's call in flight fails as aborted.
        for c in _state.own_communicators(self._g) if self._owns else []:
            if c.comm is not None and not c.destroyed:
                c.comm.abort()
        self.shutdown()


def _collective(fn: Callable) -> Callable:
    """`fn`, its Work handed to _issued (point-to-point's are not: a receive may wait for
    long, and neither a later collective nor a destroy should wait for it), under its
    options' own timeout where they have one (dist.barrier(timeout=), as gloo)."""
    @functools.wraps(fn)
    def call(self: _Ops, *args: Any, **kwargs: Any) -> Any:
        # This thread's, read as each core call is issued; -1 (the group's) set too: a
        # Future's callback run in _issued may issue a collective inside an outer call's.
        before = _C.set_call_timeout(_call_timeout(kwargs.get("opts", args[-1] if args else None)))
        try:
            return self._issued(fn(self, *args, **kwargs))
        finally:
            _C.set_call_timeout(before)
    return call


def _pairs(what: str, outputs: list, inputs: list) -> zip:
    """A coalesced call's (output, input) pairs; lists of different lengths refused (zip
    dropped the longer one's tail without a word)."""
    if len(outputs) != len(inputs):
        raise ValueError(f"{what}: {len(outputs)} outputs but {len(inputs)} inputs; they "
                         f"pair up one to one")
    return zip(outputs, inputs)


_UNSET = timedelta(milliseconds=-1)  # c10d's kUnsetTimeout: the group's timeout applies


def _call_timeout(opts: Any) -> float:
    """Seconds of a c10d Options' own timeout (dist.barrier(timeout=) sets
    BarrierOptions.timeout), else -1: the group's."""
    t = getattr(opts, "timeout", _UNSET)
    if not isinstance(t, timedelta) or t == _UNSET:
        return -1.0
    try:
        return _env.check_seconds("the call's timeout", t.total_seconds())
    except ValueError as e:
        raise ArgumentError(*e.args) from None


_LIVE: weakref.WeakSet = weakref.WeakSet()  # every _Ops of this process (shutdown, exit)


@atexit.register  # after import of api: runs before its exit hook destroys the world
def _finish_at_exit() -> None:
    if getattr(sys, "last_value", None) is not None:
        # An uncaught exception (or Ctrl-C) ends the program: its collectives are cancelled,
        # and the peers learn of it at once (finishing them kept a crashing rank alive
        # until the timeout; found by a helper).
        return
    for ops in list(_LIVE):
        g = getattr(ops, "_g", None)  # None: its set-up failed
        if g is not None and not g.destroyed:
            ops._finish_running()


for _name in ("allreduce", "allreduce_coalesced", "broadcast", "barrier", "allgather",
              "all_gather_single", "allgather_into_tensor_coalesced", "allgather_coalesced",
              "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor_coalesced",
              "reduce", "gather", "scatter", "alltoall_base", "alltoall"):
    setattr(_Ops, _name, _collective(_torch_errors(getattr(_Ops, _name))))
for _name in ("send", "recv", "recv_anysource"):
    setattr(_Ops, _name, _torch_errors(getattr(_Ops, _name)))


class ProcessGroupRingReduce(_Ops, dist.ProcessGroup):
    """The fallback without the C++ adapter: a Python ProcessGroup (the way PyTorch's
    test_c10d_pypg.py builds one) running the same operations. torch uses it as the whole
    process group: no group name, no ``_get_backend``, no DeviceMesh/FSDP2, and a device
    map such as "cpu:ringreduce,cuda:nccl" loses its second backend."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 name: str | None = None, members: list[int] | None = None):
        try:
            dist.ProcessGroup.__init__(self, store, rank, size)
        except TypeError:  # older torch: (rank, size) only
            dist.ProcessGroup.__init__(self, rank, size)
        self._setup(store, rank, size, timeout, name, members)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupRingReduce(rank={self._rank}, size={self._size})"


class _Impl(_Ops):
    """What the C++ c10d Backend calls for each operation."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta,
                 name: str | None = None, members: list[int] | None = None):
        self._setup(store, rank, size, timeout, name, members)

    def __repr__(self) -> str:
        return f"ringreduce backend impl (rank {self._rank} of {self._size}, {self._g.name})"


_WARNED: list[str] = []


def _adapter() -> Any:
    from . import _c10d_build

    mod, why = _c10d_build.load()
    if mod is None and not _WARNED:
        _WARNED.append(why or "")
        warnings.warn(
            f"ringreduce: the c10d backend adapter is unavailable ({why}); using the Python "
            f"process group instead: no DeviceMesh/FSDP2/functional collectives, no "
            f"group_name or _get_backend, and 'cpu:ringreduce,cuda:nccl' keeps only "
            f"ringreduce", RuntimeWarning, stacklevel=3)
    return mod


def create_backend(opts: Any, backend_options: Any = None) -> Any:
    """The creator torch.distributed calls (extended API) for each ringreduce process group:
    the C++ c10d Backend when the adapter builds, else the Python process group."""
    store, rank, size = opts.store, int(opts.group_rank), int(opts.group_size)
    timeout, name = opts.timeout, str(getattr(opts, "group_id", "") or "") or None
    members = [int(r) for r in getattr(opts, "global_ranks_in_group", None) or []] or None
    mod = _adapter()
    if mod is None:
        return ProcessGroupRingReduce(store, rank, size, timeout, name, members)
    return mod.RingReduceBackend(rank, size, _Impl(store, rank, size, timeout, name, members))


def impl_of(pg: Any = None) -> _Ops | None:
    """The ringreduce operations behind a torch process group (default: the world), or
    None when it is not a ringreduce one."""
    if pg is None:
        pg = dist.group.WORLD
    if isinstance(pg, _Ops):
        return pg
    try:
        b = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, AttributeError):
        return None
    impl = getattr(b, "impl", None)
    return impl if isinstance(impl, _Ops) else None


def register() -> None:
    """Register the "ringreduce" backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True,
                                  devices=["cpu"])


register()
