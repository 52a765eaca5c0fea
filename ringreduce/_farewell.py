"""destroy()'s farewell through the store: every rank says "bye", rank 0 (the store's host)
waits for all of them (at most a few seconds) and says whether its server stops, so no rank
is left talking to a store that went away (torch logs a C++ stack trace then). Store talk
runs on a helper thread with a deadline (_talk_until). ringreduce._rendezvous.release_store
and groups' destroy of a torch subgroup call it."""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any

from . import _procnet, _store_guard
from ._awake import Awake, Pauses

# How long destroy() waits for the other ranks to be done with the store before rank 0
# stops its server (and they for rank 0's word): a rank that is gone or far behind costs
# destroy() at most this; it gives up quietly (the store is not needed any more). After a
# failure peers may be dead, and destroy() must return promptly: the shorter wait.
_FAREWELL_S = 5.0
_FAREWELL_FAILED_S = 1.0
# Rank 0's wait for the acks of the ranks that said bye once its word is out: they poll for
# it every 2 ms. Below _talk_until's 0.5 s margin past the deadline.
_ACK_GRACE_S = 0.3


def farewell_borrowed(store: Any, rank: int, world: int, prefix: str, timeout: float,
                      failed: bool = False, lost: int = -1) -> None:
    """destroy() on a store that is not ours (torch's, when init_process_group("ringreduce")
    made the world; the caller's): whoever hosts it -- torch's rank 0 -- may drop it right
    after, yet the other ranks may still make point-to-point channels or groups through it
    (gloo needs no store after init; we do). So every rank says "bye" and the rank whose
    process serves the store (rank 0 where /proc cannot tell) waits until all have (at most
    `timeout`, capped as release_store's wait is; `lost` as there). Under torchrun the agent
    serves it (it outlives the ranks): rank 0 waited up to 5 s for nothing there, e.g. for a
    rank that had exited without a word (a helper; gloo returns at once). Never raises."""
    deadline = _farewell_deadline(timeout, failed)
    bye = prefix + "bye"

    def talk() -> None:
        try:
            if (rank != 0 and _procnet.server_closed(store)) or _store_guard.was_cut(store):
                return  # see _farewell
            store.add(bye, 1 + _proxy(store, prefix, rank, lost))
            # the rank whose process serves the store (rank 0 where /proc cannot tell)
            if _procnet.serves(store) if _procnet.can_tell() else rank == 0:
                _poll(lambda: store.add(bye, 0) >= world, deadline)
        except RuntimeError:  # the store is gone already: nothing to wait for
            pass

    _talk_until(deadline, talk)


def say_left(store: Any, prefix: str, rank: int, timeout: float) -> None:
    """A lasting sign that this rank left the job normally (destroy(), or its program
    ended), set before its listener closes: a sparse world's receive from any rank, which
    asks senders outside its overlay for heartbeats, tells such a sender's closed listener
    from a crash by it (said_left) -- its goodbye reaches only its overlay and the ranks
    asking it then (found by a helper's review). At most `timeout` (capped as the
    farewell's); never raises."""
    def talk() -> None:
        try:
            if not _store_guard.was_cut(store) and not _procnet.server_closed(store):
                store.set(_left_key(prefix, rank), b"")
        except RuntimeError:  # the store is gone: a receiver finds it gone too
            pass

    _talk_until(_farewell_deadline(timeout, True), talk)


def said_left(store: Any, prefix: str, rank: int) -> bool:
    """Whether `rank` of the world under `prefix` left the job normally (say_left)."""
    try:
        return store is not None and bool(store.check([_left_key(prefix, rank)]))
    except RuntimeError:  # the store is gone (its host, rank 0, left or died): unknown
        return False


def _left_key(prefix: str, rank: int) -> str:
    return f"{prefix}left/{rank}"


def _farewell_deadline(timeout: float, failed: bool) -> Awake:
    """The talk's deadline, for _talk_until (whose waiting thread looks for pauses)."""
    return Awake(min(timeout, _FAREWELL_FAILED_S if failed else _FAREWELL_S), Pauses())


def _talk_until(deadline: Awake, target: Any, *args: Any,
                name: str = "ringreduce-store-farewell") -> None:
    """Run a farewell's store talk on a helper thread and stop waiting for it at the
    deadline: store calls block while the server's host is frozen (SIGSTOP, a debugger) for
    the store's own timeout, not ours. An abandoned thread ends at the store's timeout and
    drops its reference.

    Ctrl-C meanwhile cuts the talk short (its polls stop, _HURRY) but still lets the thread
    end before the KeyboardInterrupt goes on: it holds the store, so rank 0's server stayed
    up, and a thread left inside a store call at exit took the process down (std::terminate
    as the interpreter unwound it)."""
    ended = threading.Event()  # not join(): one that Ctrl-C interrupted returns at once after

    def run() -> None:
        try:
            target(*args)
        finally:
            ended.set()
            _RUNNING.discard(ended)

    _RUNNING.add(ended)
    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except RuntimeError:  # no thread to spare (a container's pids limit): talk here, with
        run()  # no deadline but the store's own -- a destroy() must not fail (a review)
        return
    pauses = deadline._pauses  # this thread looks for pauses: the talk's clock is ours
    margin = Awake(deadline.secs + 0.5, pauses)
    try:
        while not ended.wait(_LOOK_S):
            pauses.look()
            if margin.expired():
                break
    except BaseException:
        _HURRY.set()
        try:
            ended.wait(1.0)  # a store call in flight answers within milliseconds
        finally:
            _HURRY.clear()
        raise


