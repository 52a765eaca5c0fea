"""Deadlines for talking to the rendezvous store.

torch's TCPStore client waits without end for a server that accepts and never answers: a
store host frozen by SIGSTOP or a debugger, swapping, or cut off by a partition that drops
packets. check/add/set block in recv, and get blocks after its own timeout (measured, torch
2.13). ringreduce talks to the store after init too -- creating groups, the first message
between two ranks on a tag, an any-source receive -- so such a store hung them silently.

`deadline(store, seconds)` bounds a block of store calls: a watchdog thread shuts the
process's connections to the store (its port at its address) down once `seconds` pass with
the block still running, which makes the call in flight return (torch raises), and the
block raises `StoreSilent` instead. The seconds are those this process ran (_awake): a
process stopped meanwhile (SIGSTOP, a suspended job) found every deadline passed on
resuming and cut a store that answered at once. The connection stays shut: later use is
refused at once (`was_cut`, `refuse_if_cut`), which is right -- a frozen server cannot be told apart from a
dead one, and a store that answers again later finds the job already failed. Reading /proc
sends nothing.

Ctrl-C (SIGINT with Python's default handler, which raises KeyboardInterrupt) while the main
thread is blocked in such a call: Python runs the handler only once the call returns, so the
watchdog learns of the signal through the signal module's wake-up fd and, if the block is
still running SIGNAL_GRACE_S later (had the handler run, its KeyboardInterrupt would have
ended the block), shuts the connection as at the deadline; the KeyboardInterrupt then
surfaces at once, not at the deadline. Other signals and handlers (a flag for a graceful
stop) are left to the deadline: whether they end the block cannot be told from here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from . import _procnet
from ._awake import Awake, Pauses

# A block's deadline is its own timeout plus this: its waits stop themselves at the timeout
# (polling); only a call stuck in torch's client runs past it.
MARGIN_S = 10.0
# After Ctrl-C, how long the main thread's block may go on before the watchdog cuts it (a
# block in Python code, not stuck in a call, raises KeyboardInterrupt in that time).
SIGNAL_GRACE_S = 1.0


class StoreSilent(Exception):
    """A block of store calls overran its deadline and its connection was shut."""

    def __init__(self, port: int, seconds: float) -> None:
        super().__init__(f"the store on port {port} did not answer for {seconds:.0f} s")
        self.port, self.seconds = port, seconds


class NoThread(RuntimeError):
    """A thread ringreduce needs could not start: the process is at its thread limit."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: the process is at its thread limit (a container's "
                         "pids.max, ulimit -u) or has no address space left for a thread's "
                         "stack (ulimit -v); raise it, or make fewer groups and channels")


def start(t: threading.Thread, what: str) -> None:
    """t.start(), or NoThread naming `what` when no thread can start."""
    try:
        t.start()
    except RuntimeError as e:
        raise NoThread(f"could not start {what} ({e})") from e


class _Armed:
    __slots__ = ("addrs", "clock", "fired", "main", "port", "signalled", "start")

    def __init__(self, port: int, addrs: Any, clock: Awake, main: bool) -> None:
        self.port, self.addrs, self.fired = port, addrs, False
        self.start = time.monotonic()
        self.clock = clock  # the deadline, on the watchdog's clock (_watch)
        self.main = main  # armed by the main thread (signals interrupt it)
        self.signalled: float | None = None  # when a Ctrl-C came


class _Wake:
    """The signal module's wake-up fd, ours while the main thread is in a block (the one
    it replaced gets every byte too)."""

    def __init__(self) -> None:
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        self.w.setblocking(False)
        try:
            self.old = signal.set_wakeup_fd(self.w.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main interpreter: no signals
            self.r.close()
            self.w.close()
            raise
        self.depth = 1

    def signals(self) -> list[int]:
        try:
            got = self.r.recv(256)
        except OSError:
            return []
        if got and self.old >= 0:
            with contextlib.suppress(OSError):
                os.write(self.old, got)
        return list(got)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self.old)
        self.r.close()
        self.w.close()


_COND = threading.Condition()
_ARMED: set = set()
_CUT: dict = {}  # socket inode the watchdog shut -> after how many seconds
_THREAD: list = []  # the watchdog, once started (per process: cleared in a forked child)
_ADDRS: dict = {}  # store host -> its addresses (resolved once per process)
_WAKE: list = []  # the _Wake while the main thread is in a block (under _COND)
_PAUSES: list = []  # the watchdog's Pauses: it looks at the clock while a block is armed
# How often the watchdog looks at the clock while a block is armed (for pauses; signals)
_LOOK_S = 0.1


def _where(store: Any) -> tuple:
    """(port, addresses or None) of the TCPStore under `store`: the connections that are
    its. Addresses None: the host did not resolve -- any connection to the port."""
    port = _procnet._store_port(store)
    host = None if port is None else _procnet.store_host(store)
    if host is None:
        return port, None
    if host not in _ADDRS:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            _ADDRS[host] = {_procnet.plain_ip(ipaddress.ip_address(str(i[4][0]).split("%")[0]))
                            for i in infos} or None
        except (OSError, ValueError):
            _ADDRS[host] = None
    return port, _ADDRS[host]


