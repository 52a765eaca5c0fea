"""Communicators of this process: the world that ringreduce.init() made, and its groups.

A `Group` is one communicator: the world (``ringreduce.init()``) or a subset of it
(``ringreduce.new_group``, ``Group.split``, a torch ``dist.new_group`` on the ringreduce
backend). Each has its own connections, sequence numbers and failure state, so groups can
be used from different threads and overlap each other. Ranks given to collectives
(``src``/``dst``) are global (world) ranks, as in torch; ``Group.rank`` is this process's
rank inside the group.
"""

from __future__ import annotations

import operator
import os
import threading
from dataclasses import dataclass, field
from typing import Any

EAGER_LOCK = threading.Lock()  # guards every Group's .eager (p2p adds, destroy takes)


@dataclass(eq=False)
class Group:
    """A communicator over some of the job's ranks (the world, or a group of it)."""

    rank: int
    world_size: int
    comm: Any  # ringreduce._C.Communicator, or None for a group of one
    hosts: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    local_rank: int = 0
    default_algo: int = 0  # RINGREDUCE_ALGO: what algo="auto" means for all-reduce
    # The settings it was made with (_env.Tunables; None for a group of one): the world's
    # are the ones its ranks agreed on at init, and every group and channel made through it
    # uses them -- not the environment again, which may have changed on one rank since.
    tunables: Any = None
    # The store init made (its _rendezvous registry key; None when the caller or torch
    # passed the store: not ours to release) and this communicator's key prefix in it.
    store_key: tuple | None = None
    store_prefix: str = ""
    store_keys: list = field(default_factory=list)  # a group's: its creation's (_store_keys)
    ranks: list = field(default_factory=list)  # global rank of each group rank
    name: str = "world"
    # World only: the store subgroups rendezvous through, the number of new_group() calls so
    # far (every rank counts them, members or not: the next group's key prefix), and the
    # live subgroups (destroyed with the world).
    store: Any = None
    net: tuple = (None, None)  # init's (master_addr, ifname): where groups listen
    secret: str = ""  # the job secret: groups' connections are authenticated with it
    # World only (unless RINGREDUCE_GROUP_LINKS=0): the connections to other processes its groups
    # share (_C.LinkTable, made by the first group over TCP; closed by destroy())
    links: Any = None
    created: int = 0
    # World only: how many job-wide group-creation failures this rank has taken in (the
    # generation of groups._out_of_step's key) and the newest groups it was left out of (an
    # ordered set: name -> None).
    out_of_step_seen: int = 0
    left_out_of: dict = field(default_factory=dict)
    children: list = field(default_factory=list)
    p2p: dict = field(default_factory=dict)  # (lo, hi, tag) -> channels (ringreduce.p2p)
    p2p_failed: dict = field(default_factory=dict)  # (lo, hi, tag) -> why it was not made
    # ("make", lo, hi, tag) -> lock of the thread making that channel; ("any", tag) -> [turns
    # of any-source posts, in posting order; next peer to try] (ringreduce.p2p; go with group)
    p2p_locks: dict = field(default_factory=dict)
    # (thread or isend's Work, dst, tag): sends that returned early or were never waited
    # for (p2p); destroy() completes them
    eager: list = field(default_factory=list)  # under EAGER_LOCK
    destroyed: bool = False
    aborted: bool = False  # World only: ringreduce.abort() was called (refuse new channels)
    forked: int = 0  # in a forked child: the pid of the parent that made this group
    # World only: what its destroyed groups and p2p channels found (their destroy() ran
    # before the world's), or a channel's or group's set-up through the world: whether one
    # had failed, and a global rank one found dead or frozen (-1: none). The world's
    # farewell through the store then waits for that rank no more than after a failure of
    # the world itself.
    child_failed: bool = False
    child_lost: int = -1
    by_torch: bool = False  # World only: made by torch's default process group (backend)
    # World only: what set its timeout, for messages (init(timeout=), torch's, the variable)
    timeout_from: str = "RINGREDUCE_TIMEOUT"

    @property
    def timeout(self) -> float:
        """Its collectives' deadline in seconds: RINGREDUCE_TIMEOUT (init's timeout=), or a
        group's own (new_group(timeout=), torch's too)."""
        return float(self.options["timeout"])

    def note_child_failure(self, lost: int) -> None:
        """World only: a group, channel or set-up of it failed, having found world rank
        `lost` dead or frozen (-1: none); the first such rank is kept."""
        self.child_failed = True
        if lost >= 0 and self.child_lost < 0:
            self.child_lost = lost

    @property
    def size(self) -> int:
        """Number of ranks in this group."""
        return self.world_size

    def group_rank(self, global_rank: int, what: str) -> int:
        """The rank inside this group of world rank `global_rank`; `what` names the
        argument ("broadcast src") for the ValueError when it is not a member."""
        r = as_rank(global_rank, what)
        if self.ranks and self is not _DEFAULT[0]:
            if r in self.ranks:
                return self.ranks.index(r)
            raise ValueError(
                f"{what}={r} is not in group {self.name!r} (its world ranks are "
                f"{_short(self.ranks)}); {what.split()[-1]} is a world rank, as in torch")
        if not 0 <= r < self.world_size:
            raise ValueError(f"{what}={r} is not a rank of this job (world size "
                             f"{self.world_size})")
        return r

    def split(self, color: int | None, key: int = 0) -> Group | None:
        """MPI_Comm_split / ncclCommSplit: every member calls it; members that pass the same
        `color` form a new group, ordered by (`key`, rank in this group). `color=None`
        joins none (returns None)."""
        return GROUP_OPS["split"](self, color, key)

    def destroy(self) -> None:
        """Close this group's connections (its members should all call it). Destroying the
        world (ringreduce.destroy()) destroys its groups too."""
        GROUP_OPS["destroy"](self)

    def __repr__(self) -> str:
        return (f"Group({self.name!r}, rank={self.rank}, size={self.world_size}, "
                f"ranks={_short(self.ranks)})")