_HURRY = threading.Event()  # set: farewell polls give up at once (Ctrl-C during destroy)
_RUNNING: set[threading.Event] = set()  # the `ended` of talks whose thread still runs
_EXIT_WAIT_S = 1.0


@atexit.register
def _end_talks_at_exit() -> None:
    """At the program's exit, let store talks that destroy() stopped waiting for end first
    (their polls give up at once; a store call in flight answers within milliseconds): a
    thread that returns from a store call once the interpreter is finalizing is made to exit
    by Python while inside torch's C++ call, which ends the process in std::terminate
    (SIGABRT on rank 0, found by a helper under a connection flood: its farewell thread was
    still polling the others' "bye"). Bounded: a talk stuck on a frozen store host stays."""
    if not _RUNNING:
        return
    _HURRY.set()
    end = time.monotonic() + _EXIT_WAIT_S
    for ended in list(_RUNNING):
        ended.wait(max(0.0, end - time.monotonic()))


def _proxy(store: Any, prefix: str, rank: int, lost: int) -> int:
    """1 if this rank is the first to report `lost` (a rank found dead or frozen, which
    will say nothing) and so speaks for it in the farewell, else 0."""
    if lost < 0 or lost == rank:
        return 0
    return int(store.add(f"{prefix}lost/{lost}", 1) == 1)


def _farewell(box: list, rank: int, world: int, prefix: str, closing: bool, deadline: Awake,
              words: list, lost: int = -1) -> None:
    """release_store's talk through the store (helper thread); drops box's reference."""
    store = box.pop()
    bye, ack, acked = prefix + "bye", prefix + "bye-ack", prefix + "acked"
    try:
        if (rank != 0 and _procnet.server_closed(store)) or _store_guard.was_cut(store):
            return  # rank 0 stopped waiting and closed it (or we did, the watchdog): a
            # store call would log a trace
        proxy = _proxy(store, prefix, rank, lost)
        store.add(bye, 1 + proxy)
        if rank == 0:
            _poll(lambda: store.add(bye, 0) >= world, deadline)
            store.set(ack, "close" if closing else "keep")
            # Every rank that said bye waits for the word and acks it: wait for those acks
            # also when the wait above ran out (a rank late to destroy()), briefly -- within
            # _talk_until's margin. Closing at once cut off a rank reading the word (torch
            # logged a C++ stack trace there: found by a helper, 3/3 with a rank 7 s late).
            said = store.add(bye, 0)
            _poll(lambda: store.add(acked, 0) >= said - 1 - proxy,
                  deadline.at_least(_ACK_GRACE_S))
        elif _poll(lambda: store.check([ack]), deadline):
            words.append(bytes(store.get(ack)))
            store.add(acked, 1 + proxy)
            if words == [b"close"]:
                # Until rank 0 stops the server (at once, once all acked), a re-init's
                # client could reach it and be reset by its close, which makes torch log a
                # C++ stack trace ("recvValue failed") on every rank but 0. Watching our
                # connection's state sends nothing.
                _poll(lambda: _procnet.server_closed(store), deadline.at_most(1.0))
    except RuntimeError:  # the store is gone already (rank 0 left): nothing to wait for
        pass
    finally:
        store = None  # the last reference: TCPStore's destructor closes its sockets


def _poll(done: Any, deadline: Awake) -> bool:
    """Call done() every 2 ms until it is true (returns True) or the deadline (False). A
    deadline that passed while the thread looking for its pauses (_talk_until's waiter,
    every _LOOK_S) has not looked for two of those is asked again once it has (at most
    _SETTLE_S): right after a SIGCONT this thread may run first, when every deadline looks
    passed -- rank 0 then closed the store under a rank still on its way (CI,
    test_launcher's paused job). A deadline that passed otherwise ends the poll at once."""
    if not isinstance(deadline, Awake):  # a float (a monotonic time) was once passed here
        raise TypeError(f"_poll: deadline must be an Awake, got {type(deadline).__name__}")
    while not done():
        if _HURRY.is_set():
            return False
        if deadline.expired():
            end = time.monotonic() + _SETTLE_S
            while (deadline.unseen(2 * _LOOK_S) and time.monotonic() < end
                   and not _HURRY.is_set()):
                time.sleep(0.005)
            if deadline.expired():
                return bool(done())
            continue
        time.sleep(0.002)
    return True


_LOOK_S = 0.05  # how often _talk_until's waiter looks for pauses
_SETTLE_S = 0.5  # the waiter's look after a SIGCONT
