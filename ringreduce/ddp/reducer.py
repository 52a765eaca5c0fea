"""Reducer: bucketed gradient all-reduce overlapped with backward.

Contract (what every rank does, in the same order, so collectives always match):
  * forward (grad enabled, sync on): prepare() opens an iteration; with unused-parameter
    detection it finds the parameters not reachable from the outputs, and the first
    gradient hook of the backward marks them ready (zeros) -- not prepare() itself: a
    forward never followed by a backward (a logging or evaluation forward on one rank)
    issues no collective, as in torch.
  * backward: each parameter's post-accumulate-grad hook copies its gradient into its slot of
    a flat bucket buffer (or the gradient already is that slot: gradient_as_bucket_view).
    When a bucket's last slot is filled the bucket is ready; ready buckets are launched
    (async all-reduce, or the comm hook) strictly in bucket-index order: a bucket that is
    ready early waits for all lower-index buckets to be launched.
  * end of backward (engine callback, queued by the first hook; one that runs at the end of
    a nested backward -- reentrant checkpointing -- while gradients are still missing hands
    over to the next hook, which queues it on the outer backward): parameters that got no
    gradient are filled with zeros so that every bucket is launched on every rank, the
    works are waited for in order and the averaged gradients written back. A missing
    gradient without find_unused_parameters raises after the collectives completed, so the
    other ranks are not left hanging.
  * no_sync() backwards record which parameters got a gradient (unused-parameter
    detection): a parameter used only in accumulated micro-batches is reduced, as in torch.
  * a backward that never finished (it raised) is an error at every later synchronised
    forward: the ranks no longer agree on which collectives were issued.
  * after the first synchronised iteration, buckets are rebuilt in the gradient-ready order
    rank 0 observed (broadcast, so all ranks agree).
  * inside DistributedDataParallel.join() (join_mode): every synchronised iteration is
    finalised (also one whose backward never ran: at the next forward, or when the rank
    leaves the join body), and the rebuild / static-graph learning happen at the first
    finalise whatever it saw, so a rank that ran out of inputs can replay the exact
    schedule with shadow_iteration(): zero buckets in bucket-index order, the used-map
    reduction when detecting unused parameters, the rebuild broadcast once.

Threads: everything here runs on the thread running forward/backward (the autograd engine
runs CPU backward on the calling thread); the core runs the collectives on its own worker.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .. import _C, _env, _trace, api
from ._cuda import GradEvents
from .buckets import FIRST_BUCKET_BYTES, assign_buckets, complete_order
from .hooks import GradBucket


class _Done:
    """The Work of a bucket reduced synchronously."""

    def wait(self) -> None:
        return None


_DONE = _Done()


@dataclass
class Bucket:
    index: int
    members: list  # parameter indices, in bucket order
    buffer: torch.Tensor  # flat, dtype of its parameters
    views: list  # per member, a view of `buffer` shaped like the parameter
    offsets: list = field(default_factory=list)


@dataclass
class Stats:
    """Timings of the last synchronised backward (seconds)."""

    wait_s: float = 0.0  # end-of-backward time in collectives (unhidden; with overlap off all)
    finalize_s: float = 0.0  # whole end-of-backward callback (wait + write-back)
    launch_times: list = field(default_factory=list)  # perf_counter() of each bucket launch
    in_place: int = 0  # buckets all-reduced in the gradients themselves (no bucket copies)
    early: int = 0  # buckets launched during backward (0 with overlap off)
    iterations: int = 0


class Reducer:
    def __init__(self, params: list, names: list, world_size: int, rank: int, cap: int,
                 first_cap: int = FIRST_BUCKET_BYTES, gradient_as_bucket_view: bool = False,
                 find_unused_parameters: bool = False, static_graph: bool = False,
                 group: Any = None):
        self.params = params
        self.group = group  # process_group: a ringreduce Group, or None for the world
        self.src0 = 0 if group is None else group.ranks[0]  # world rank of group rank 0
        self.names = names
        self.n = len(params)
        self.world = world_size
        self.rank = rank
        self.cap = cap
        self.first_cap = first_cap
        self.grad_as_view = gradient_as_bucket_view
        self.find_unused = find_unused_parameters
        self._said_all_used = False  # find_unused with nothing unused: warned once
        self.static_graph = static_graph
        self.comm_hook: Callable | None = None
        # Launch each bucket as soon as it is ready (during backward), or all of them at the
        # end of backward (see DistributedDataParallel's overlap policy, ddp/wrapper.py).
        self.overlap = True
        # Read here, not at import: `import torch` imports this package (its backend entry
        # point), and a bad RINGREDUCE_* value must not break that.
        self.tracing = bool(_env.tunables().trace)
        # join(): True while inside a join context; join_divisor: the number of ranks still
        # training this iteration when join(divide_by_initial_world_size=False), else None.
        self.join_mode = False
        self.join_divisor: int | None = None
        self.comm_hook_state: Any = None
        self.stats = Stats()
        self._index_of = {id(p): i for i, p in enumerate(params)}
        # static_graph, learned in iteration 1: the parameters unused on every rank (their
        # .grad is left alone), and those unused on this rank (marked ready, zeros, by the
        # first hook: a branch only another rank takes still gets its average, as torch's).
        self._static_unused: list | None = None
        self._static_mine: list = []
        # static_graph: how many times each parameter's hook fired in iteration 1 (a layer
        # run under two reentrant checkpoints fires twice); later iterations mark it ready
        # at its last one, as torch's numGradHooksTriggeredMap.
        self._hook_counts: list | None = None
        # Detection mode: parameters that got a gradient in no_sync() backwards since the
        # last synchronised iteration (torch's local_used_map counts them too).
        self._used_unsynced: set = set()
        self._broken: str | None = None  # why this reducer is out of step with its peers
        self._rebuilt = False
        self.buckets: list[Bucket] = []
        self._loc: list = [None] * self.n  # param index -> (bucket, slot)
        self._build([i for i in reversed(range(self.n))])
        self._reset()
        # A post hook on each parameter's AccumulateGrad node, as torch's reducer: it runs
        # after the parameter's own post-accumulate-grad hooks, also those registered after
        # wrapping, so a bucket is reduced once they changed the gradient (a tensor hook of
        # ours ran first, and the all-reduce raced with theirs: found by a helper). Autograd
        # holds the nodes weakly; kept here so the hooks stay on them.
        self._grad_accs = [torch.autograd.graph.get_gradient_edge(p).node for p in params]
        ref = weakref.ref(self)
        self._handles = [acc.register_hook(_make_hook(ref, i))
                         for i, acc in enumerate(self._grad_accs)]

    # ------------------------------------------------------------------ buckets
    def _build(self, order: list) -> None:
        groups = assign_buckets(order, [p.numel() * p.element_size() for p in self.params],
                                [p.dtype for p in self.params], self.cap, self.first_cap)
        old = self.buckets
        buckets = []
        for bi, members in enumerate(groups):
            dtype = self.params[members[0]].dtype
            total = sum(self.params[i].numel() for i in members)
            buf = torch.zeros(total, dtype=dtype, device=self.params[members[0]].device)
            views, offs, off = [], [], 0
            for k, i in enumerate(members):
                p = self.params[i]
                # Laid out as the parameter (channels_last, a transpose), as torch's bucket
                # views: gradients as bucket views keep the parameter's strides.
                views.append(buf.as_strided(p.shape, p.stride(), off) if _dense(p)
                             else buf[off:off + p.numel()].view(p.shape))
                offs.append(off)
                self._loc[i] = (bi, k)
                off += p.numel()
            buckets.append(Bucket(bi, list(members), buf, views, offs))
        if self.grad_as_view and old:
            # Gradients are views into the old buckets: move them into the new ones.
            old_views = {i: b.views[k] for b in old for k, i in enumerate(b.members)}
            for b in buckets:
                for k, i in enumerate(b.members):
                    g = self.params[i].grad
                    if g is not None and _same(g, old_views[i]):
                        b.views[k].copy_(g)
                        self.params[i].grad = b.views[k]
        self.buckets = buckets
        self._events = GradEvents(len(buckets)) if buckets and buckets[0].buffer.is_cuda else None

    def bucket_indices(self) -> list:
        """Parameter indices of each bucket, bucket 0 first (reduced first)."""
        return [list(b.members) for b in self.buckets]

    # ------------------------------------------------------------------ iteration state
    def _reset(self) -> None:
        nb = len(self.buckets)
        self._open = False
        self._fired_any = False
        self._launched_any = False
        self._callback_queued = False
        self._pending = [len(b.members) for b in self.buckets]
        self._ready = [False] * self.n
        self._fired = [False] * self.n
        self._fires = [0] * self.n  # hook calls this backward (static_graph counts them)
        self._next = 0
        self._works: list = [None] * nb
        self._order: list = []
        self._unused_pending: list = []  # marked ready (zeros) by the first hook
        self._changed: list = []  # static graph: unused when learned, a gradient now
        # Parameters whose gradient was left where autograd put it (not copied into the
        # bucket yet), and buckets all-reduced on those gradients in place (_launch).
        self._in_place = [False] * self.n
        self._direct = [False] * nb

    def _detect_unused(self) -> bool:
        return self.find_unused or self._learning()

    def _learning(self) -> bool:
        """static_graph's first iteration: every reduction waits for the end of backward,
        as torch's (delay_all_reduce), where each parameter's hooks have all fired."""
        return self.static_graph and self._static_unused is None

    @property
    def iteration_open(self) -> bool:
        """Whether a synchronised forward's backward is awaited."""
        return self._open

    def close_open_iteration(self) -> None:
        """Called at the start of every forward: a new forward ends the previous iteration."""
        if self._open:
            self._close_stale()
        self._reset()

    def check_usable(self) -> None:
        """Called before a synchronised forward: refuse to go on out of step (see _close_stale)."""
        if self._broken is not None:
            raise RuntimeError(self._broken)

    def prepare(self, outputs: Any) -> None:
        """Called at the end of a forward that will be followed by a synchronised backward."""
        if self._open:
            self._close_stale()
        self._reset()
        self._open = True
        self.stats.launch_times = []
        if self.find_unused:
            used = self._reachable(outputs)
            self._unused_pending = [i for i in range(self.n) if i not in used]
            if not self._unused_pending and not self._said_all_used:
                self._said_all_used = True  # torch's reducer says it once too
                warnings.warn(
                    "find_unused_parameters=True was given to DistributedDataParallel, but "
                    "this forward used every parameter. The flag costs a traversal of the "
                    "autograd graph and a small all-reduce every iteration: if the model never "
                    "leaves a parameter unused, turn it off (this may be a false positive if "
                    "later iterations take another path)", UserWarning, stacklevel=4)
        elif self.static_graph:
            # Learned from the gradients of the first backward (as torch's static graph),
            # not from the graph, which reentrant checkpointing hides.
            self._unused_pending = list(self._static_mine)
        if self._learning():
            # The end of the outermost backward, not of a reentrant one inside it (whose
            # callback comes first): a hook on each output runs on the outer backward, as
            # torch's _DDPSink queues its delayed all-reduce.
            for t in _tensors(outputs):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._queue_outer)

    def _close_stale(self) -> None:
        """The previous synchronised forward's iteration never finished."""
        if self._fired_any:
            self._reset()
            self._broken = (
                "DistributedDataParallel: expected to have finished reduction in the prior "
                "iteration before starting a new one. A backward did not complete (did it "
                "raise?), so this rank's gradient all-reduces are out of step with the other "
                "ranks'; training on would average gradients of different steps. Re-create "
                "the process group and the DDP model (e.g. from a checkpoint) to recover.")
            raise RuntimeError(self._broken)
        if self._launched_any or self.join_mode:
            # Inside join() a joined rank shadows every synchronised iteration, also one
            # without a backward: finish it exactly as a backward would.
            self._finalize(from_engine=False)

    def _reachable(self, outputs: Any) -> set:
        """Indices of parameters reachable from the outputs' autograd graph."""
        used: set = set()
        stack = []
        for t in _tensors(outputs):
            if t.grad_fn is not None:
                stack.append(t.grad_fn)
            elif t.requires_grad and id(t) in self._index_of:
                used.add(self._index_of[id(t)])
        seen: set = set()
        while stack:
            fn = stack.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            var = getattr(fn, "variable", None) if type(fn).__name__ == "AccumulateGrad" else None
            if var is not None:
                i = self._index_of.get(id(var))
                if i is not None:
                    used.add(i)
            for nxt, _ in fn.next_functions:
                if nxt is not None and nxt not in seen:
                    stack.append(nxt)
        return used

    # ------------------------------------------------------------------ hooks
    def _queue_outer(self, grad: torch.Tensor) -> None:
        if self._open and not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._engine_callback)
            self._callback_queued = True

    def _on_grad(self, i: int) -> None:
        if not self._open:  # no_sync(), or a backward not preceded by a DDP forward
            if self._detect_unused() and self.params[i].grad is not None:
                self._used_unsynced.add(i)
            return
        if self._unused_pending:  # the first gradient of this backward
            pending, self._unused_pending = self._unused_pending, []
            for j in pending:
                self._mark_ready(j, have_grad=False)
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._engine_callback)
            self._callback_queued = True
        if self._ready[i] and not self._fired[i] and self._static_unused is not None:
            # static_graph=True learned this parameter unused: the graph changed. Raised
            # after the backward's collectives (every rank's match), not here mid-backward,
            # where the others then failed on a mismatch (found by a helper).
            if i not in self._changed:  # (a reentrant backward may bring it twice)
                self._changed.append(i)
            return
        if self._ready[i]:
            raise RuntimeError(self._twice(i))
        self._fires[i] += 1
        self._fired_any = True
        if not self._fired[i] and not self._rebuilt:
            self._order.append(i)
        self._fired[i] = True
        if self._learning():
            return  # counted; reduced at the end of backward (_finalize)
        if self._hook_counts is not None and self._fires[i] < max(1, self._hook_counts[i]):
            return  # more of its gradient to come in this backward, as in iteration 1
        self._mark_ready(i, have_grad=True)

    def _twice(self, i: int) -> str:
        if not self._fired[i]:
            why = ("it was marked unused after forward (not reachable from the outputs) but "
                   "received a gradient")
        elif self._hook_counts is not None:
            why = (f"it received its gradient {self._fires[i] + 1} times in one backward, "
                   f"{self._hook_counts[i]} in the first iteration (static_graph=True learnt "
                   f"that); the graph changed")
        else:
            why = ("it received its gradient twice in one backward (reentrant backward, e.g. "
                   "torch.utils.checkpoint with use_reentrant=True, or the same parameter used "
                   "in several backward passes)")
        fix = ("Pass find_unused_parameters=True instead for a graph that changes" if
               self._hook_counts is not None else
               "Use static_graph=True for a fixed graph with reentrant checkpointing, or "
               "torch.utils.checkpoint(..., use_reentrant=False)")
        return (f"DistributedDataParallel: parameter '{self.names[i]}' was marked ready twice: "
                f"{why}. {fix}.")

    def _mark_ready(self, i: int, have_grad: bool) -> None:
        b, k = self._loc[i]
        view = self.buckets[b].views[k]
        p = self.params[i]
        g = p.grad
        if have_grad and g is not None:
            if self.grad_as_view:
                if not _same(g, view):
                    view.copy_(g)
                    p.grad = view
            elif self._may_skip_copy() and _plain_like(g, view):
                self._in_place[i] = True  # copied only if its bucket needs the flat buffer
            else:
                view.copy_(g)
        elif g is not None:
            # No gradient from this backward, but one accumulated before (no_sync() micro-
            # batches): contribute it, as torch does (a gradient that already is this slot --
            # gradient_as_bucket_view -- as it is).
            if not _same(g, view):
                view.copy_(g)
        else:
            view.zero_()  # no gradient at all: zeros
        if self._events is not None:  # CUDA: the launch waits for this copy's stream
            self._events.record(b)
        self._ready[i] = True
        self._pending[b] -= 1
        if self._pending[b] == 0:
            while self._next < len(self.buckets) and self._pending[self._next] == 0:
                if self.overlap:
                    self._launch(self._next)
                else:  # launched at the end of backward (_finalize), in this order
                    self._launched_any = True
                self._next += 1

    def _launch(self, b: int, sync: bool = False) -> None:
        """Start bucket b's reduction; sync (overlap off, at the end of backward): run it
        on this thread, which would only wait for the worker otherwise -- no hand-off, and
        the gradients stay in this core's cache for the optimizer."""
        bucket = self.buckets[b]
        self._launched_any = True
        if self._events is not None:
            self._events.wait_all(b)
        self.stats.launch_times.append(time.perf_counter())
        if self.tracing:  # RINGREDUCE_TRACE: mark the launch, to see overlap with backward
            _trace.label(f"ddp bucket {b} launched ({bucket.buffer.numel() * bucket.buffer.element_size() >> 10} KiB)")
        if self.comm_hook is not None:
            gb = GradBucket(b, bucket.buffer, bucket.views,
                            [self.params[i] for i in bucket.members],
                            b == len(self.buckets) - 1, self.world, self.group)
            fut = self.comm_hook(self.comm_hook_state, gb)
            if not isinstance(fut, torch._C.Future):
                raise TypeError(
                    f"comm hook {getattr(self.comm_hook, '__name__', self.comm_hook)} returned "
                    f"{type(fut).__name__}; it must return a torch.futures.Future whose value "
                    f"is the reduced bucket tensor")
            self._works[b] = fut
        elif all(self._in_place[i] for i in bucket.members):
            # Every gradient is a plain tensor of the bucket's dtype: reduce them where they
            # are, as one collective (shared memory reads and writes them in place), instead
            # of copying them into the bucket and back -- two passes over the bucket saved.
            self._direct[b] = True
            self._works[b] = api.allreduce_coalesced(
                [self.params[i].grad for i in bucket.members], op=self._op(),
                async_op=not sync, group=self.group) or _DONE
        else:
            for k, i in enumerate(bucket.members):
                if self._in_place[i]:
                    bucket.views[k].copy_(self.params[i].grad)
            self._works[b] = api.allreduce(bucket.buffer, op=self._op(), async_op=not sync,
                                           group=self.group) or _DONE

    def _may_skip_copy(self) -> bool:
        # Plain all-reduce of host gradients: no comm hook (it is handed the bucket), no
        # join division, no CUDA streams to order, gradients not views of the bucket.
        return (self.comm_hook is None and self.join_divisor is None and self._events is None
                and not self.grad_as_view)

    def _op(self) -> str:
        # join(divide_by_initial_world_size=False): sum, then divide by the active count.
        return "avg" if self.join_divisor is None else "sum"

    # ------------------------------------------------------------------ end of backward
    def _engine_callback(self) -> None:
        if _in_nested_backward() and (self._learning() or not all(self._ready)):
            # The end of a reentrant backward (torch.utils.checkpoint(use_reentrant=True))
            # inside the real one, whose other gradients are still to come: the next hook
            # queues the callback again, on the outer backward.
            self._callback_queued = False
            return
        self._finalize(from_engine=True)

    def _finalize(self, from_engine: bool) -> None:
        t0 = time.perf_counter()
        wait_s = 0.0
        error: str | None = None
        rebuild = False
        order: list = []
        try:
            self.stats.early = sum(w is not None for w in self._works)
            for i in range(self.n):  # static_graph's first iteration: all fired, now
                if self._fired[i] and not self._ready[i]:
                    self._mark_ready(i, have_grad=True)
            missing = [i for i in range(self.n) if not self._ready[i]]
            for i in missing:  # launch every remaining bucket: the collectives must match
                self._mark_ready(i, have_grad=False)
            tw = time.perf_counter()
            for b in range(len(self.buckets)):  # overlap off: every bucket, in order, now
                if self._works[b] is None:
                    self._launch(b, sync=True)
            wait_s += time.perf_counter() - tw
            detect = self._detect_unused()
            used_map = None
            if detect:
                # Which parameters got a gradient on any rank (max of 0/1 flags).
                used_map = torch.tensor([f or i in self._used_unsynced
                                         for i, f in enumerate(self._fired)], dtype=torch.int32)
                used_work = api.allreduce(used_map, op="max", async_op=True, group=self.group)
            elif (missing or self._changed) and from_engine:
                error = self._unused_error(missing, self._changed)
            # Without a backward (a forward whose iteration is closed by the next forward)
            # gradients are only written where some rank produced one (detect mode).
            write = from_engine or detect
            global_unused = None
            if not detect and self._static_unused:
                global_unused = [False] * self.n  # static graph: unused on every rank
                for i in self._static_unused:
                    global_unused[i] = True
            if detect:
                tw = time.perf_counter()
                for b in range(len(self.buckets)):
                    self._wait(b)
                used_work.wait()
                wait_s += time.perf_counter() - tw
                global_unused = [not bool(u) for u in used_map.tolist()]
                for b in range(len(self.buckets)):
                    self._write_back(b, global_unused)
            else:
                for b in range(len(self.buckets)):
                    tw = time.perf_counter()
                    self._wait(b)
                    wait_s += time.perf_counter() - tw
                    if write:
                        self._write_back(b, global_unused)
            if (self.static_graph and self._static_unused is None and global_unused is not None
                    and (from_engine or self.join_mode)):
                self._static_unused = [i for i, u in enumerate(global_unused) if u]
                self._static_mine = [i for i in missing if i not in self._used_unsynced]
                self._hook_counts = list(self._fires)
            # Inside join() the rebuild must not depend on what this rank saw: joined ranks
            # replay it unconditionally after the first shadowed iteration. Nor on this
            # rank's unused-parameter error (the others, without one, rebuild: the error is
            # raised after it, so every rank's next collective is the same).
            rebuild = not self._rebuilt and (
                self.join_mode or (self._fired_any and from_engine))
            order = list(self._order)
        except _C.RingReduceError as e:
            _add_hint(e, self.join_mode)
            raise
        finally:
            self.stats.in_place = sum(self._direct)
            self._used_unsynced.clear()
            self._reset()
        if rebuild:
            self._rebuild(order)
        self.stats.wait_s = wait_s
        self.stats.finalize_s = time.perf_counter() - t0
        self.stats.iterations += 1
        if error is not None:
            raise RuntimeError(error)

    def _wait(self, b: int) -> None:
        w = self._works[b]
        if self.comm_hook is None:
            w.wait()
            if self.join_divisor is not None:
                self.buckets[b].buffer.div_(self.join_divisor)
            return
        value = w.wait()
        if isinstance(value, (list, tuple)):
            if len(value) != 1:
                raise RuntimeError(f"comm hook result for bucket {b} holds {len(value)} "
                                   f"tensors; return exactly one (the reduced bucket)")
            value = value[0]
        buf = self.buckets[b].buffer
        if not isinstance(value, torch.Tensor) or value.numel() != buf.numel():
            raise RuntimeError(
                f"comm hook result for bucket {b} must be a tensor of {buf.numel()} elements, "
                f"got {type(value).__name__}"
                + (f" of {value.numel()}" if isinstance(value, torch.Tensor) else ""))
        if not _same(value.reshape(-1), buf):
            buf.copy_(value.reshape(-1))

    def _write_back(self, b: int, global_unused: list | None) -> None:
        if self._direct[b]:
            return  # reduced in the gradients themselves
        bucket = self.buckets[b]
        for k, i in enumerate(bucket.members):
            if global_unused is not None and global_unused[i]:
                continue  # no rank produced a gradient: leave .grad as it is (torch does)
            p = self.params[i]
            view = bucket.views[k]
            g = p.grad
            if self.grad_as_view:
                if g is None or not _same(g, view):
                    p.grad = view
            elif g is None:
                p.grad = view.clone()
            else:
                g.copy_(view)

    def _unused_error(self, missing: list, changed: list) -> str:
        def listed(ix: list) -> str:
            more = f" (and {len(ix) - 10} more)" if len(ix) > 10 else ""
            return ", ".join(f"'{self.names[i]}'" for i in ix[:10]) + more

        if self._static_unused is not None:  # static_graph=True, learned in iteration 1
            what = "; ".join(
                ([f"{listed(missing)} received a gradient then but none now"] if missing
                 else []) + ([f"{listed(changed)} received none then but one now"]
                             if changed else []))
            return (
                f"DistributedDataParallel on rank {self.rank}: your training graph has changed "
                f"in this iteration, which is not compatible with static_graph=True (it learnt "
                f"which parameters are used from the first iteration): {what}. Pass "
                f"find_unused_parameters=True instead of static_graph=True for a graph that "
                f"changes. (This iteration's gradients were reduced on all ranks as learnt; a "
                f"rank whose graph did not change goes on, and fails at its next collective "
                f"if this one stops.)")
        names = listed(missing)
        more = ""
        return (
            f"DistributedDataParallel on rank {self.rank}: {len(missing)} parameter(s) did not "
            f"receive a gradient in this backward: {names}{more}. This error indicates that "
            f"your module has parameters that were not used in producing loss. You can enable "
            f"unused parameter detection by passing the keyword argument "
            f"`find_unused_parameters=True` to DistributedDataParallel, and by making sure all "
            f"`forward` function outputs participate in calculating loss. (The gradients were "
            f"still reduced on all ranks, with zeros -- or a gradient accumulated earlier -- "
            f"for these parameters, so no rank hangs.)")

    def _rebuild(self, observed: list) -> None:
        """Rebuild buckets in rank 0's observed gradient-ready order (one broadcast)."""
        self._rebuilt = True
        order = complete_order(observed, self.n, range(self.n))
        t = torch.tensor(order, dtype=torch.int64)
        api.broadcast(t, src=self.src0, group=self.group)
        order = t.tolist()
        if [list(b.members) for b in self.buckets] == self._groups_for(order):
            return
        self._build(order)
        self._reset()

    # ------------------------------------------------------------------ join()
    def shadow_iteration(self) -> None:
        """On a rank that has left the join() body: issue exactly the collectives that the
        ranks still training issue for one synchronised iteration, contributing zeros.
        Bucket buffers are fresh zeros (this rank's .grad is left alone); the same op and
        comm hook as the active ranks, in bucket-index order."""
        works = []
        for b, bucket in enumerate(self.buckets):
            buf = torch.zeros_like(bucket.buffer)
            if self.comm_hook is not None:
                views = [buf[off:off + self.params[i].numel()].view(self.params[i].shape)
                         for off, i in zip(bucket.offsets, bucket.members)]
                gb = GradBucket(b, buf, views, [self.params[i] for i in bucket.members],
                                b == len(self.buckets) - 1, self.world, self.group)
                works.append(self.comm_hook(self.comm_hook_state, gb))
            else:
                works.append(api.allreduce(buf, op=self._op(), async_op=True, group=self.group))
        detect = self._detect_unused()
        if detect:
            used_map = torch.zeros(self.n, dtype=torch.int32)
            used_work = api.allreduce(used_map, op="max", async_op=True, group=self.group)
        for w in works:
            w.wait()
        if detect:
            used_work.wait()
            if self.static_graph and self._static_unused is None:
                self._static_unused = [i for i, u in enumerate(used_map.tolist()) if not u]
                self._static_mine = list(range(self.n))  # joined: this rank uses none
        if not self._rebuilt:
            self._rebuild([])  # rank 0's order (or, if rank 0 joined, registration order)

    def _groups_for(self, order: list) -> list:
        return assign_buckets(order, [p.numel() * p.element_size() for p in self.params],
                              [p.dtype for p in self.params], self.cap, self.first_cap)

    def remove_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __del__(self) -> None:  # the parameters may outlive the wrapper
        try:
            self.remove_hooks()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