def _short(xs: list) -> str:
    return str(xs) if len(xs) <= 16 else f"[{', '.join(map(str, xs[:16]))}, ...]"


def as_rank(r: Any, what: str, kind: str = "rank") -> int:
    """`r` as an int: Python and numpy ints, integer 0-d tensors -- not floats (1.7 must not
    quietly become rank 1) or strings."""
    try:
        return operator.index(r)
    except TypeError:
        raise TypeError(f"{what} must be an int {kind}, got {r!r}") from None


# What Group.split and Group.destroy run: ringreduce.groups implements them and fills this
# when it is imported (ringreduce's __init__ does), so this module, below groups, never
# imports it.
GROUP_OPS: dict = {}

_DEFAULT: list = [None]
# Threads of ringreduce.p2p waiting in the store for a first message (isend/irecv): destroy()
# lets them see it (they stop within a poll) before the store goes.
HELPERS: list = []


def unstarted(t: Any) -> bool:
    """A thread registered (HELPERS, a group's eager sends) just before its start: kept, and
    not joined (join() raises on it)."""
    return isinstance(t, threading.Thread) and t.ident is None


# What _C.FastCall (rr.barrier, rr.allreduce) reads on every call: the world's communicator
# handle (None: no world, or a world of one) and its default all-reduce algorithm code.
_FAST: list = [None, 0]
# For rr.send / rr.recv: [this rank, per rank the handle of the tag-0 channel to / from it]
# (filled as ringreduce.p2p makes channels).
_SEND: list = [0, []]
_RECV: list = [0, []]


def set_default(g: Group | None) -> None:
    """Make `g` the world (None: there is none), for the Python API and the fast calls."""
    _DEFAULT[0] = g
    if g is not None:  # a world of its own: the parent's (if forked) no longer answers
        _retire_forked()
    comm = None if g is None else g.comm
    _FAST[:] = [None, 0] if comm is None else [comm.native_handle(), int(g.default_algo)]
    for slot in (_SEND, _RECV):
        slot[:] = [0, []] if comm is None else [g.rank, [None] * g.world_size]


def add_channel(world: Group, peer: int, to_peer: Group, from_peer: Group) -> None:
    """The tag-0 channels between this rank and `peer` exist: rr.send / rr.recv to and from
    it may take the fast path."""
    if world is _DEFAULT[0] and _SEND[1] and to_peer.comm is not None:
        _SEND[1][peer] = to_peer.comm.native_handle()
        _RECV[1][peer] = from_peer.comm.native_handle()