def was_cut(store: Any) -> float | None:
    """After how many seconds of silence the watchdog shut this process's connection to
    the store (one still open: a new store on the same port is not), None if it did not."""
    cut = cut_before(store)
    return None if cut is None else cut.seconds


def cut_before(store: Any) -> StoreSilent | None:
    """What the watchdog found when it cut this store's connection earlier (see was_cut),
    as the StoreSilent it raised then; None if it did not."""
    if not _CUT or store is None:
        return None
    port, addrs = _where(store)
    if port is None:
        return None
    cut = [_CUT[i] for _, i in _procnet.client_sockets(port, addrs) if i in _CUT]
    return StoreSilent(port, max(cut)) if cut else None


@contextlib.contextmanager
def deadline(store: Any, seconds: float | None) -> Iterator[None]:
    """Raise StoreSilent if the block is still inside a store call `seconds` from now
    (no deadline for None, or a store that is not a TCPStore: nothing to cut)."""
    port, addrs = _where(store) if seconds is not None else (None, None)
    if port is None:
        yield
        return
    main = threading.current_thread() is threading.main_thread()
    with _COND:
        if not _THREAD:  # the clock starts with the watchdog (it looks while it runs)
            _PAUSES[:] = [Pauses()]
        armed = _Armed(port, addrs, Awake(seconds, _PAUSES[0]), main)
        if armed.main:
            _wake_on()
        _ARMED.add(armed)
        if not _THREAD:
            t = threading.Thread(target=_watch, name="ringreduce-store-watchdog", daemon=True)
            try:  # it waits for _COND, held here, before it looks at _THREAD
                start(t, "ringreduce's store watchdog thread")
            except NoThread:  # left in _THREAD, it made later blocks unwatched
                _ARMED.discard(armed)
                if armed.main:
                    _wake_off()
                raise
            _THREAD.append(t)
        _COND.notify()
    try:
        yield
    except Exception as e:  # not Ctrl-C, SystemExit, GeneratorExit: those pass as they are
        if armed.fired:
            raise StoreSilent(port, seconds) from e
        raise
    finally:
        with _COND:
            _ARMED.discard(armed)
            if armed.main:
                _wake_off()
            idle = _THREAD[0] if _THREAD and not _ARMED else None
            _COND.notify()
        if idle is threading.current_thread():
            idle = None
        while idle is not None and idle.is_alive():  # it ends now: nothing of a job stays
            idle.join(0.01)  # after destroy() -- unless another block armed it meanwhile
            idle = None if _ARMED else idle


def _wake_on() -> None:
    """Under _COND, in the main thread: take the signal wake-up fd (nested blocks share it)."""
    if _WAKE:
        _WAKE[0].depth += 1
        return
    with contextlib.suppress(ValueError, OSError):  # not the main interpreter: no signals
        _WAKE.append(_Wake())


def _wake_off() -> None:
    if _WAKE:
        _WAKE[0].depth -= 1
        if _WAKE[0].depth == 0:
            _WAKE.pop().close()


def _watch() -> None:
    """The watchdog: runs while a block is armed, then ends (a new block starts another).
    It looks at the clock every _LOOK_S, so a pause of this process is not counted against
    the blocks' deadlines."""
    with _COND:
        while _ARMED:
            _PAUSES[0].look()
            now = time.monotonic()
            if (_WAKE and signal.SIGINT in _WAKE[0].signals()
                    and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
                for a in _ARMED:
                    if a.main and a.signalled is None:
                        a.signalled = now
            for a in [a for a in _ARMED if not a.fired and a.clock.expired()]:
                a.fired = True
                _cut(a, a.clock.secs)
            signalled = [a for a in _ARMED if a.signalled is not None and not a.fired]
            for a in [a for a in signalled if a.signalled + SIGNAL_GRACE_S <= now]:
                a.fired = True  # once; its handler raises when the call returns
                _cut(a, now - a.start)
            dues = [a.clock.left() for a in _ARMED if not a.fired]
            dues += [a.signalled + SIGNAL_GRACE_S - now for a in signalled if not a.fired]
            _COND.wait(min([_LOOK_S, *dues]))
        _THREAD.clear()


def _cut(a: _Armed, silent_s: float) -> None:
    """Shut down (not close: torch owns the fds) this process's connections to the store
    (port and address); a blocked recv on one then returns. silent_s: how long it had not
    answered (what later refusals quote)."""
    for fd, inode in _procnet.client_sockets(a.port, a.addrs):
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with contextlib.suppress(OSError), s:
            s.shutdown(socket.SHUT_RDWR)
        _CUT[inode] = silent_s


def _after_fork() -> None:
    global _COND
    _COND = threading.Condition()
    _ARMED.clear()
    _THREAD.clear()
    _WAKE.clear()  # the parent's; the child's signal module keeps the fd until it is reset


os.register_at_fork(after_in_child=_after_fork)