def _add_hint(e: BaseException, in_join: bool) -> None:
    """A peer failed during the gradient all-reduce: say what to do (the exception keeps
    its type and message; the note shows in the traceback, Python >= 3.11)."""
    if not hasattr(e, "add_note"):
        return
    e.add_note(
        "DistributedDataParallel: the gradient all-reduce of this backward failed, so the "
        ".grad tensors are not (all) averaged across ranks: do not call optimizer.step(). "
        + ("" if in_join else "If a rank stopped early because ranks have different "
           "numbers of batches, wrap the training loop in `with model.join():`. ")
        + "The communicator is unusable: ringreduce.destroy(), ringreduce.init() and "
        "re-create the DDP model (e.g. from a checkpoint) to continue.")


def _in_nested_backward() -> bool:
    """Whether the autograd engine runs this (a final callback) at the end of a backward
    started inside another backward's node (reentrant checkpointing): that node is then
    still the thread's current one; at the end of the outermost backward there is none."""
    current = getattr(torch._C, "_current_autograd_node", None)
    return current is not None and current() is not None


_NO_COMPILED_AUTOGRAD = (
    "ringreduce.DistributedDataParallel does not run under compiled autograd "
    "(torch._dynamo.compiled_autograd): its gradient hooks start all-reduces from the "
    "backward as it runs, which compiled autograd traces instead. Run the backward without "
    "compiled autograd (torch.compile of the model still works), or use "
    "torch.nn.parallel.DistributedDataParallel on the \"ringreduce\" backend with "
    "torch._dynamo.config.optimize_ddp = \"python_reducer\"")


