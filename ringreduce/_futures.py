"""torch.futures.Future for ringreduce collectives.

The core's Work has wait() but no completion callback, so a Future is completed by a
daemon "completer" thread: it waits (GIL released) on each registered Work in registration
order and then sets the Future's result, which runs the Future's `.then()` callbacks on
that thread, as torch's own backends run them on their worker threads. Collectives
complete in submission order, so waiting in order costs nothing. A callback may block on
another collective's Future (powerSGD does): the completer role then passes to another
thread (see _Completer).

Used by Work.get_future() (and so the DDP comm hooks) and by the torch.distributed backend
(ringreduce.backend), whose Work objects hand out such Futures from get_future(). Below api:
nothing here starts a collective.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

import torch

log = logging.getLogger("ringreduce")

__all__ = ["Completion", "future_of"]


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
        self._set_lock = threading.RLock()  # the Future is set once; a callback may re-enter
        self._done = False
        self._exc: BaseException | None = None
        self._future: torch.futures.Future | None = None
        # Earlier collectives whose copies out must be done first (see backend._issued).
        self.before: list[Completion] = []

    def finish(self) -> BaseException | None:
        """Wait for the collective, run `after` once; return its exception (or None)."""
        with self._lock:
            self._finish_locked()
            return self._exc

    def _finish_locked(self) -> None:
        if self._done:
            return
        for c in self.before:  # issued earlier (a DAG: no lock cycle)
            c.finish()
        self.before = []
        try:
            if self.work is not None:
                self.work.wait()
            if self.after is not None:
                self.after()
        except BaseException as e:  # noqa: BLE001 - handed to every waiter
            self._exc = e
        self._done = True
        self.after = None
        self.work = None  # its buffers (a collective's temporaries) go now

    def settle(self) -> BaseException | None:
        """finish(), then complete the Future here if the completer thread has not yet: once
        a Work's wait() returned, its Future is done, as torch's are (found by a helper:
        ``f = w.get_future(); w.wait(); f.value()`` failed in ~1 of 5 calls)."""
        exc = self.finish()
        self._set_future(exc)
        return exc

    def is_completed(self) -> bool:
        """Never blocks. True only once the outputs are in place (`after` ran) or the error
        is known: a poller then sees what wait() would (before, True came as soon as the
        core finished, before the copy into the caller's tensors, and exception() stayed
        None for a failure nobody waited for)."""
        if self._done:
            return True
        if self.poll():
            self.complete_future()
        return self._done

    def poll(self) -> bool:
        """is_completed() that leaves the Future alone: completing it runs its callbacks,
        which may start collectives, so a caller holding a lock they need (backend._issued)
        polls under it and calls complete_future() after releasing it."""
        if self._done:
            return True
        if self.work is not None and not self.work.is_completed():
            return False
        if not all(c.is_completed() for c in self.before):  # finishing them would block
            return False
        if self._lock.acquire(blocking=False):  # else another thread is finishing it now
            try:
                self._finish_locked()
            finally:
                self._lock.release()
        return self._done

    def complete_future(self) -> None:
        """Complete the Future (if one was asked for) once finished; runs its callbacks."""
        self._set_future(self._exc)

    def exception(self) -> BaseException | None:
        self.is_completed()
        return self._exc

    def future(self) -> torch.futures.Future:
        """The Future of this collective (created on first call, completed by the
        completer thread, or at once when already done)."""
        with self._lock:
            fut, done = self._future, self._done
            if fut is None:
                fut = self._future = torch.futures.Future()
                if not done:
                    _COMPLETER.submit(self)
        if done:
            self._set_future(self._exc)
        return fut

    def _set_future(self, exc: BaseException | None) -> None:
        with self._set_lock:
            fut = self._future
            if fut is not None and not fut.done():
                _set(fut, exc, self.value)


def _set(fut: torch.futures.Future, exc: BaseException | None, value: Any) -> None:
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class _Gen:
    """One process's completer state (a forked child starts a fresh one)."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        self.role = threading.Lock()  # held by the one thread taking Works in order
        self.mu = threading.Lock()
        self.standby = 0  # threads waiting for the role (or about to)
        self.pid = os.getpid()


