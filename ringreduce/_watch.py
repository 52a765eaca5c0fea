"""What stops a store wait of this thread early (ringreduce._rendezvous's): failure keys
another rank may post (also_stop_on), peers the world's communicator finds gone
(watching), and groups destroyed on another thread (while_alive). Thread-local, so
concurrent waits of different groups or channels each stop for their own reasons."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import _farewell, _state


def rr_error(msg: str) -> Exception:
    from ._C import RingReduceError
    return RingReduceError(msg)


_ALSO = threading.local()  # also_stop_on: failure keys every _wait of this thread checks


@contextlib.contextmanager
def _pushed(local: threading.local, item: Any) -> Iterator[None]:
    """While inside: `item` is on this thread's tuple `local.v` (also_stop_on, while_alive)."""
    prev = getattr(local, "v", ())
    local.v = (*prev, item)
    try:
        yield
    finally:
        local.v = prev


def also_stop_on(key: str, unless: Callable[[Any], bool] | None = None
                 ) -> contextlib.AbstractContextManager:
    """While inside: every _wait of this thread also stops when `key` (a failure posted as
    _store_wait.fail posts it) appears -- unless `unless(store)` says it concerns another
    rank. Group creation uses a job-wide key: a rank that finds the groups out of step
    cannot know under which group's prefix the others wait."""
    return _pushed(_ALSO, (key, unless))


def passed_over(store: Any, key: str) -> bool:
    """Whether a failure found under `key` is one this thread's waits pass over (also_stop_on's
    `unless`)."""
    return any(k == key and unless is not None and unless(store)
               for k, unless in getattr(_ALSO, "v", ()))


_WATCH = threading.local()  # watching(): (world Group, peers) whose failure stops the waits


@contextlib.contextmanager
def watching(world: Any, peers: Any) -> Iterator[None]:
    """While inside: every _wait of this thread also stops, raising PeerFailure, once one of
    `peers` (world ranks) is known to be gone -- dead, frozen, or failed -- as the world's
    communicator sees it between collectives (Communicator::probePeers). Without this, a
    group's creation or a p2p channel's rendezvous waited for a dead rank until its timeout,
    told to check WORLD_SIZE."""
    prev = getattr(_WATCH, "v", None)
    _WATCH.v = (world, frozenset(peers))
    try:
        yield
    finally:
        _WATCH.v = prev


def watched_probe(what: str) -> Any:
    """For a wait outside the store (a group's TCP connect in C++): a function raising as
    _wait does when a peer this thread watches (see watching) is gone; None if none."""
    w = watched()
    return None if w is None else functools.partial(probe, w[0], w[1], what)


def probe(world: Any, peers: Any, what: str, any_of: bool = False,
          named_only: bool = False) -> int | None:
    """Raise if one of `peers` is known to be gone (see watching) -- unless any_of (a
    receive from any of them), also when it left the job (said goodbye: it will never
    come) -- or the world was destroyed meanwhile. named_only: only when the world's failure
    names one of `peers` as dead (its connection closed; not one found silent, which may
    resume, nor one that relayed another rank's loss, aborted, or left: it may be alive,
    and the two may still talk on their own channels and groups). any_of asks the ones
    outside a sparse
    world's overlay for heartbeats (see Communicator::probePeers) and returns one of them
    that left the job normally -- its goodbye seen, or found gone with its sign in the store
    (_farewell.say_left) -- for the caller to pass over, else None."""
    from ._C import PeerFailure

    check_destroyed(world, what)
    comm = world.comm
    if comm is None:
        return None
    try:
        comm.probe_peers([int(p) for p in peers], any_of)
    except PeerFailure as e:
        p, via = getattr(e, "peer_rank", None), getattr(e, "relayed_by", None)
        cause = getattr(e, "cause", None)
        gone = via is None and p is not None and cause in PeerFailure.GONE_CAUSES
        if any_of and via is None and p in peers and (cause == "left" or gone and (
                _farewell.said_left(world.store, world.store_prefix, p))):
            return int(p)
        if gone:
            # Found gone by the world itself (no call of the world failed): destroy's
            # farewell says its goodbye for it, not waiting for one that never comes.
            world.note_child_failure(int(p))
        if named_only and (p not in peers or cause != "closed"):
            return None  # maybe alive (silent: may resume), or not one this call needs
        if p is not None and p not in peers and via not in peers:
            return None  # not one this wait needs: the calls that need it report it
        err = PeerFailure(f"rank {world.rank} stopped waiting for {what}: {e}")
        err.peer_rank, err.cause = p, getattr(e, "cause", None)  # type: ignore[attr-defined]
        err.relayed_by = via  # type: ignore[attr-defined]
        raise err from None
    except RuntimeError as e:  # destroyed on another thread meanwhile
        raise rr_error(f"rank {world.rank}: stopped waiting for {what}: {e}") from None
    return None


_OWNERS = threading.local()  # while_alive(): groups whose destroy() stops this thread's waits


def while_alive(g: Any) -> contextlib.AbstractContextManager:
    """While inside: every watched wait of this thread (see watching) also stops once group
    `g` is destroyed (on another thread) -- making a group's point-to-point channel, before
    it waited on for the group's timeout and then blamed the peer."""
    return _pushed(_OWNERS, g)


def check_destroyed(world: Any, what: str) -> None:
    """Raise if ringreduce.destroy() or abort() was called (on another thread) while this
    one waited, or destroy() of a group this thread works for (while_alive)."""
    if world.destroyed:
        raise rr_error(f"rank {world.rank}: ringreduce.destroy() was called while this rank "
                        f"waited for {what}")
    gone = next((g for g in getattr(_OWNERS, "v", ()) if g.destroyed), None)
    if gone is not None:
        raise rr_error(f"rank {world.rank}: {gone.name} was destroyed while this rank waited "
                        f"for {what}; wait for a group's isend/irecv before destroying it")
    _state.check_aborted(world, what)


def also_keys() -> tuple:
    """The failure keys this thread's waits also stop on (see also_stop_on)."""
    return tuple(k for k, _ in getattr(_ALSO, "v", ()))


def watched() -> tuple | None:
    """(world Group, peers) this thread watches (see watching), or None."""
    return getattr(_WATCH, "v", None)
