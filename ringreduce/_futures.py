"""torch.futures.Future for ringreduce collectives.

The core's Work has wait() but no completion callback, so a Future is completed by a
daemon "completer" thread: it waits (GIL released) on the core's completion bell, which
every Work rings when it completes, finishes whichever registered Work is done, and sets
its Future's result, which runs the Future's `.then()` callbacks on that thread, as
torch's own backends run them on their worker threads. Futures complete in the order
their collectives do: a collective on one group or channel does not hold back another's
(before, they were waited for in registration order, and a Future whose collective had
finished waited behind an earlier one still waiting for its peers -- a deadlock when the
program waited for the later Future first; found by a helper). A callback may block on
another collective's Future (powerSGD does): the completer role then passes to another
thread (see _Completer).

Used by Work.get_future() (and so the DDP comm hooks) and by the torch.distributed backend
(ringreduce.backend), whose Work objects hand out such Futures from get_future(). Below api:
nothing here starts a collective.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import threading
import time
from typing import Any, Callable

import torch

from . import _C

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
        self._owner: int | None = None  # the thread finishing it (see finish())
        self._exc: BaseException | None = None
        self._future: torch.futures.Future | None = None
        # Earlier collectives whose copies out must be done first (see backend._issued).
        self.before: list[Completion] = []

    def rings_bell(self) -> bool:
        """Whether its completion (and its `before`'s) rings the core's completion bell;
        the completer thread polls only those (a GPU Work's does not: _Completer._probe)."""
        return rings_bell(self.work) and all(c.rings_bell() for c in self.before)

    def finish(self) -> BaseException | None:
        """Wait for the collective, run `after` once; return its exception (or None)."""
        if self._owner == threading.get_ident():
            # Re-entered on the thread finishing it: a signal handler run inside its wait
            # (destroy_process_group() in a SIGTERM handler) -- the outer call finishes it.
            # Waiting for the lock here hung for good (found by a helper; gloo exits).
            return self._exc
        with self._lock:
            self._finish_locked()
            return self._exc

    def _finish_locked(self) -> None:
        if self._done:
            return
        self._owner = threading.get_ident()
        try:
            self._finish_owned()
        finally:
            self._owner = None

    def _finish_owned(self) -> None:
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
        if self._done:  # (not when re-entered from a signal handler inside its own wait)
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
        if self.work is not None and not _completed(self.work):
            return False
        # (poll: completing their Futures here would run callbacks on the completer's role)
        if not all(c.poll() for c in self.before):  # finishing them would block
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


def rings_bell(cwork: Any) -> bool:
    """Whether `cwork` completing rings the core's completion bell (_C.completion_bell, which
    ringreduce._futures waits on): a core Work does, a wrapper says whether what it wraps
    does (its `rings_bell`), and there is nothing to wait for in None."""
    return cwork is None or isinstance(cwork, _C.Work) or bool(getattr(cwork, "rings_bell", False))


def _completed(work: Any) -> bool:
    """work.is_completed(); one that raises (an NCCL Work whose communicator was aborted)
    is: its wait() raises the error, which finish() keeps for the Future (the completer
    thread died of it, and every later Future with it: a review)."""
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - raised again by wait(), in finish()
        return True


def _set(fut: torch.futures.Future, exc: BaseException | None, value: Any) -> None:
    if exc is not None and not isinstance(exc, Exception):
        # A KeyboardInterrupt (Ctrl-C in the wait that ran it): torch's set_exception takes
        # an Exception only -- it raised AssertionError and the Future stayed pending.
        wrapped = RuntimeError(f"interrupted: {type(exc).__name__}: {exc}".rstrip(": "))
        wrapped.__cause__, exc = exc, wrapped
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class _Gen:
    """One process's completer state (a forked child starts a fresh one)."""

    def __init__(self) -> None:
        # registered, Future not yet set (in registration order)
        self.pending: collections.deque[Completion] = collections.deque()
        self.role = threading.Lock()  # held by the one thread looking for the next done
        self.mu = threading.Lock()
        self.wake = threading.Condition(self.mu)  # pending no longer empty, or stop
        self.standby = 0  # threads waiting for the role (or about to)
        self.stop = False
        self.probes: queue.SimpleQueue[Completion | None] | None = None
        self.pid = os.getpid()

    def next_done(self) -> Completion | None:
        """The role holder's wait: a pending Completion whose collective finished (its
        outputs in place), taken off the list; None once stopped with nothing pending."""
        while True:
            seen = _C.completion_bell()
            with self.mu:
                while not self.pending and not self.stop:
                    self.wake.wait()
                if not self.pending:
                    return None
            # Oldest first, in slices: most finish in registration order, and the whole list
            # was copied and scanned once per completion (a 16k backlog's last Future came
            # 13 s late; a helper). Polled unlocked: poll() may copy out.
            at = 0
            while True:
                with self.mu:
                    chunk = list(itertools.islice(self.pending, at, at + 64))
                if not chunk:
                    break
                for c in chunk:
                    if c.poll():
                        with self.mu:
                            self.pending.remove(c)  # (mostly the oldest: cheap on a deque)
                        return c
                at += len(chunk)
            # A Completion another thread is finishing (a caller's wait()) polls False and
            # settles its Future itself; the slice bounds how long it stays listed.
            _C.await_completion_bell(seen, 0.5)


def _probe(q: queue.SimpleQueue) -> None:
    while (c := q.get()) is not None:
        c.finish()
        _C.ring_completion_bell()
        del c


class _Completer:
    """Daemon threads completing Futures (started lazily), each as soon as its collective
    is done (_Gen.next_done); two Futures may be set out of that order when their threads
    race.

    One thread at a time holds the role: it waits for the next finished Completion (GIL
    released), then hands the role on -- to a thread on standby, or a new one -- before it
    sets the Future's result, because that runs the Future's callbacks, and a callback may
    itself wait for a later collective's Future (torch's powerSGD hook calls
    ``all_reduce(...).get_future().wait()`` inside ``.then()``), which only the next role
    holder can complete. A thread back from its callbacks returns to standby unless _SPARES
    threads are there already (then it ends): there are as many as callbacks blocked at that
    moment, plus at most _SPARES + 1 -- before, every race between a thread setting its
    Future and the next one handing on the role left one more thread for good (found by a
    helper: 6 after 100k futures). ringreduce.destroy() ends them (shutdown()).
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
        with g.mu:
            g.pending.append(c)
            g.wake.notify()
            if not c.rings_bell():
                self._probe(g, c)
        _C.ring_completion_bell()  # a role holder waiting on the bell looks again

    def _probe(self, g: _Gen, c: Completion) -> None:  # under g.mu
        """A Work the bell does not cover (a GPU collective's): one thread waits for such
        Works in registration order and rings the bell for each (a later one of another
        NCCL communicator may wait behind an earlier one)."""
        if g.probes is None:
            g.probes = queue.SimpleQueue()
            self._start(threading.Thread(target=_probe, args=(g.probes,), daemon=True,
                                         name="ringreduce-completion-probe"))
        g.probes.put(c)

    def _spawn(self, g: _Gen) -> None:  # under g.mu
        g.standby += 1
        self._start(threading.Thread(target=self._loop, args=(g,), name="ringreduce-completer",
                                     daemon=True))

    def _start(self, t: threading.Thread) -> None:
        pid = os.getpid()
        t._rr_pid = pid  # type: ignore[attr-defined]
        t.start()
        self._threads = [x for x in self._threads
                         if x.is_alive() and getattr(x, "_rr_pid", None) == pid] + [t]

    def shutdown(self) -> None:
        """End the threads once the Works registered so far are completed (ringreduce.destroy(),
        which fails those still running); the next Future starts afresh. Never blocks."""
        with self._lock:
            g, self._gen = self._gen, None
        if g is not None and g.pid == os.getpid():
            with g.mu:
                g.stop = True
                g.wake.notify_all()
                if g.probes is not None:
                    g.probes.put(None)
            _C.ring_completion_bell()

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
                while True:
                    try:
                        c = g.next_done()
                        break
                    except Exception:  # a bug: say so, and look again (nothing hangs on it)
                        log.exception("ringreduce: error looking for a finished collective")
                        time.sleep(0.1)
                if c is None:  # shutdown() and nothing left
                    return
                exc = c.finish()  # done: returns at once
                with g.mu:
                    if g.standby == 0:
                        self._spawn(g)
            try:
                c._set_future(exc)
            except BaseException:  # a callback's error must not kill the thread
                log.exception("ringreduce: error completing a future")
            del c, exc  # hold no Future while idle: see join_at_exit()
            with g.mu:
                if g.standby >= _SPARES:  # enough to take the role next
                    return
                g.standby += 1


# Threads kept waiting for the role: with one, the holder that found the next Completion
# while the last one's thread was still setting its Future started a thread, and that one
# ended (4,252 thread starts for 5,000 get_future().wait(); a helper). Two cover that race.
_SPARES = 2
_COMPLETER = _Completer()


def future_of(work: Any, value: Any, after: Callable[[], None] | None = None
              ) -> torch.futures.Future:
    """A Future that gets `value` once rr Work `work` completed (and `after` ran)."""
    return Completion(work, value, after).future()


class WaitAll:
    """Adapts the Completions of collectives that one Work stands for to the rr Work
    interface (wait / is_completed / rings_bell): done when all are. wait() honours its
    timeout across all (it waited for the last with none: a work.wait(timeout=) ran to the
    group's timeout) and raises the first one's error (a later one's: "unusable after")."""

    def __init__(self, completions: list[Completion]):
        self._cs = completions
        self.rings_bell = all(c.rings_bell() for c in completions)

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for c in self._cs:
            if (end is not None and c.work is not None and not c.is_completed()
                    and not c.work.wait(max(0.0, end - time.monotonic()))):
                return False
            exc = c.finish()
            if exc is not None:
                raise exc
        return True

    def is_completed(self) -> bool:
        return all(c.is_completed() for c in self._cs)
