"""Groups: communicators over some of the job's ranks.

``new_group(ranks)`` is called by every rank of the job in the same order (like torch's
``dist.new_group``) and returns a Group on its members, None elsewhere; ``Group.split(color,
key)`` is MPI_Comm_split / ncclCommSplit over an existing group. Each group is its own
communicator (connections among its members, sequence numbers, failure state, shared memory
when its members share a host), authenticated with the job's secret and set up through the
job's store under a key prefix every member derives from the same call count -- so groups
can run concurrently from different threads and overlap each other. Its members rendezvous
among themselves: ranks outside a group never wait for it.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import (
    _comm,
    _env,
    _farewell,
    _fds,
    _procnet,
    _rendezvous,
    _state,
    _store_guard,
    _store_keys,
    _store_wait,
    _trace,
    _watch,
    _work,
)
from ._buffers import as_buffer
from ._state import Group

log = logging.getLogger("ringreduce")


def world_group() -> Group:
    """The world as a Group (what init() made): split it, or pass it as group=."""
    return _state.current("world_group()")


def new_group(ranks: Sequence[int] | None = None, timeout: float | None = None) -> Group | None:
    """A group of the world ranks `ranks` (default: all). Every rank of the job must call
    it, in the same order and with the same `ranks` (as torch.distributed.new_group);
    members get their Group (group ranks follow the sorted world ranks, as in torch), other
    ranks None. timeout: seconds a collective of this group may wait (default: the
    world's)."""
    world = _state.current("new_group()")
    n = world.world_size
    members = list(range(n)) if ranks is None else _check_ranks(ranks, n)
    secs = _check_timeout(timeout, "new_group")
    with _one_thread(world, "new_group()"):
        world.created += 1  # every rank counts, member or not: the key prefix stays in step
        idx = world.created
        prefix, name = f"{world.store_prefix}group{idx}/", f"group{idx}"
        with _in_step(world, prefix, name, members):
            if world.rank not in members:
                _note_left_out(world, name)
                _left_out(world, prefix, members, name)
                return None
            return _make(world, members, prefix, name, secs)


_CREATING: dict[int, tuple] = {}  # id(parent) -> (thread, call) creating a group of it now
_CREATING_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_thread(parent: Group, what: str) -> Iterator[None]:
    """Refuse a group creation on `parent` while another thread of this process creates one
    on it: the ranks would number the two groups by which thread came first, each its own
    way, and threads then shared groups across ranks -- all-reduces mixing two threads' data
    with no error (found by a helper: 19 results in 20 wrong)."""
    me = threading.current_thread()
    with _CREATING_LOCK:
        other = _CREATING.get(id(parent))
        if other is None:
            _CREATING[id(parent)] = (me, what)
    if other is not None:
        raise RuntimeError(
            f"rank {parent.rank}: {what} on thread {me.name!r} while thread "
            f"{other[0].name!r} is in {other[1]} of {parent.name}: groups of one parent must "
            f"be made in one order on every rank, which threads racing cannot keep (their "
            f"groups would pair up across threads). Make groups from one thread, or give each "
            f"thread its own parent (Group.split, made in order) to split")
    try:
        yield
    finally:
        with _CREATING_LOCK:
            _CREATING.pop(id(parent), None)


def split(parent: Group, color: int | None, key: int = 0) -> Group | None:
    """Group.split: see there."""

    parent = _state.resolve(parent, "Group.split()")
    with _one_thread(parent, "Group.split()"):
        return _split(parent, color, key)


_I64 = (-(1 << 63), (1 << 63) - 1)


def _bad_split_argument(color: Any, key: Any) -> Exception | None:
    import numpy as np

    ints = (int, np.integer)
    if color is not None and (not isinstance(color, ints) or not 0 <= color <= _I64[1]):
        return ValueError(f"Group.split: color must be an int >= 0 or None (no new group: "
                          f"NCCL_SPLIT_NOCOLOR's and MPI_UNDEFINED's meaning), got {color!r}")
    if not isinstance(key, ints):
        return TypeError(f"Group.split: key must be an int, got {key!r}")
    if not _I64[0] <= key <= _I64[1]:
        return ValueError(f"Group.split: key must fit in 64 bits, got {key!r}")
    return None


def _split(parent: Group, color: int | None, key: int) -> Group | None:
    import numpy as np

    # A bad argument is shared with the others (state 2) and refused on every rank: raised
    # here alone, the others' allgather met this rank's next collective (a mismatch naming
    # an allgather the user never called, found by a helper).
    bad = _bad_split_argument(color, key)
    state = 2 if bad else 0 if color is None else 1
    mine = np.array([state, 0 if bad else color or 0, 0 if bad else key], dtype=np.int64)
    allv = np.empty((parent.world_size, 3), dtype=np.int64)
    if parent.comm is None:
        allv[0] = mine
    else:
        b, o = as_buffer(mine, "split"), as_buffer(allv, "split")
        parent.comm.allgather(b.ptr, o.ptr, b.count, b.code, False)
    parent.created += 1
    idx = parent.created
    if bad:
        try:
            raise bad
        finally:
            del bad  # no cycle through this frame (error -> traceback -> frame -> error)
    culprits = [parent.ranks[r] for r in range(parent.world_size) if allv[r, 0] == 2]
    if culprits:
        raise ValueError(f"Group.split on {parent.name}: world rank{'s' if len(culprits) > 1 else ''} "
                         f"{', '.join(map(str, culprits))} passed a bad color or key (its own "
                         "error says which); no rank made a group")
    if color is None:
        return None
    same = sorted((int(k), r) for r, (has, c, k) in enumerate(allv.tolist())
                  if has and c == color)
    members = [parent.ranks[r] for _, r in same]
    prefix = f"{parent.store_prefix}split{idx}/c{int(color)}/"
    name = f"{parent.name}/split{idx}:{int(color)}"
    with _in_step(_root(), prefix, name, members):
        return _make(_root(), members, prefix, name)


def from_store(store: Any, rank: int, size: int, name: str,
               timeout: Any = None, members: list[int] | None = None) -> Group:
    """A group for a torch process group of the ringreduce backend (torch gives it its own
    PrefixStore, the group rank and new_group's timeout): its members tell each other their
    world ranks there. members: its world ranks where torch gives them (then only they are
    watched while the group starts: another rank may finish and leave meanwhile --
    new_group(use_local_synchronization=True) -- found by a helper)."""
    world = _state.current("a torch subgroup")
    secs = _check_timeout(timeout, "new_group")
    if size == 1:
        return _register(world, _single(world, [world.rank], "ringreduce/", name))
    timeout = _setup_secs(world, secs)
    # torch names groups by a counter that restarts with each default group, and the store
    # can outlive default groups (ringreduce.init()'s world, a persistent store, torchrun's
    # agent store): the same PrefixStore may hold an earlier group's keys. Each group rank
    # counts the groups of this name and size it joined under the world's session (random
    # per init) -- every member of one has joined equally many -- so all members derive the
    # same fresh prefix.
    base = f"ringreduce/{world.options.get('session', '')[:16]}/size{size}/"
    with _rendezvous.store_used(world.rank, f"creating {name}", store, 4 * timeout):
        p = f"{base}{store.add(f'{base}gen/{rank}', 1)}/"
    keys = [f"{p}grank/{r}" for r in range(size)]
    with _store_keys.journal(p), _interrupts_told(world, store, p, name), \
            _rendezvous.store_used(world.rank, f"creating {name}", store, 4 * timeout):
        store.set(f"{p}grank/{rank}", str(world.rank))
        _store_keys.wrote(p, f"{p}grank/{rank}")
        # Without torch's list, the members are known once all have started: until then any
        # rank's failure stops it.
        with _watch.watching(world, [r for r in (members or range(world.world_size))
                                     if r != world.rank]):
            _rendezvous._wait(store, keys, timeout, rank, f"the members of group {name} to "
                              f"start", p, hint="the group ranks missing have not called "
                              "new_group: every member must call it, in the same order")
        members = [int(store.get(k)) for k in keys]
        with _watch.watching(world, [m for m in members if m != world.rank]):
            return _connect(world, store, members, rank, p, name, secs)


def destroy_group(g: Group, world: Group | None = None, tidy: bool = True) -> None:
    """Group.destroy: close the group's connections (the world: ringreduce.destroy()).
    `world`: the world it belongs to (default: the current one; ringreduce.destroy() passes
    the world it is destroying, no longer current by then). tidy: delete the store keys its
    creation wrote (not when the store goes with the world anyway)."""
    if g.destroyed:
        return
    if g is _state._DEFAULT[0]:
        destroy_default()
        return
    if world is None:
        world = _state._DEFAULT[0]
    if world is not None:
        _finish_eager_sends(world, g)  # its channels carry them: they go next
    g.destroyed = True  # before the store goes: p2p's helper threads check it first
    store, g.store = g.store, None
    if store is None and world is not None:  # a group of one: its keys are in the world's
        store = world.store
    if world is not None and g in world.children:
        world.children.remove(g)
    for pair in list(g.p2p.values()):  # its point-to-point channels go with it
        for ch in pair:
            destroy_group(ch, world, tidy)
    g.p2p.clear()
    failed = False
    if g.comm is not None:
        if _env.tunables().trace:  # its row in the rank's trace file (written by destroy())
            try:
                _trace.keep(g.name, g.comm.trace_events())
            except Exception as e:  # noqa: BLE001 - the trace must not stop a destroy
                log.warning("%s: its trace events are lost: %s", g.name, e)
        g.comm.destroy()
        failed = g.comm.failed_at_destroy
        if failed and world is not None:
            lost = g.comm.lost_peer_at_destroy
            world.note_child_failure(g.ranks[lost] if g.ranks and lost >= 0 else lost)
    if tidy and not failed:
        _store_keys.forget(store, g.store_prefix, g.store_keys, g.world_size,
                           float(g.options.get("connect_timeout", 0.0)), _left_out_notes)


# Held through a destroy(): a second one (another thread, an exit hook) returns when the
# first has finished, not at once while the teardown still runs (a daemon thread's could
# then be cut off at exit). Reentrant: a signal handler's destroy() inside one is a no-op.
_DESTROYING = threading.RLock()


def destroy_default() -> None:
    """ringreduce.destroy(): the world's groups, its trace (RINGREDUCE_TRACE), GPU state,
    its communicator, then its store; returns promptly even if peers are gone."""
    with _DESTROYING:
        _destroy_default()


def _destroy_default() -> None:
    g = _state._DEFAULT[0]
    if g is not None:
        _finish_eager_sends(g)
    _state.set_default(None)
    _rendezvous.release_lingering()  # the store of a failed init(), if any
    if g is None:
        return
    if not g.aborted and g.store is not None and _sparse(g):  # before its listener closes
        _farewell.say_left(g.store, g.store_prefix, g.rank,
                           float(g.options.get("connect_timeout", 0.0)))
    # ringreduce's own store stops with the world: deleting its groups' keys is no use (nor
    # after abort(): the job is failing).
    destroy_children(g, tidy=g.store_key is None and not g.aborted)
    if g.links is not None:  # the groups' streams are closed: their fins go, then the links
        links, g.links = g.links, None
        links.close(0.0 if g.aborted else 0.5)
    borrowed = g.store if g.store_key is None else None  # torch's or the caller's store
    g.destroyed = True  # first: p2p's helper threads stop at it, not at the missing store
    g.store = None  # release_store's "does anyone else hold it" count must not see ours
    _join_helpers(time.monotonic() + 0.5)
    # destroy() fails whatever is still queued; the buffers stay referenced until then.
    pattern = _env.tunables().trace
    if pattern:
        try:
            path = _trace.write(g.comm, pattern, g.rank, g.world_size)
            log.info("rank %d: trace written to %s", g.rank, path)
        except OSError as e:
            log.warning("rank %d: could not write trace %s: %s", g.rank, pattern, e)
    try:
        from .gpu import route

        route.reset()  # NCCL communicator and pinned host buffers of this group
    finally:
        failed, lost = True, -1
        try:
            if g.comm is not None:
                g.comm.destroy()
                failed = g.comm.failed_at_destroy or g.child_failed
                lost = g.comm.lost_peer_at_destroy  # dead or frozen: says no "bye"
                if lost < 0:  # or one that a group or p2p channel found
                    lost = g.child_lost
        finally:
            # After the communicator: the store outlives nothing that could still use it.
            _rendezvous.release_store(g.store_key, g.rank, g.world_size, g.store_prefix,
                                      float(g.options.get("connect_timeout", 0.0)),
                                      failed=failed, lost=lost)
            if borrowed is not None:
                _rendezvous.farewell_borrowed(borrowed, g.rank, g.world_size, g.store_prefix,
                                              float(g.options.get("connect_timeout", 0.0)),
                                              failed=failed, lost=lost)
    _work.clear()  # the executors have stopped: nothing can touch those buffers now
    futures = sys.modules.get(f"{__package__}._futures")  # not imported: no threads (torch)
    if futures is not None:
        futures._COMPLETER.shutdown()  # its threads end once they completed what is queued


def _sparse(world: Group) -> bool:
    """Whether `world` connects lazily (above RINGREDUCE_FULL_MESH_MAX ranks): some ranks
    are outside each rank's overlay."""
    return not _fds.full_mesh(world.size, world.options)


def _finish_eager_sends(world: Group, only: Group | None = None) -> None:
    """Sends that returned before their receiver posted (ringreduce.p2p, the first message
    on a channel) and isend()s never waited for are delivered before the channels close, as
    MPI_Finalize completes buffered sends: wait for them, at most RINGREDUCE_TIMEOUT (a
    failure is logged). `only`: those on that group (its destroy()); else all of them."""
    with _state.EAGER_LOCK:  # a send on another thread registers its own meanwhile
        mine = [e for e in world.eager if only is None or e[3] is only]
        world.eager[:] = [e for e in world.eager if e[3] is not only and e[0].is_alive()] \
            if only is not None else []
    pending = [e for e in mine if e[0].is_alive()]
    t0 = time.monotonic()
    # + 1 s: a send that gives up at its own RINGREDUCE_TIMEOUT still gets to say why
    deadline = t0 + world.timeout + 1.0
    for t, *_ in pending:
        t.join(max(0.0, min(t0 + 2.0, deadline) - time.monotonic()))
    late = [(dst, tag) for t, dst, tag, _ in pending if t.is_alive()]
    if not late:
        return
    log.warning("rank %d: %s waits (at most RINGREDUCE_TIMEOUT) for %d send(s) not "
                "received yet (returned early, or isend() never waited for): to rank(s) "
                "%s; did those ranks skip their recv?", world.rank,
                "destroy()" if only is None else f"{only.name}.destroy()", len(late),
                ", ".join(f"{d} (tag {t})" for d, t in late[:8]))
    for t, *_ in pending:
        t.join(max(0.0, deadline - time.monotonic()))


def _join_helpers(deadline: float) -> None:
    """Let p2p's helper threads, which poll the store and stop at g.destroyed, finish before
    the store goes: else their next store call fails (torch prints a C++ stack trace) and
    they report a store failure instead of the destroy()."""
    for t in list(_state.HELPERS):
        if not _state.unstarted(t):
            t.join(max(0.0, deadline - time.monotonic()))
    _state.HELPERS[:] = [t for t in _state.HELPERS if t.is_alive()]


def destroy_children(world: Group, tidy: bool = True) -> None:
    """Destroy every live group of `world` (ringreduce.destroy(); failures do not stop it)."""
    for g in list(world.children):
        try:
            destroy_group(g, world, tidy)
        except Exception as e:  # noqa: BLE001 - the world's destroy goes on regardless
            log.warning("destroying %r failed: %s", g, e)
    world.children.clear()


def _root() -> Group:
    world = _state._DEFAULT[0]
    if world is None:
        raise RuntimeError("ringreduce was destroyed: its groups are gone too")
    return world


def _check_ranks(ranks: Sequence[int], n: int) -> list[int]:
    try:  # index(): ints (numpy's, 0-d integer tensors) only: [0, 1.7] is no group [0, 1]
        ranks = list(ranks)  # once: a generator's messages below said "ranks []"
        out = sorted(operator.index(r) for r in ranks)
    except TypeError:
        raise TypeError(f"new_group: ranks must be a sequence of ints, got {ranks!r}") from None
    if not out:
        raise ValueError("new_group: ranks is empty; a group needs at least one rank")
    if len(set(out)) != len(out):
        raise ValueError(f"new_group: ranks {list(ranks)} repeat a rank; list each rank once")
    if out[0] < 0 or out[-1] >= n:
        raise ValueError(f"new_group: ranks {list(ranks)} are not all in [0, {n}) (world size "
                         f"{n})")
    return out


def set_timeout(g: Group, seconds: Any) -> None:
    """Group `g`'s collectives and point-to-point calls begun from now on -- on its channels
    too -- wait at most `seconds` (a number or a timedelta); one in flight keeps its deadline.
    torch's Backend.setTimeout on a ringreduce backend."""
    secs = _check_timeout(seconds, "set_timeout")
    for h in _state.own_communicators(g):
        h.options = {**h.options, "timeout": secs}  # a new dict: a size-1 group shares its world's
        if h.comm is not None:
            h.comm.set_timeout(secs)
    if g is _state._DEFAULT[0]:
        g.timeout_from = "the backend's set_timeout"


def _check_timeout(timeout: Any, what: str) -> float | None:
    """Seconds (a number or a timedelta), validated as init's timeout is; None: the world's."""
    if timeout is None:
        return None
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    return _env.check_seconds(f"{what}(timeout)", timeout)


def _make(world: Group, members: list[int], prefix: str, name: str,
          timeout: float | None = None, p2p: str = "", store: Any = None) -> Group:
    """This rank's Group of world ranks `members` (in group-rank order); p2p: a
    point-to-point channel of the group so named (small messages over shared memory are
    sent eagerly; a peer lost on one fails this process's other channels of that group, see
    Options::p2pFamily); store: where `prefix` lives (default: the world's store)."""
    _state.check_aborted(world, f"creating {name}")
    me = members.index(world.rank)
    store = world.store if store is None else store
    out_of_step = _out_of_step(world)
    if len(members) == 1:
        return _register(world, _agreed_single(world, store, members, prefix, name,
                                               out_of_step, None if p2p else timeout))
    # A channel's key follows from its ranks and tag, not from the order of group creations.
    stop_on = contextlib.nullcontext() if p2p else _watch.also_stop_on(
        out_of_step + "failed", unless=_passes_over(world, out_of_step))
    with _store_keys.journal(prefix), stop_on, \
            _watch.watching(world, [m for m in members if m != world.rank]), \
            _interrupts_told(world, store, prefix, name), \
            _rendezvous.store_used(world.rank, f"creating {name}", store,
                                    4 * _setup_secs(world, timeout)):
        if not p2p:  # a channel's members follow from its key: nothing to compare
            _agree(store, prefix, me, members, _setup_secs(world, timeout), name,
                   out_of_step)
        return _connect(world, store, members, me, prefix, name, timeout, p2p)


def _agreed_single(world: Group, store: Any, members: list[int], prefix: str, name: str,
                   out_of_step: str, timeout: float | None) -> Group:
    """A group of one: no connections, but its list takes part in the agreement (a rank
    given a longer list with this one at its head fails at once, naming both, instead of
    waiting for it), and ranks outside it find it published and write no note there."""
    g = _single(world, members, prefix, name)
    if store is not None:
        with _store_keys.journal(prefix), _rendezvous.store_used(
                world.rank, f"creating {name}", store, 4 * _setup_secs(world, timeout)):
            _agree(store, prefix, 0, members, _setup_secs(world, timeout), name, out_of_step)
            g.store_keys = _store_keys.made(store, prefix)
    return g


def _setup_secs(world: Group, timeout: float | None) -> float:
    """How long a group's set-up may wait for its members: RINGREDUCE_CONNECT_TIMEOUT, or
    the group's own timeout if shorter (gloo's new_group(timeout=) bounds its connect too)."""
    secs = float(world.options["connect_timeout"])
    return secs if timeout is None else min(secs, timeout)


@contextlib.contextmanager
def _interrupts_told(world: Group, store: Any, prefix: str, name: str) -> Iterator[None]:
    """A Ctrl-C (KeyboardInterrupt, or a launcher's SystemExit) while this rank creates a
    group is posted under the group's prefix, so the other members stop at once -- before,
    they waited for this rank until RINGREDUCE_CONNECT_TIMEOUT (120 s) if it lived on (found
    by a helper). So is a thread that could not start here (a container's pids limit; they
    waited until this rank left). Other errors post their own reason where they arise."""
    try:
        yield
    except _store_guard.NoThread as e:
        _store_wait.fail(store, prefix, _watch.rr_error(
            f"world rank {world.rank} could not create {name}: {e}"), world.rank)
        raise
    except Exception:
        raise
    except BaseException as e:
        _store_wait.fail(store, prefix, _watch.rr_error(
            f"world rank {world.rank} stopped creating {name}: {type(e).__name__} "
            f"(interrupted)"), world.rank)
        raise


def _out_of_step(world: Group) -> str:
    """The job-wide prefix every group creation watches (_store_wait.fail posts under prefix +
    "failed"): a rank that finds the groups out of step cannot know under which group's
    prefix the others wait. One per failure: once a rank has taken a failure in (_in_step),
    its later creations watch the next, so that ranks which caught the error and call
    new_group again in step make their groups (before, every later one failed with it)."""
    return f"{world.store_prefix}groups/{world.out_of_step_seen}/"


_STEP_LOCK = threading.Lock()  # out_of_step_seen: splits of different parents may race


@contextlib.contextmanager
def _in_step(world: Group, prefix: str, name: str, members: list[int]) -> Iterator[None]:
    """Around a group's creation (`name`, under `prefix`, of world ranks `members`). Before
    it: a member the world knows failed fails it at once (_refuse_lost); each job-wide
    failure this rank has not taken in -- posted while it was not creating a group -- fails
    it too (posted under `prefix` for its members), unless this rank was left out of the
    group that failed (it has nothing to catch up on). After a failed creation: the job-wide
    failure posted by then is taken in (a mismatch is posted there before under its group)."""
    others = [m for m in members if m != world.rank]
    store = world.store
    member = world.rank in members
    # A member's Ctrl-C, or a thread it cannot start (the store's watchdog), is posted for
    # the others, as in the creation itself (found by the CI: the members waited 6 s).
    with _interrupts_told(world, store, prefix, name) if member and store is not None \
            else contextlib.nullcontext():
        if member:
            _refuse_lost(world, prefix, name, others)
        if store is not None:  # (watching: a store gone with rank 0 is named as _make names it)
            with _watch.watching(world, others), _rendezvous.store_used(
                    world.rank, f"creating {name}", store, _setup_secs(world, None)):
                while True:
                    key = _out_of_step(world)
                    where = _failed_group(store, key)
                    if where is None or where == name:  # (this creation's own: in its waits)
                        break
                    left_out = where in world.left_out_of
                    _took_in(world, key, where)
                    if not left_out:  # (posted for the members: none waits for the others)
                        _store_wait.raise_posted(store, [key + "failed"], world.rank,
                                                 f"creating {name}",
                                                 post_under=prefix if member else "")
    try:
        yield
    except BaseException:
        # (the store may be what failed: no C++ trace from torch then, and a short bound;
        # the creation's own error is the one to raise)
        with contextlib.suppress(Exception):
            if store is not None and not _procnet.server_closed(store):
                with _store_guard.deadline(store, 5.0):
                    key = _out_of_step(world)
                    where = _failed_group(store, key)
                    if where is not None:
                        _took_in(world, key, where)
        raise


def _refuse_lost(world: Group, prefix: str, name: str, others: list[int]) -> None:
    """A member the world knows dead (closed) fails the creation at once, before
    any store call -- posted under `prefix` (best effort) for the members that do not know
    yet. (One that left normally may have said why under the prefix, _left_out: the
    creation's waits read it; one that only aborted its world may be alive: CI.)"""
    try:
        _watch.probe(world, others, f"creating {name}", named_only=True)
    except Exception as e:
        if world.store is not None:
            _store_wait.fail_bounded(world.store, prefix, e, world.rank)
        raise


def _failed_group(store: Any, key: str) -> str | None:
    """The group whose creation failed, posted under the job-wide `key` (_out_of_step):
    None if none was ("" if its name is missing)."""
    if _store_keys.peek(store, key + "failed") is None:
        return None
    got = _store_keys.peek(store, key + "group")
    return "" if got is None else got.decode()


def _passes_over(world: Group, key: str) -> Callable[[Any], bool]:
    """also_stop_on's `unless` for the job-wide `key`: a failure of a group this rank was left
    out of -- it went on to its next creation while that group's members found out (found by
    a review: it failed the next group alone, and its members waited for it)."""
    seen: list = []

    def unless(store: Any) -> bool:
        if not seen:
            seen.append(_failed_group(store, key) in world.left_out_of)
        return seen[0]
    return unless


_LEFT_OUT_KEPT = 256  # the newest groups a rank was left out of, remembered for the above


def _note_left_out(world: Group, name: str) -> None:
    world.left_out_of[name] = None
    while len(world.left_out_of) > _LEFT_OUT_KEPT:
        del world.left_out_of[next(iter(world.left_out_of))]


def _took_in(world: Group, key: str, where: str) -> None:
    """This rank has taken in the job-wide failure under `key` (_out_of_step), of group
    `where`."""
    with _STEP_LOCK:
        if _out_of_step(world) == key:
            world.out_of_step_seen += 1
            world.left_out_of.pop(where, None)


def _fail_group(store: Any, prefix: str, out_of_step: str, err: Exception,
                name: str) -> Exception:
    """Post why group `name`'s creation fails under its prefix and the job's out-of-step
    prefix (_out_of_step, with the group's name: ranks left out of it skip it); return
    `err`."""
    try:
        _store_keys.publish_once(store, out_of_step + "group", name)
    except RuntimeError:
        pass  # the store is gone: fail() says nothing either
    _store_wait.fail(store, out_of_step, err)
    return _store_wait.fail(store, prefix, err)


def _left_out(world: Group, prefix: str, members: list[int], name: str) -> None:
    """new_group on a rank its `members` leave out: say so under the group's prefix, so that
    members given a list with this rank in it stop at once (instead of waiting for it until
    the connect timeout), and fail here too if group rank 0 published such a list already.
    Two reads if group rank 0 published its list already (nothing to say then unless it
    lists this rank), else two writes and two reads: no wait (ranks outside a group never
    wait for it)."""
    store, me, text = world.store, world.rank, ",".join(map(str, members))
    msg = (f"{name}: world rank {me} was called with ranks [{text}], without itself, but "
           f"other ranks list it as a member; every rank must create groups in the same "
           f"order with the same ranks")
    try:
        with _store_guard.deadline(store, _setup_secs(world, None)):  # a frozen store host
            first = _published(store, prefix)
            if not first:  # a note that outlives the group: its last member deletes it
                store.set(f"{prefix}left-out/{me}", f"ValueError\n{msg}")  # rank 0's members
                store.append(prefix + "left-out", f"{me}:{text};")  # for group rank 0 (_agree)
                first = _published(store, prefix)
    except (RuntimeError, NotImplementedError, _store_guard.StoreSilent):  # no append: no check
        return
    if first and str(me) in first.split(","):
        err = ValueError(f"{name}: world rank {me} was called with ranks [{text}], without "
                         f"itself, but world rank {first.split(',')[0]} with [{first}]; every "
                         f"rank must create groups in the same order with the same ranks")
        raise _fail_group(store, prefix, _out_of_step(world), err, name)


def _published(store: Any, prefix: str) -> str:
    """The member list group rank 0 published under `prefix` ("" if not yet)."""
    got = _store_keys.peek(store, prefix + "members")
    return "" if got is None else got.decode()


def _told_left_out(store: Any, prefix: str) -> dict[str, str]:
    """What ranks outside a group's list wrote under its prefix (_left_out): world rank ->
    the list it was given."""
    got = _store_keys.peek(store, prefix + "left-out")
    return {} if got is None else dict(e.split(":", 1) for e in got.decode().split(";") if e)


def _left_out_notes(store: Any, prefix: str) -> list[str]:
    """The keys _left_out wrote under a group's prefix (its last member deletes them)."""
    told = _told_left_out(store, prefix)
    return [*(f"{prefix}left-out/{r}" for r in told), prefix + "left-out"] if told else []


def _agree(store: Any, prefix: str, me: int, members: list[int], timeout: float,
           name: str, out_of_step: str) -> None:
    """Every member must have been given the same member list: group rank 0 publishes its
    own, the others compare. A mismatch fails all of them, naming both lists: it is posted
    under this group's prefix and under the job's `out_of_step` prefix, which every group
    creation watches -- a rank that skipped a new_group call is a group behind, so the
    others may be waiting under the next group's prefix."""
    text = ",".join(map(str, members))
    if me == 0:
        # First come, first kept: two ranks that each think they are group rank 0 (given
        # different lists) must not overwrite each other's list and then both claim rank 0.
        first = _store_keys.publish_once(store, prefix + "members", text)
        _store_keys.wrote(prefix, prefix + "members")
        if first == text:  # a rank of this list that was given one without itself?
            _check_left_out(store, prefix, members, text, name, out_of_step)
    else:
        from ._C import PeerFailure

        # Group rank 0 may have been given a list without itself (_left_out says so).
        what = f"world rank {members[0]} to create {name}"
        with _watch.also_stop_on(f"{prefix}left-out/{members[0]}"):
            try:
                _rendezvous._wait(store, [prefix + "members"], timeout, me, what, prefix)
            except PeerFailure as e:
                # A member given a list without itself got no group and may have left
                # before group rank 0 saw its note: its note is why, not that it left.
                gone = getattr(e, "peer_rank", None)
                if gone in members:
                    _store_wait.raise_posted(store, [f"{prefix}left-out/{gone}"], me, what)
                raise
        first = store.get(prefix + "members").decode()
        if first == text:  # a member that left out itself, left (got None) before rank 0
            _check_left_out(store, prefix, members, text, name, out_of_step)  # said why
    if first != text:
        err = ValueError(
            f"{name}: world rank {members[me]} was called with ranks [{text}] but world rank "
            f"{first.split(',')[0]} with [{first}]; every rank must create groups in the same "
            f"order with the same ranks (did a rank skip a new_group call?)")
        raise _fail_group(store, prefix, out_of_step, err, name)


def _check_left_out(store: Any, prefix: str, members: list[int], text: str, name: str,
                    out_of_step: str) -> None:
    """Group rank 0, after publishing `members`, and the other members after reading them:
    fail the group if one of them called new_group with a list that leaves it out (_left_out;
    of it and rank 0, whichever writes last sees the other's; a member that reads the notes
    itself fails with why, not with "rank N left the job" if the left-out rank came first,
    got None and left before rank 0's verdict was posted: CI, once)."""
    try:
        told = _told_left_out(store, prefix)
    except (RuntimeError, NotImplementedError):
        return
    bad = next((m for m in members if str(m) in told), None)
    if bad is not None:
        err = ValueError(f"{name}: world rank {members[0]} was called with ranks [{text}] but "
                         f"world rank {bad} with [{told[str(bad)]}], without itself; every rank "
                         f"must create groups in the same order with the same ranks")
        raise _fail_group(store, prefix, out_of_step, err, name)


def _connect(world: Group, store: Any, members: list[int], me: int, prefix: str,
             name: str, timeout: float | None = None, p2p: str = "") -> Group:
    tun = world.tunables or _env.tunables()  # agreed at init (a world of one: its own)
    maddr, ifname = world.net
    options = world.options if timeout is None else {
        **world.options, "timeout": timeout, "connect_timeout": _setup_secs(world, timeout)}
    options = {**options, "job_world": world.world_size}  # culprits outside it: world ranks
    if p2p:
        options = {**options, "p2p_channel": True, "p2p_family": p2p}
    g = _comm.connect(me, len(members), tun, options, store, maddr, ifname, world.secret,
                     prefix=prefix, name=name, labels=members, socketless=True,
                     links=_links(world, tun))
    g.ranks, g.local_rank, g.store = members, world.local_rank, store
    g.store_keys = _store_keys.made(store, prefix)  # for destroy() to delete
    log.info("rank %d: joined %s as rank %d of %d (world ranks %s)", world.rank, name, me,
             len(members), members)
    return _register(world, g)


def _links(world: Group, tun: Any) -> Any:
    """The world's shared links (made on first use), or None with RINGREDUCE_GROUP_LINKS=0."""
    if not tun.group_links:
        return None
    if world.links is None:
        from . import _C

        world.links = _C.LinkTable()
    return world.links


def _single(world: Group, members: list[int], prefix: str, name: str) -> Group:
    return Group(rank=0, world_size=1, comm=None, hosts=[world.hosts[world.rank]]
                 if world.hosts else [], options=world.options, local_rank=world.local_rank,
                 default_algo=world.default_algo, store_prefix=prefix, ranks=members,
                 name=name)


def _register(world: Group, g: Group) -> Group:
    world.children.append(g)
    return g


_state.GROUP_OPS.update(split=split, destroy=destroy_group)