def _compiled_autograd() -> bool:
    ca = sys.modules.get("torch._dynamo.compiled_autograd")  # not imported: not on
    return bool(ca is not None and (getattr(ca, "compiled_autograd_enabled", False)
                                    or getattr(ca, "in_compiled_autograd_region", False)))


def _make_hook(ref: weakref.ref[Reducer], i: int) -> Callable:
    def hook(_grad_inputs: Any, _grad_outputs: Any) -> None:
        # Traced, it failed deep in dynamo ("queue_callback() is only supported when
        # Compiled Autograd is enabled with fullgraph=True"; found by a helper).
        if _compiled_autograd():
            raise RuntimeError(_NO_COMPILED_AUTOGRAD)
        r = ref()
        if r is not None:
            r._on_grad(i)
    return hook


def _plain_like(g: torch.Tensor, view: torch.Tensor) -> bool:
    """Whether gradient g can be all-reduced where it is in place of its bucket slot."""
    return (g.layout == torch.strided and g.device == view.device and g.dtype == view.dtype
            and g.shape == view.shape and g.is_contiguous() and not g.requires_grad)


def _dense(p: torch.Tensor) -> bool:
    """Whether p's strides place its elements densely, without overlap, in some order of
    its dimensions (torch's is_non_overlapping_and_dense), so that they fit a slot of
    p.numel() elements."""
    expect = 1
    for stride, size in sorted((st, sz) for st, sz in zip(p.stride(), p.shape) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return p.numel() > 0


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype


def _tensors(obj: Any) -> list:
    """All tensors in a (nested) forward output: containers pytree knows (lists, tuples,
    dicts, namedtuples, registered types) and dataclasses, as torch DDP's _find_tensors."""
    from torch.utils._pytree import tree_leaves

    out: list = []
    stack = [obj]
    seen: set = set()
    while stack:
        o = stack.pop()
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            if id(o) not in seen:
                seen.add(id(o))
                stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
        else:
            leaves = tree_leaves(o)
            if len(leaves) != 1 or leaves[0] is not o:
                stack.extend(leaves)
    return out