class _Completer:
    """Daemon threads completing Futures (started lazily): Works are waited for in
    registration order; two Futures may be set out of that order when their threads race.

    One thread at a time holds the role: it takes the next Completion, waits for its Work
    (GIL released), then hands the role on -- to a thread on standby, or a new one -- before
    it sets the Future's result, because that runs the Future's callbacks, and a callback
    may itself wait for a later collective's Future (torch's powerSGD hook calls
    ``all_reduce(...).get_future().wait()`` inside ``.then()``), which only the next role
    holder can complete. A thread back from its callbacks returns to standby unless another
    thread is there already (then it ends): there are as many as callbacks blocked at that
    moment, plus one -- before, every race between a thread setting its Future and the next
    one handing on the role left one more thread for good (found by a helper: 6 after 100k
    futures). ringreduce.destroy() ends them (shutdown()).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gen: _Gen | None = None
        self._threads: list[threading.Thread] = []  # this process's, for join_at_exit()

    def submit(self, c: Completion) -> None:
        with self._lock:
            g = self._gen
            if g is None or g.pid != os.getpid():  # first use, or a forked child
                g = self._gen = _Gen()
                with g.mu:
                    self._spawn(g)
        g.q.put(c)

    def _spawn(self, g: _Gen) -> None:  # under g.mu
        g.standby += 1
        pid = os.getpid()
        t = threading.Thread(target=self._loop, args=(g,), name="ringreduce-completer",
                             daemon=True)
        t._rr_pid = pid  # type: ignore[attr-defined]
        t.start()
        self._threads = [x for x in self._threads
                         if x.is_alive() and getattr(x, "_rr_pid", None) == pid] + [t]

    def shutdown(self) -> None:
        """End the threads once the Works queued so far are completed (ringreduce.destroy(),
        which fails those still queued); the next Future starts afresh. Never blocks."""
        with self._lock:
            g, self._gen = self._gen, None
        if g is not None and g.pid == os.getpid():
            g.q.put(None)  # each thread that takes it puts it back for the next one

    def join_at_exit(self, timeout: float = 5.0) -> None:
        """shutdown(), then wait (<= `timeout` s in all) until this process's threads ended.
        Called at interpreter exit: a daemon thread still holding a Future when Python
        finalizes frees it there, and the C++ Future's destructor then aborts the process
        (SIGABRT in 1 of 5 to 1 of 12 exits of a script using async torch.distributed
        collectives without destroy)."""
        self.shutdown()
        pid, me = os.getpid(), threading.current_thread()
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            if t is me or getattr(t, "_rr_pid", None) != pid:
                continue
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning("ringreduce: a completer thread is still running a future's "
                            "callback at exit (waited %.0f s)", timeout)
                return

    def _loop(self, g: _Gen) -> None:
        while True:
            with g.role:
                with g.mu:
                    g.standby -= 1
                c = g.q.get()
                if c is None:  # shutdown(): pass it on to the thread after this one
                    g.q.put(None)
                    return
                exc = c.finish()
                with g.mu:
                    if g.standby == 0:
                        self._spawn(g)
            try:
                c._set_future(exc)
            except BaseException:  # a callback's error must not kill the thread
                log.exception("ringreduce: error completing a future")
            del c, exc  # hold no Future while idle: see join_at_exit()
            with g.mu:
                if g.standby > 0:  # one is enough to take the role next
                    return
                g.standby += 1


_COMPLETER = _Completer()


def future_of(work: Any, value: Any, after: Callable[[], None] | None = None
              ) -> torch.futures.Future:
    """A Future that gets `value` once rr Work `work` completed (and `after` ran)."""
    return Completion(work, value, after).future()
