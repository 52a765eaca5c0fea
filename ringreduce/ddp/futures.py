"""torch.futures.Future for ringreduce collectives.

The core's Work has wait() but no completion callback, so a Future is completed by one
daemon "completer" thread per process: it waits (GIL released) on each registered Work in
registration order and then sets the Future's result, which runs the Future's `.then()`
callbacks on that thread, as torch's own backends run them on their worker threads.
Collectives complete in submission order, so waiting in order costs nothing.

Used by the built-in DDP comm hooks and by the torch.distributed backend
(ringreduce.backend), whose Work objects hand out such Futures from get_future().
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

import torch

log = logging.getLogger("ringreduce")

__all__ = ["Completion", "allreduce_future", "future_of"]


class Completion:
    """Completes a rr Work exactly once, from whichever thread gets there first.

    `after` (optional) runs once after the collective succeeded (e.g. copy a temporary
    buffer into the caller's tensors); `value` is the Future's result. Thread-safe: both
    the completer thread and a caller's wait() may call finish().
    """

    def __init__(self, work: Any, value: Any, after: Callable[[], None] | None = None):
        self.work = work
        self.value = value
        self.after = after
        self._lock = threading.Lock()
        self._done = False
        self._exc: BaseException | None = None
        self._future: torch.futures.Future | None = None

    def finish(self) -> BaseException | None:
        """Wait for the collective, run `after` once; return its exception (or None)."""
        with self._lock:
            if not self._done:
                try:
                    if self.work is not None:
                        self.work.wait()
                    if self.after is not None:
                        self.after()
                except BaseException as e:  # noqa: BLE001 - handed to every waiter
                    self._exc = e
                self._done = True
                self.after = None
            return self._exc

    def is_completed(self) -> bool:
        if self._done:
            return True
        return self.work is None or self.work.is_completed()

    def exception(self) -> BaseException | None:
        return self._exc

    def future(self) -> torch.futures.Future:
        """The Future of this collective (created on first call, completed by the
        completer thread, or at once when already done)."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                fut = self._future
                if self._done:
                    _set(fut, self._exc, self.value)
                else:
                    _COMPLETER.submit(self)
            return self._future

    def _complete_future(self) -> None:
        exc = self.finish()
        fut = self._future
        if fut is not None and not fut.done():
            _set(fut, exc, self.value)


def _set(fut: torch.futures.Future, exc: BaseException | None, value: Any) -> None:
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class _Completer:
    """One daemon thread completing Futures in registration order (started lazily)."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(self, c: Completion) -> None:
        import os

        with self._lock:
            # A forked child inherits the object but not the thread: start a new one.
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._q = queue.SimpleQueue()
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, args=(self._q,),
                                                name="ringreduce-completer", daemon=True)
                self._thread.start()
            self._q.put(c)

    @staticmethod
    def _loop(q: queue.SimpleQueue[Completion]) -> None:
        while True:
            c = q.get()
            try:
                c._complete_future()
            except BaseException:  # a callback's error must not kill the thread
                log.exception("ringreduce: error completing a future")


_COMPLETER = _Completer()


def future_of(work: Any, value: Any, after: Callable[[], None] | None = None
              ) -> torch.futures.Future:
    """A Future that gets `value` once rr Work `work` completed (and `after` ran)."""
    return Completion(work, value, after).future()


def allreduce_future(tensor: torch.Tensor, op: str = "sum",
                     group: Any = None) -> torch.futures.Future:
    """Start an async ringreduce all-reduce of `tensor` (in place, over `group`: default the
    world) and return a Future whose value is ``[tensor]`` -- the building block for custom
    DDP comm hooks, like ``dist.all_reduce(t, async_op=True).get_future()`` with torch's
    process groups."""
    from .. import api

    work = api.allreduce(tensor, op=op, async_op=True, group=group)
    return future_of(work, [tensor])
