"""DistributedDataParallel.join(): training with uneven inputs (ranks with different numbers
of batches), with the semantics of torch's DDP.join / torch.distributed.algorithms.Join.

Schedule (every rank issues the same collectives in the same order):

    active rank, each forward inside the context      joined rank, each shadow step
    -----------------------------------------------   ---------------------------------
    [finish the previous iteration, if left open]      (already shadowed)
    state all-reduce: flags[rank] = code               state all-reduce: flags[rank] = 0
    (throw_on_early_termination and a 0 flag: raise)   (all flags 0: everyone is done; stop)
    buffer broadcast from the highest active rank      the same broadcast (receives)
    backward: bucket all-reduces, [used map],          zero buckets in bucket-index order,
      [bucket rebuild broadcast, first iteration]        [used map of zeros], [rebuild]

    after the last step: all-reduce(max) of the ranks that ran the most iterations, then
    parameters (and buffers, with broadcast_buffers) are broadcast from that rank.

code = 1 (active) | 2 (this forward's backward is synchronised: grad enabled, not in
no_sync()) | 4 (this forward broadcasts buffers). All flags are exchanged (one all-reduce of
world_size int32s, waited for at once), so every rank knows which ranks have joined, how
many are active (the divisor for divide_by_initial_world_size=False), which rank's buffers
to broadcast, and whether the active ranks agree; ranks that disagree (no_sync() or
torch.no_grad() on some ranks only) get an error on every rank instead of a hang.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

import torch

from .. import api
from ._sync import broadcast_tensors, world_ranks

if TYPE_CHECKING:
    from .wrapper import DistributedDataParallel

ACTIVE, GRAD_SYNC, BUFFERS = 1, 2, 4


class Join:
    """The context manager returned by DistributedDataParallel.join()."""

    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool = True,
                 enable: bool = True, throw_on_early_termination: bool = False) -> None:
        self.ddp = ddp
        self.divide_by_initial_world_size = bool(divide_by_initial_world_size)
        self.enable = bool(enable) and ddp._world > 1
        self.throw = bool(throw_on_early_termination)
        self.iterations = 0  # forwards this rank ran inside the context
        self.shadowed = 0  # iterations this rank shadowed after running out of inputs

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Join:  # noqa: PYI034 - final in practice; typing.Self is 3.11+
        if not self.enable:
            return self
        if self.ddp._join is not None:
            raise RuntimeError("DistributedDataParallel.join(): already inside a join() "
                               "context of this model; nest nothing, use one context")
        if self.ddp._join_in_error:
            raise RuntimeError(
                "DistributedDataParallel.join(): a previous join() context ended with an "
                "error on some rank, so ranks may disagree on the collective schedule. "
                "Re-create the process group (ringreduce.destroy(); ringreduce.init()) and "
                "the DDP model to recover.")
        self.ddp._join = self
        r = self.ddp.reducer
        if r is not None:
            r.join_mode = True
            r.join_divisor = None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if not self.enable:
            return False
        r = self.ddp.reducer
        try:
            if exc_type is not None:
                # Propagate at once (torch does the same). When every rank raised at the
                # same point (throw_on_early_termination) the schedule is still matched.
                if not isinstance(exc, UnevenInputsError):
                    self.ddp._join_in_error = True
                return False
            if r is not None:
                r.close_open_iteration()  # finish a forward whose backward never ran
            self._shadow_until_all_joined()
        except UnevenInputsError:
            raise
        except BaseException:
            self.ddp._join_in_error = True
            raise
        finally:
            self.ddp._join = None
            if r is not None:
                r.join_mode = False
                r.join_divisor = None
        return False

    # ------------------------------------------------------------------ active ranks
    def notify(self, grad_sync: bool, sync_buffers: bool) -> int:
        """Called by forward() on a rank still inside the body; returns the rank whose
        buffers are broadcast this forward."""
        code = ACTIVE | (GRAD_SYNC if grad_sync else 0) | (BUFFERS if sync_buffers else 0)
        codes = self._exchange(code)
        self.iterations += 1
        active = self._check(codes)
        if self.ddp.reducer is not None:
            self.ddp.reducer.join_divisor = (None if self.divide_by_initial_world_size
                                             else len(active))
        return max(active)

    # ------------------------------------------------------------------ joined ranks
    def _shadow_until_all_joined(self) -> None:
        ddp, rank = self.ddp, self.ddp._rank
        last_joiner = True
        while True:
            codes = self._exchange(0)
            if not any(codes):
                break
            last_joiner = False
            active = self._check(codes)
            code = codes[active[0]]
            if code & BUFFERS:
                ddp._buffer_sync(ddp._buffer_list, max(active))
            ddp.require_forward_param_sync = bool(code & GRAD_SYNC)
            r = ddp.reducer
            if code & GRAD_SYNC and r is not None:
                r.join_divisor = None if self.divide_by_initial_world_size else len(active)
                r.shadow_iteration()
            self.shadowed += 1
        # The model of a rank that ran the most iterations (the highest such rank) wins.
        src = torch.tensor([rank if last_joiner else -1], dtype=torch.int64)
        api.allreduce(src, op="max", group=ddp.process_group)
        tensors = [p for _, p in ddp._sync_params]
        if ddp.broadcast_buffers:
            tensors += ddp._buffer_list
        with torch.no_grad():
            broadcast_tensors(tensors, int(src), rank, group=ddp.process_group)

    # ------------------------------------------------------------------ shared
    def _exchange(self, code: int) -> list:
        flags = torch.zeros(self.ddp._world, dtype=torch.int32)
        flags[self.ddp._rank] = code
        api.allreduce(flags, group=self.ddp.process_group)
        return flags.tolist()

    def _check(self, codes: list) -> list:
        """Ranks still training; raise (on every rank alike) on early termination with
        throw_on_early_termination, or when the active ranks disagree."""
        active = [r for r, c in enumerate(codes) if c]
        joined = [r for r, c in enumerate(codes) if not c]
        at = world_ranks(self.ddp.process_group, len(codes))  # messages name world ranks
        if self.throw and joined:
            raise UnevenInputsError(
                f"DistributedDataParallel.join(throw_on_early_termination=True): rank(s) "
                f"{[at[r] for r in joined]} exhausted their inputs (detected on rank "
                f"{at[self.ddp._rank]}); every "
                f"rank raises this error at the same iteration, so the process group stays "
                f"usable. Catch it on all ranks, or use throw_on_early_termination=False to "
                f"let the other ranks finish their inputs.")
        if len({codes[r] for r in active}) > 1:
            def say(c: int) -> str:
                return ("synchronised backward" if c & GRAD_SYNC else
                        "no gradient sync (torch.no_grad() or no_sync())")
            detail = "; ".join(f"rank {at[r]}: {say(codes[r])}"
                               + (", buffer broadcast" if codes[r] & BUFFERS else "")
                               for r in active)
            raise RuntimeError(
                f"DistributedDataParallel.join(): the ranks still training disagree about "
                f"this forward ({detail}). Every rank must run the same sequence of "
                f"forwards with the same grad mode and no_sync() usage.")
        return active


class UnevenInputsError(RuntimeError):
    """join(throw_on_early_termination=True): some rank ran out of inputs. Raised on every
    rank at the same point of the schedule (a RuntimeError, as torch raises)."""
