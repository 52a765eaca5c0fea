"""Work: the handle of an asynchronous collective, and the registry that keeps the buffers
of running collectives alive (the C++ core holds raw pointers only).

Used by api (host collectives), the CUDA route and point-to-point; depends on nothing else
in the package but the environment checks.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from . import _env

# Buffers of queued/running async collectives, oldest first. The C++ core only holds raw
# pointers, so these references keep the memory alive even if the caller drops its Work
# handle. A Work waited for (or seen completed) drops its entry at once; entries of dropped
# handles go, once completed, at an async call that finds the registry doubled since it was
# last pruned. Groups and point-to-point channels run on executors of their own, so
# completion is not in posting order: every entry is checked.
# Any thread may issue collectives: every access holds _INFLIGHT_LOCK.
_INFLIGHT: collections.deque = collections.deque()
_INFLIGHT_LOCK = threading.Lock()
_PRUNE_MIN = 8
_PRUNE_AT = _PRUNE_MIN  # prune when the registry holds this many (under the lock)


def _track(cwork: Any, keep: tuple) -> None:
    global _PRUNE_AT
    with _INFLIGHT_LOCK:
        # Pruned once the registry doubled since the last pruning: every entry is polled,
        # O(n) per async call else (many outstanding isend/irecv of a pipeline).
        entries = list(_INFLIGHT) if len(_INFLIGHT) >= _PRUNE_AT else []
    # Outside the lock: a point-to-point Work's is_completed() finishes it, which untracks.
    done = {id(e) for e in entries if _finished(e[0])}  # (entries keeps the ids unique)
    with _INFLIGHT_LOCK:
        if done:
            live = [e for e in _INFLIGHT if id(e) not in done]
            _INFLIGHT.clear()
            _INFLIGHT.extend(live)
        if entries:
            _PRUNE_AT = max(_PRUNE_MIN, 2 * len(_INFLIGHT))
        _INFLIGHT.append((cwork, keep))


def _finished(cwork: Any) -> bool:
    """Whether a tracked Work is done; one whose is_completed() raises (an NCCL Work whose
    communicator failed or was destroyed) is: it must not fail the unrelated call that
    happened to prune the registry (a review of the GPU path)."""
    from ._C import RingReduceError

    try:
        return bool(cwork.is_completed())
    except RingReduceError:  # its own wait() reports the failure
        return True


def _untrack(cwork: Any) -> None:
    with _INFLIGHT_LOCK:
        for i, e in enumerate(_INFLIGHT):
            if e[0] is cwork:
                del _INFLIGHT[i]
                return


class Work:
    """Handle of an asynchronous collective (like torch.distributed's Work).

    Keeps the buffers alive until the collective finished; `wait()` blocks (GIL released)
    and raises the collective's error on every rank where it failed.
    """

    def __init__(self, cwork: Any, keep: tuple = (), after: Any = None, result: Any = None,
                 outputs: tuple | None = None):
        self._cwork = cwork
        self._keep = keep
        self._after = after
        self._result = result
        self._finished = cwork is None
        self._lock = threading.Lock()
        # get_future()'s value: the caller's buffers (`keep` unless it holds staging ones too)
        self._outputs = (result,) if result is not None else keep if outputs is None else outputs
        self._completion: Any = None  # get_future()'s (one Future per Work, as torch's)
        # irecv: the sender's world rank, or a function returning it once received.
        self.source: Any = None
        if cwork is not None:
            _track(cwork, keep)

    @property
    def rings_bell(self) -> bool:  # (ringreduce._futures asks: torch is loaded then)
        from ._futures import rings_bell

        return rings_bell(self._cwork)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (or `timeout` seconds); raise if the collective failed.

        Returns False only when `timeout` passed first; the collective's own deadline
        (init's timeout) still bounds the wait when timeout is None.
        """
        if timeout is not None:
            timeout = _env.check_seconds("Work.wait(timeout)", timeout, allow_zero=True)
        if not self._finished:
            if not self._cwork.wait(timeout):
                return False
            self._run_after(True)
        if self._completion is not None:  # get_future()'s: done once wait() returns
            self._completion.settle()
        return True

    def _run_after(self, block: bool) -> None:
        # get_future()'s thread may wait too: `after` runs once
        if not self._lock.acquire(blocking=block):
            return  # another thread is running it
        try:
            if not self._finished:
                if self._after is not None:
                    self._after()
                    self._after = None
                self._finished = True
                self._keep = ()
                _untrack(self._cwork)
        finally:
            self._lock.release()

    def get_future(self) -> Any:
        """torch's Work.get_future(): a torch.futures.Future completed (on a helper thread;
        at once when the Work is done already) once the collective is, whose value is the
        output tensors in a list, as torch's (numpy arrays: the arrays) --
        so custom DDP comm hooks can return ``rr.allreduce(t, async_op=True).get_future()``.
        A failed collective sets the Future's error."""
        import numpy as np

        try:
            import torch
        except ImportError as e:
            raise ImportError("Work.get_future() returns a torch.futures.Future: it needs "
                              "torch (pip install torch); wait() and is_completed() do "
                              "not") from e

        from ._futures import Completion

        known = False
        with self._lock:
            if self._completion is None:
                self._completion = Completion(
                    self._cwork, [t for t in self._outputs if isinstance(t, (torch.Tensor, np.ndarray))],
                    lambda: self._run_after(True))
                known = self._finished or self._cwork.is_completed()
            c = self._completion
        if known:  # (after wait(), say): its Future is done at once, as torch's, and no
            c.finish()  # completer thread starts for it -- not even after destroy() (a helper)
        return c.future()

    def is_completed(self) -> bool:
        """Never blocks; True once the outputs are in place (a copy into the caller's
        buffer done) or the collective failed -- what wait() would then return or raise."""
        done = self._poll()
        if done and self._completion is not None:
            self._completion.is_completed()  # get_future()'s is done then too
        return done

    def _poll(self) -> bool:
        if self._finished:
            return True
        if not self._cwork.is_completed():
            return False
        try:
            self._cwork.wait(0)
        except Exception:  # noqa: BLE001 - failed: completed (exception() returns it)
            return True
        self._run_after(False)
        return self._finished

    def exception(self) -> BaseException | None:
        """torch's Work.exception(): the error the collective failed with; None while it
        runs or if it succeeded. Never blocks."""
        if not self.is_completed():
            return None
        try:
            self.wait(0)
        except Exception as e:  # noqa: BLE001 - returned, as torch does
            return e
        return None

    def is_success(self) -> bool:
        """torch's Work.is_success(): completed without an error (never blocks)."""
        return self.is_completed() and self.exception() is None

    def source_rank(self) -> int:
        """For an irecv: the world rank the message came from (waits for it first)."""
        if self.source is None:
            raise RuntimeError("source_rank() is defined for the Work of an irecv only")
        self.wait()
        return int(self.source() if callable(self.source) else self.source)

    def result(self) -> Any:
        """The output (tensor/array) once waited for."""
        self.wait()
        return self._result


def _finish(cwork: Any, keep: tuple, after: Any = None, result: Any = None,
            async_op: bool = False) -> Work | None:
    if async_op:
        return Work(cwork, keep, after, result)
    # Synchronous: the collective already ran (cwork is None); no handle to build (a Work
    # object costs ~1 us on a small VM, as much as an 8-byte all-reduce over shared memory).
    if after is not None:
        after()
    return None


def clear() -> None:
    """Forget every tracked buffer (destroy(): the executors have stopped)."""
    with _INFLIGHT_LOCK:
        _INFLIGHT.clear()
