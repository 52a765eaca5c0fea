"""ringreduce.DistributedDataParallel: a drop-in for torch.nn.parallel.DistributedDataParallel
on CPU modules, reducing gradients over the ringreduce communicator.

    import ringreduce as rr
    from ringreduce.ddp import DistributedDataParallel as DDP
    rr.init()
    model = DDP(model)                       # same arguments as torch's where they matter
    loss_fn(model(x), y).backward()          # gradients averaged across ranks, overlapped
    optimizer.step()

Uneven inputs (ranks with different numbers of batches): wrap the loop in ``model.join()``
(torch's semantics, see DistributedDataParallel.join and ringreduce/ddp/join.py): a rank
that runs out of batches shadows the others' collectives with zero gradients until every
rank is done, then all ranks take the model of the rank that ran longest. Without join(), a
rank that stops early makes the others fail with an error naming it (it left, or its
process died), never a hang; the same holds for a rank killed during backward
(PeerFailure from backward()), and ranks whose models differ get a ValueError at
construction naming the first differing parameter or buffer.

CUDA modules (one device per process, device_ids None or [that device], like torch) reduce
their gradient buckets through ringreduce.allreduce's CUDA dispatch: NCCL when every rank can
use it, else staged through pinned host memory; see ddp/_cuda.py for the stream ordering.

Differences from torch's wrapper: single-device modules only (CPU or one CUDA device),
dense gradients only (sparse embeddings are refused at construction), process_group= a
ringreduce Group (default: the world), torch's own comm hooks only with a torch process
group (ringreduce.ddp.hooks has allreduce / fp16 / bf16 hooks without one); join()
is a method of this wrapper only (it is not a torch Joinable, so it cannot be combined with
other joinables in torch.distributed.algorithms.join.Join). With world size 1 the wrapper is
a pass-through (no hooks, no copies; comm hooks are not called; join() does nothing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch import nn

from .. import _env, _state
from .._cpus import usable_cpus
from . import _cuda
from ._sync import BufferSync, broadcast_tensors, verify_shapes
from .buckets import FIRST_BUCKET_BYTES, cap_bytes
from .join import Join
from .reducer import Reducer

__all__ = ["DistributedDataParallel"]

# torch arguments we accept only at their defaults (value -> why unsupported)
_UNSUPPORTED_DEFAULTS = {
    "delay_all_reduce_named_params": None,
    "param_to_hook_all_reduce": None,
    "mixed_precision": None,
    "device_mesh": None,
    "skip_all_reduce_unused_params": False,
    "bucket_cap_mb_list": None,
    "batched_grad_copy": False,
}


def overlap_policy(g: Any, device: Any) -> bool:
    """Whether gradient buckets are all-reduced during backward (RINGREDUCE_DDP_OVERLAP).

    Overlap hides communication where something else does it or a core is idle: a GPU
    computes while the CPU communicates, a network moves bytes while the CPU waits. Between
    ranks of one host, communication is CPU work (copies and sums through shared memory or
    loopback); when the ranks' torch threads already fill every usable CPU, running it during
    backward only makes the two compete for cores (and caches), which costs more than doing
    it afterwards with whole cores (bench/ddp_step.py measures both). The choice changes
    when collectives run, never which ones or in what order, so ranks that decide
    differently still match."""
    mode = _env.tunables().ddp_overlap
    if mode != "auto":
        return mode == "on"
    hosts = list(g.hosts or [])
    if device is not None or not hosts or any(h != hosts[0] for h in hosts):
        return True
    # Every rank of the job on this host computes, not only this group's (DDP over groups).
    world = _state._DEFAULT[0]
    local = sum(h == hosts[0] for h in world.hosts) if world is not None and world.hosts \
        else len(hosts)
    return max(local, len(hosts)) * torch.get_num_threads() < usable_cpus()


class DistributedDataParallel(nn.Module):
    """Data-parallel wrapper: every rank holds a replica; gradients are averaged in buckets,
    overlapped with backward.

    Args (as torch.nn.parallel.DistributedDataParallel):
        module: the model (CPU parameters). Every rank must build the same architecture;
            construction checks shapes across ranks and copies rank 0's parameters and
            buffers to all ranks (unless init_sync=False).
        broadcast_buffers: broadcast rank 0's buffers (e.g. BatchNorm running stats) at the
            start of each forward; False also leaves them out of the construction's sync.
        forward_sync_buffers: torch 2.13's name for broadcast_buffers, except that buffers
            are synchronised at construction whatever its value (as torch).
        bucket_cap_mb: bucket size cap in MiB (default 25); the first bucket is 1 MiB so
            communication starts early in backward; 0: one bucket per parameter.
        find_unused_parameters: allow parameters that get no gradient in an iteration
            (traverses the autograd graph after each forward, and reduces a used-flags map at
            the end of backward; parameters unused on every rank keep their .grad).
        gradient_as_bucket_view: make .grad views into the flat buckets (saves a copy and
            the memory of a second gradient copy).
        static_graph: the set of used parameters is the same every iteration: it is learned
            in the first iteration and not re-detected afterwards.
    """

    def __init__(self, module: nn.Module, device_ids: list | None = None,
                 output_device: Any = None, dim: int = 0,
                 broadcast_buffers: bool | None = None, init_sync: bool = True,
                 process_group: Any = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 **kwargs: Any) -> None:
        super().__init__()
        # torch's newer name for broadcast_buffers, which leaves the construction's buffer
        # sync on; check_reduction is ignored by torch too.
        forward_sync_buffers = kwargs.pop("forward_sync_buffers", None)
        init_sync_buffers = broadcast_buffers is None or bool(broadcast_buffers)
        if forward_sync_buffers is not None:
            broadcast_buffers, init_sync_buffers = forward_sync_buffers, True
        for name, value in kwargs.items():
            if name not in _UNSUPPORTED_DEFAULTS:
                raise TypeError(f"DistributedDataParallel got an unexpected argument {name!r}")
            if value != _UNSUPPORTED_DEFAULTS[name]:
                raise NotImplementedError(
                    f"ringreduce DistributedDataParallel does not support {name}={value!r} yet; "
                    f"leave it at its default, or use torch.nn.parallel.DistributedDataParallel "
                    f"over the 'ringreduce' backend")
        if process_group is not None and not isinstance(process_group, _state.Group):
            raise TypeError(
                "ringreduce DistributedDataParallel takes process_group= as a ringreduce "
                "Group (ringreduce.new_group / Group.split), got "
                f"{type(process_group).__name__}; for a torch ProcessGroup use torch's DDP "
                "over the 'ringreduce' backend")
        sparse = [n for n, m in module.named_modules()
                  if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse]
        if sparse:
            raise NotImplementedError(
                f"ringreduce DistributedDataParallel does not reduce sparse gradients "
                f"({', '.join(sparse[:4])} {'has' if len(sparse) == 1 else 'have'} "
                f"sparse=True); use sparse=False, or torch.nn.parallel.DistributedDataParallel "
                f"over the 'ringreduce' backend, which reduces them")
        params_all = list(module.named_parameters())
        if any(isinstance(p, nn.parameter.UninitializedParameter) for _, p in params_all):
            raise RuntimeError(  # torch's words (a lazy module before its first forward)
                "Modules with uninitialized parameters can't be used with "
                "`DistributedDataParallel`. Run a dummy forward pass to correctly initialize "
                "the modules")
        ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()) or ())
        if not any(p.requires_grad for n, p in params_all if n not in ignore):
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")
        device = _cuda.module_device(params_all)
        ids, out_dev = _cuda.check_device_args(device, device_ids, output_device)
        g = _state.resolve(process_group, "DistributedDataParallel()")
        self.process_group = process_group
        if device is not None:
            _cuda.require_cuda_comm(device)
        self.module = module
        self.device_ids = ids
        self.output_device = out_dev
        self.dim = dim
        self.broadcast_buffers = bool(broadcast_buffers) if broadcast_buffers is not None else True
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.bucket_bytes_cap = cap_bytes(bucket_cap_mb if bucket_cap_mb is not None else 25)
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._rank = g.rank
        self._world = g.world_size

        params = [(n, p) for n, p in params_all if n not in ignore]
        buffers = [(n, b) for n, b in module.named_buffers() if n not in ignore]
        self._ignored = ignore
        self._sync_params = params  # what join() makes identical at the end
        self._join: Join | None = None
        self._join_in_error = False
        self.reducer: Reducer | None = None
        self._buffer_sync: BufferSync | None = None
        if self._world == 1:
            return
        # Buffers are checked and copied from rank 0 unless broadcast_buffers=False (torch's
        # init sync leaves them alone then; forward_sync_buffers=False does not).
        checked = buffers if init_sync_buffers else []
        verify_shapes([n for n, _ in params] + [n for n, _ in checked],
                      [p for _, p in params] + [b for _, b in checked], self._rank,
                      self._world, num_buffers=len(checked), group=process_group,
                      options=[("bucket_cap_mb", self.bucket_bytes_cap),
                               ("find_unused_parameters", find_unused_parameters),
                               ("static_graph", static_graph), ("init_sync", init_sync),
                               ("broadcast_buffers", self.broadcast_buffers),
                               ("buffer sync at init (forward_sync_buffers)", init_sync_buffers)])
        if init_sync:
            broadcast_tensors([p for _, p in params] + [b for _, b in checked], 0, self._rank,
                              group=process_group)
        self._make_reducer()

    def _make_reducer(self) -> None:
        """The buffer sync and the gradient reducer (no collective: construction has made
        the replicas equal, or they were copied from one that was)."""
        g = _state.resolve(self.process_group, "DistributedDataParallel()")
        self._buffer_sync = BufferSync(self._rank, self.process_group)
        trainable = [(n, p) for n, p in self._sync_params if p.requires_grad]
        if not trainable:
            return
        self.reducer = Reducer(
            [p for _, p in trainable], [n for n, _ in trainable], self._world, self._rank,
            self.bucket_bytes_cap, FIRST_BUCKET_BYTES, self.gradient_as_bucket_view,
            self.find_unused_parameters, self.static_graph, self.process_group)
        self.reducer.overlap = overlap_policy(g, _cuda.module_device(self._sync_params))

    # ------------------------------------------------------------------ copies
    def __getstate__(self) -> dict:
        """copy.deepcopy / pickle (torch.save of the wrapper), as torch: the copy gets a
        reducer of its own on the world, without the comm hook; only a wrapper on the world
        (process_group=None) can be copied."""
        if self.process_group is not None:
            raise RuntimeError(
                "DistributedDataParallel pickling / deepcopy is supported only with the "
                "default group (process_group=None), as in torch; copy or save "
                "model.module instead and wrap the copy in a new DistributedDataParallel")
        state = dict(self.__dict__)
        for k in ("reducer", "_buffer_sync", "_join", "_comm_hook_set"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.reducer, self._buffer_sync, self._join = None, None, None
        g = _state.resolve(None, "unpickling a DistributedDataParallel")
        self._rank, self._world = g.rank, g.world_size
        if self._world > 1:
            self._make_reducer()

    @property
    def _buffer_list(self) -> list[torch.Tensor]:
        """The module's buffers now: read at every sync, as torch's _assign_modules_buffers,
        because a module may reassign one (`self.ema = 0.9 * self.ema + ...`): a list made
        at construction would broadcast into the old tensors, leaving the replicas' buffers
        to drift apart without an error."""
        ignored = getattr(self, "_ignored", ())  # absent in a wrapper saved before 8d29f3b
        return [b for n, b in self.module.named_buffers() if n not in ignored]

    @property
    def forward_sync_buffers(self) -> bool:
        """torch 2.13's name for broadcast_buffers."""
        return self.broadcast_buffers

    @forward_sync_buffers.setter
    def forward_sync_buffers(self, value: bool) -> None:
        self.broadcast_buffers = bool(value)

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._world == 1:
            return self.module(*inputs, **kwargs)
        grad_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        if (self._join is not None and not torch.is_grad_enabled() and self.reducer is not None
                and self.reducer.iteration_open):
            # Inside join(), a forward without autograd while an iteration awaits its
            # backward issues no collective: the joined ranks already shadow that
            # iteration's all-reduces, which come before any other collective.
            return self.module(*inputs, **kwargs)
        if self.reducer is not None and grad_sync:
            # A forward without autograd (torch.no_grad(): a metric, a validation batch) or
            # inside no_sync() leaves an iteration prepared for a backward open, as torch's
            # does: closing it made that backward (through both outputs, say) skip its
            # all-reduce, and each rank kept its own gradients.
            self.reducer.check_usable()
            self.reducer.close_open_iteration()
        buffers = self._buffer_list
        sync_buffers = bool(self.require_forward_param_sync and self.broadcast_buffers
                            and buffers)
        src = 0
        if self._join is not None:  # inside join(): tell the others this rank still trains
            src = self._join.notify(grad_sync, sync_buffers)
        if sync_buffers:
            self._buffer_sync(buffers, src)
        out = self.module(*inputs, **kwargs)
        self.require_forward_param_sync = grad_sync
        if grad_sync and self.reducer is not None:
            self.reducer.prepare(out)
        return out

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient reduction for the backward passes of forwards run inside this
        context: gradients accumulate locally and are reduced with the first backward after
        it (as torch DDP's no_sync)."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """Context manager for training with uneven inputs (torch DDP's join()).

            with model.join():
                for x, y in my_shard:               # ranks may have different lengths
                    loss_fn(model(x), y).backward()
                    opt.step(); opt.zero_grad()

        Every forward inside the context (on every rank, whatever the grad mode) takes
        part in one small all-reduce of "still training" flags. A rank that leaves the body
        shadows the others: for each iteration they still run it contributes zero
        gradients to every bucket, in their bucket order, until all ranks have left; then
        parameters (and buffers, with broadcast_buffers) are broadcast from the rank that
        ran the most iterations (the highest such rank), so every rank ends with the same
        model. Joined ranks do not step their optimizers; optimizer state (e.g. momentum)
        is not synchronised, as in torch.

        Args:
            divide_by_initial_world_size: True (default) divides the summed gradients by
                the initial world size, so every sample weighs the same; False divides by
                the number of ranks still training in that iteration (parity with a
                smaller world). With a comm hook the hook does the division, as in torch.
            enable: False makes the context a no-op (inputs known to be even).
            throw_on_early_termination: as soon as any rank runs out, every rank raises a
                RuntimeError naming the rank(s) that ran out, at the same iteration (active
                ranks from forward(), joined ranks when leaving the context); the process
                group stays usable.

        Inside the context: no_sync() and torch.no_grad() forwards are shadowed correctly
        (the flags carry "synchronised backward" and "buffer broadcast" bits), as are
        find_unused_parameters, static_graph, gradient_as_bucket_view, comm hooks and the
        first-iteration bucket rebuild. Buffers are broadcast from the highest rank still
        training (torch does the same: rank 0 may have stopped). Ranks that disagree about
        a forward's grad mode / no_sync() get an error on every rank. Not supported: other
        collectives in the loop (e.g. SyncBatchNorm, a metric all-reduce) -- the joined
        ranks do not know about them: use throw_on_early_termination=True then (torch's
        advice too); combining with other torch Joinables (ZeroRedundancyOptimizer).
        A non-join error inside the body on one rank is not shadowed: the other ranks fail
        at their collective timeout (RINGREDUCE_TIMEOUT) or when that rank's process exits.
        """
        return Join(self, divide_by_initial_world_size, enable, throw_on_early_termination)

    def join_hook(self, **kwargs: Any) -> Any:
        """What torch's Join([...]) asks a Joinable for: this wrapper is not one (its
        join() is its own); say so instead of torch's AttributeError."""
        raise TypeError("ringreduce.DistributedDataParallel is not a torch Joinable: use its "
                        "own context, `with model.join(): ...`, instead of torch.distributed."
                        "algorithms.join.Join([model]) (or torch's DistributedDataParallel on "
                        "init_process_group('ringreduce'), which is one)")

    # ------------------------------------------------------------------ hooks
    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Reduce each bucket with ``hook(state, bucket) -> torch.futures.Future`` instead
        of the built-in average (see ringreduce.ddp.hooks: fp16_compress_hook,
        bf16_compress_hook; torch's hook signature). Register once, before training."""
        if not callable(hook):
            raise TypeError("register_comm_hook: hook must be callable as hook(state, bucket)")
        import torch.distributed as dist

        if (getattr(hook, "__module__", "") or "").startswith(
                "torch.distributed.algorithms.ddp_comm_hooks") and not dist.is_initialized():
            raise TypeError(
                f"register_comm_hook: torch's {getattr(hook, '__name__', hook)} reduces through "
                f"a torch process group, and none exists (only ringreduce.init() was called); "
                f"use ringreduce.ddp.hooks (allreduce_hook, fp16_compress_hook, "
                f"bf16_compress_hook), or call dist.init_process_group('ringreduce') first")
        if getattr(self, "_comm_hook_set", False):
            raise RuntimeError("register_comm_hook can only be called once")
        self._comm_hook_set = True
        if self.reducer is not None:
            if self.reducer.stats.iterations:
                raise RuntimeError("register_comm_hook must be called before the first "
                                   "backward")
            self.reducer.comm_hook = hook
            self.reducer.comm_hook_state = state

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        from . import hooks

        name = str(getattr(comm_hook_type, "name", comm_hook_type)).upper()
        table = {"ALLREDUCE": hooks.allreduce_hook, "FP16_COMPRESS": hooks.fp16_compress_hook}
        if name not in table:
            raise ValueError(f"unknown built-in comm hook {comm_hook_type!r}")
        self.register_comm_hook(None, table[name])

    # ------------------------------------------------------------------ introspection
    def bucket_parameter_names(self) -> list:
        """Names of the parameters in each bucket, bucket 0 (reduced first) first."""
        if self.reducer is None:
            return []
        return [[self.reducer.names[i] for i in b] for b in self.reducer.bucket_indices()]

    def _get_ddp_logging_data(self) -> dict:
        r = self.reducer
        return {
            "world_size": self._world,
            "rank": self._rank,
            "bucket_cap_bytes": self.bucket_bytes_cap,
            "num_buckets": len(r.buckets) if r else 0,
            "find_unused_parameters": self.find_unused_parameters,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "static_graph": self.static_graph,
            "comm_wait_s": r.stats.wait_s if r else 0.0,
        }
