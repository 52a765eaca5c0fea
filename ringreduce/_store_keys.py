"""The store keys a group's creation writes, deleted again by its destroy().

Every group and point-to-point channel rendezvous under a prefix of its own in the job's
store (its members' addresses, hosts, heartbeat ports, shared-memory names, the agreed
member list): about 8 keys per member. Before, none was ever deleted, so a store that
serves many creations -- torch's, which outlives ringreduce's worlds; torchrun's agent
store; a job that makes and destroys groups as it goes -- grew without bound.

A creation runs inside `journal(prefix)`; the rendezvous code records each key this rank
writes there (`wrote`). Once the group is made, the member counts itself in
(`made`: prefix + "made"). Its destroy() deletes the keys this rank wrote if every member
counted itself in -- no member is still reading them; else it lists them for the last
member to leave -- and the last member to leave deletes those lists' keys, the counters and
the notes ranks outside the group left there (new_group on a non-member says it is not in
the list, groups._left_out; one written after that stays). A group whose creation never
completed everywhere keeps its keys (a member may still be waiting on them), as does one
that failed or that a member never destroyed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import _farewell, _store_guard
from ._awake import Awake, Pauses

_LOCK = threading.Lock()
_OPEN: dict[str, list[str]] = {}  # prefix -> keys written so far (creations on any thread)
# How long a destroy() waits for its keys to be deleted (a few store round trips; a store
# host that does not answer for this long is left to the deleting thread): the world's
# farewell waits as long for the other ranks.
FORGET_S = 5.0


@contextlib.contextmanager
def journal(prefix: str) -> Iterator[None]:
    """Record the keys written under `prefix` (a group's creation) until the block ends."""
    with _LOCK:
        _OPEN[prefix] = []
    try:
        yield
    finally:
        with _LOCK:
            _OPEN.pop(prefix, None)


_ABSENT = "\x00ringreduce: no such key"


def _compare_set(store: Any, key: str, expected: str, desired: str,
                 fallback: Callable[[], bytes]) -> bytes:
    """store.compare_set, or `fallback()` for a Python Store without it (best effort: not
    atomic)."""
    try:
        return bytes(store.compare_set(key, expected, desired))
    except RuntimeError as e:
        if "Not implemented" not in str(e):
            raise
        return fallback()


def peek(store: Any, key: str) -> bytes | None:
    """`key`'s value, or None if it is not set -- in one store call that never waits: a
    key a destroy() deletes may vanish between a check() and a get(), whose wait for it
    then blocked a rank outside a group for the connect timeout (found by a helper).
    compare_set with an impossible expected value sets nothing and returns what is there
    (or that value when nothing is)."""
    got = _compare_set(store, key, _ABSENT, _ABSENT,
                       lambda: bytes(store.get(key)) if store.check([key]) else _ABSENT.encode())
    return None if got == _ABSENT.encode() else got


def publish_once(store: Any, key: str, value: str) -> str:
    """Set `key` to `value` unless it is set; return what it holds then."""
    def fallback() -> bytes:
        if not store.check([key]):
            store.set(key, value)
        return bytes(store.get(key))

    return _compare_set(store, key, "", value, fallback).decode()


def wrote(prefix: str, *keys: str) -> None:
    """The rendezvous wrote `keys` for the creation under `prefix` (no-op outside one: an
    init's keys go with its store)."""
    with _LOCK:
        written = _OPEN.get(prefix)
        if written is not None:
            written.extend(keys)


def made(store: Any, prefix: str) -> list[str]:
    """This member's group is made: count it in; return the keys it wrote (for `forget`),
    or none if the store refused (they are then kept)."""
    with _LOCK:
        written = list(_OPEN.get(prefix, ()))
    try:
        store.add(prefix + "made", 1)
    except RuntimeError:
        return []
    return written


def forget(store: Any, prefix: str, keys: list[str], size: int, timeout: float,
           shared: Callable[[Any, str], list[str]] = lambda store, prefix: []) -> None:
    """destroy() of a group made under `prefix` with `size` members: delete `keys` (what
    this member wrote) once all members were made -- else (a member is still being made and
    may read them: a group destroyed right after new_group returned here) list them under
    the prefix for the last member to leave, which deletes every such list's keys, the
    counters and `shared(store, prefix)` (keys others wrote: notes of ranks outside the
    group). Before, such keys stayed for good (~17 per group; found by a helper). Best
    effort: never raises.

    The talk runs on a helper thread, waited for at most FORGET_S (of time this process
    ran): a store host stopped meanwhile (a debugger on rank 0) leaves the thread waiting
    for it, not destroy(). The thread's own deadline is the store talk's usual one
    (`timeout` + MARGIN_S); before, FORGET_S was that deadline, and its cut left the
    process's store connection refused for good -- the next new_group failed naming rank 0
    once it ran again (found by a helper)."""
    if not keys or store is None or _store_guard.was_cut(store):
        return  # none recorded: a group of one's (torch's share a prefix), or the store refused
    _farewell._talk_until(Awake(FORGET_S, Pauses()), _forget, store, prefix, keys, size,
                          timeout + _store_guard.MARGIN_S, shared,
                          name="ringreduce-store-forget")


def _forget(store: Any, prefix: str, keys: list[str], size: int, deadline_s: float,
            shared: Callable[[Any, str], list[str]]) -> None:
    try:
        with _store_guard.deadline(store, deadline_s):
            if int(store.add(prefix + "made", 0)) >= size:
                for k in keys:
                    store.delete_key(k)
            elif keys:
                store.set(f"{prefix}later/{int(store.add(prefix + 'later', 1))}",
                          "\n".join(keys))
            if int(store.add(prefix + "gone", 1)) == size:
                _forget_rest(store, prefix, shared)
    except (RuntimeError, NotImplementedError, _store_guard.StoreSilent):
        pass  # the store is gone or cannot delete: the keys stay, as they did before


def _forget_rest(store: Any, prefix: str, shared: Callable[[Any, str], list[str]]) -> None:
    """The last member's part of forget: the lists of keys left for it, and the counters."""
    lists = [f"{prefix}later/{i}" for i in range(1, int(store.add(prefix + "later", 0)) + 1)]
    for k in lists:
        for key in bytes(store.get(k)).decode().split("\n"):
            store.delete_key(key)
    for k in (*lists, *shared(store, prefix), prefix + "made", prefix + "gone", prefix + "later"):
        store.delete_key(k)