def _forked_message(what: str, name: str, parent: int) -> str:
    return (f"{what}: {name!r} was made by process {parent}, the parent of this forked process "
            f"(a DataLoader worker, os.fork()); its connections and threads belong to the "
            f"parent and cannot be used here. Run collectives in the parent, or start this "
            f"process with its own RANK and call ringreduce.init() in it")


# A forked child's copies of its parent's groups: refused, and answering get_rank() & co.
# until this process makes a world of its own. _INHERITED keeps every copy (their
# communicators are never freed here: see PyComm::forgetAfterFork).
_FORKED: list = []
_INHERITED: list = []


def _retire_forked() -> None:
    _INHERITED.extend(_FORKED)
    _FORKED.clear()


def communicators(world: Group) -> list:
    """The world, its groups and every p2p channel of them (copies of the lists: other
    threads may add or drop some)."""
    return [c for sub in [world, *list(world.children)] for c in own_communicators(sub)]


def own_communicators(g: Group) -> list:
    """The group and its p2p channels."""
    return [g, *(ch for pair in list(g.p2p.values()) for ch in pair)]


def _after_fork_in_child() -> None:
    g = _DEFAULT[0]
    if g is None:
        return
    parent = os.getppid()
    for c in communicators(g):
        if c.comm is not None:
            c.comm.forget_after_fork()
        c.forked, c.destroyed = parent, True  # destroy() and the exit hook skip it
        _FORKED.append(c)
    set_default(None)


os.register_at_fork(after_in_child=_after_fork_in_child)


def current(what: str = "this call") -> Group:
    g = _DEFAULT[0]
    if g is None and _FORKED:
        raise RuntimeError(_forked_message(what, "world", _FORKED[0].forked))
    if g is None:
        raise RuntimeError(
            f"ringreduce is not initialised: call ringreduce.init() before {what} "
            f"(it reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun and ringreduce-run set them)"
        )
    return g


def resolve(group: Any, what: str = "this call", runs: bool = True) -> Group:
    """The communicator a call with `group=` runs on: the world when None. `runs`: the call
    would run something (a collective), refused after ringreduce.abort() -- which a group
    of one, having no C++ communicator to refuse it, checks here. Calls that run nothing
    (get_rank, get_world_size) answer in a forked child too, with the parent's world's
    and groups' numbers, as torch.distributed's do (a DataLoader worker sharding by rank)."""
    if group is None and not runs and _DEFAULT[0] is None and _FORKED:
        return _FORKED[0]  # the parent's world (communicators() lists it first)
    if group is not None and not runs and isinstance(group, Group) and group.forked:
        return group
    if group is None:
        group = current(what)
        if runs and group.comm is None:
            check_aborted(group, what)
        return group
    if not isinstance(group, Group):
        raise TypeError(
            f"{what}: group must be a ringreduce Group (from ringreduce.new_group or "
            f"Group.split) or None for the world, got {type(group).__name__}")
    if group.forked:
        raise RuntimeError(_forked_message(what, group.name, group.forked))
    if group.destroyed:
        if group.by_torch:  # a torch default group aborted or shut down (pg.abort())
            again = "dist.destroy_process_group(), then dist.init_process_group() again"
        elif group.name.startswith("torch group "):
            again = "a new one with dist.new_group"
        elif group.name == "world":
            again = "ringreduce.init() again"
        else:
            again = ("a new group with ringreduce.new_group (ringreduce.destroy() destroys "
                     "every group)")
        raise RuntimeError(f"{what}: group {group.name!r} was destroyed; make {again}")
    if runs and group.comm is None:
        check_aborted(_DEFAULT[0], what)
    return group


def check_aborted(world: Group | None, what: str) -> None:
    """After ringreduce.abort() every call is refused (the C++ communicator's words): here
    those with no communicator to refuse them (a group of one, a world of one) and new
    groups and point-to-point channels."""
    if world is not None and world.aborted:
        from ._C import RingReduceError

        raise RingReduceError(f"communicator was aborted; destroy it and init again (rank "
                              f"{world.rank}, {what})")
