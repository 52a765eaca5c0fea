"""Making one communicator: exchange addresses and host identities through the store (the
core chooses shared memory from them: csrc/transport/select.cc), connect, arm what the
environment asks for (tracing, flight recorder, fault injection). Used by init() for the
world and by every group (ringreduce.groups) and p2p channel.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from typing import Any

from . import (
    _blame,
    _cpus,
    _env,
    _fds,
    _procnet,
    _rendezvous,
    _state,
    _store_guard,
    _store_wait,
    _watch,
)
from ._buffers import algo_code

log = logging.getLogger("ringreduce")


def connect(rank: int, world: int, tun: Any, options: dict, store: Any,
             maddr: str | None, ifname: str | None, secret: str | None,
             prefix: str | None = None, name: str = "world",
             labels: list[int] | None = None, socketless: bool = False,
             links: Any = None) -> _state.Group:
    """Exchange addresses through `store` (under `prefix`: a group's; None: a new init's),
    connect and return the communicator's Group (world_size >= 2). Used by init() and by
    every group (ringreduce.groups), which passes the world's secret. socketless: a group
    whose ranks share one host opens no TCP connection (Options::socketless); the store
    stands in for the mesh while its shared memory is set up. links: a group's over TCP
    are streams on these shared connections (_C.LinkTable; unless RINGREDUCE_GROUP_LINKS=0), each
    named by a hash of the set-up's session (full mesh only: larger groups connect their own
    lazily)."""
    from . import _C

    # The caller's options, less what a connect derives (the world's, when a group's).
    options = {k: v for k, v in options.items()
               if not k.startswith("shm_") and k not in ("session", "spin_us", "rank_labels",
                                                          "group_name")}
    if labels is not None:  # a group: messages name world ranks, and the group
        options["rank_labels"], options["group_name"] = list(labels), name
    # One deadline for the whole set-up (RINGREDUCE_CONNECT_TIMEOUT, or a group's own): each
    # step gets what the steps before left -- a rank 12 s late to publish its address gave
    # the connections a fresh 15 s of a 15 s timeout before (found by a helper).
    end = time.monotonic() + float(options["connect_timeout"])

    def left() -> float:
        return max(0.1, end - time.monotonic())
    try:
        _fds.ensure(world, _fds.eager_peers(rank, world, options), f"rank {rank} of {name}",
                    _fds.SLACK if labels is None else _fds.GROUP_SLACK)
        bind = _env.select_interface_address(maddr, ifname or tun.socket_ifname, left())
        listener = _C.Listener(bind)
    except Exception as e:
        _rendezvous.fail_setup(store, rank, world, prefix, e)
        raise
    host = bind if ":" not in bind else f"[{bind}]"
    # A group over shared links publishes which link it has to each member's process.
    mine = links.ids(list(labels)) if links is not None and labels is not None else None
    peers = _rendezvous.exchange(store, rank, world, f"{host}:{listener.port}" + (
                                     "" if mine is None else "|" + ",".join(map(str, mine))),
                                 secret, left(), f"{host}:{listener.heartbeat_port}",
                                 prefix=prefix, settings=_env.job_wide(tun, options),
                                 ranks=labels)
    peers.addrs, link_ids = _agreed_links(peers.addrs, rank)
    _store_wait.alike(store, peers.prefix, world, _refuse_unreachable_loopback, peers, labels,
                      name)
    options["session"] = peers.session  # per-init heartbeat key: no replay across inits
    # Busy-poll (sockets and shared memory) briefly only when every local rank can have its
    # own CPU among those this process may run on (affinity mask, cgroup quota): spinning
    # steals the core a peer needs when ranks outnumber them.
    local = sum(1 for h in peers.hosts if h == peers.hosts[rank])
    cpus = _cpus.usable_cpus()
    options["spin_us"] = _C.DEFAULT_SPIN_US if local <= cpus else 0.0
    log.info("rank %d of %s: %d local ranks, %d usable CPUs: %s", rank, name, local, cpus,
             "waits spin briefly" if options["spin_us"] else "waits never spin")
    options.update(shm_options(tun.transport, peers))
    meet = None
    if socketless:
        options["socketless"] = True
        meet = functools.partial(_rendezvous.allgather, store, peers.prefix, rank, world,
                                 left())
    what = f"{name} to connect"
    try:
        with _rendezvous.store_used(rank, f"{name}'s set-up", store, left()):  # checks' calls
            comm = _C.Communicator(rank, world, listener, peers.addrs, peers.secret,
                                   {**options, "setup_seconds": left()}, peers.hb_addrs, meet,
                                   _setup_check(store, peers.prefix, rank, what), links,
                                   _stream_id(peers) if links is not None else 0, link_ids)
    except Exception as e:
        # The others may wait for this rank's connection (no mesh carries the abort yet):
        # they stop at their next check (a rank with no route to another's address failed
        # at once; the other waited for it until RINGREDUCE_CONNECT_TIMEOUT).
        if not getattr(e, _blame.SECONDARY, False):  # not one told here by another rank
            me = _rendezvous._speaker(rank)
            # A rank that failed first may have removed what this one was reaching for (its
            # shared memory segment: "cannot open ... different containers?" -- a helper,
            # 1 run in 5 when a rank skipped a new_group): its reason, if it comes within a
            # moment, is the one to raise. Only for the core's untyped errors (that one);
            # a typed cause -- a bad setting, a timeout, a peer this rank saw go -- is posted
            # at once (a rank that failed first must not wait and lose the race: a review).
            told = _posted_reason(store, peers.prefix) if type(e) is _C.RingReduceError \
                else None
            if told is None:
                _store_wait.fail_bounded(store, peers.prefix, e, me)
            if rank == 0 and labels is None:  # the world's: this process may host the store
                _rendezvous._linger(store, world)
            if told is not None:
                raise _store_wait.posted_error(told, me, what) from None
        raise
    log.info("rank %d of %s: connected to %d peers from %s; transport plan: %s", rank, name,
             world - 1, bind, comm.plan)
    if tun.trace:
        comm.set_tracing(True)
    if tun.flight_recorder:
        comm.set_flight_path(tun.flight_recorder)
    set_call_sites(tun.call_sites)
    f = tun.fault
    if f is not None and f["rank"] == rank and name == "world":
        from . import _fault  # the actions: a test module of its own, loaded only here
        comm.set_fault(_env.FAULT_COLLECTIVES[f["collective"]], f["seq"], f["at"], f["action"],
                       f["stamp"], _fault.FIRE)
        log.warning("rank %d: RINGREDUCE_FAULT armed: %s", rank, f)
    return _state.Group(rank=rank, world_size=world, comm=comm, hosts=peers.hosts,
                        options=options, default_algo=algo_code(tun.algo), tunables=tun,
                        store_prefix=peers.prefix, name=name, secret=peers.secret)


def _posted_reason(store: Any, prefix: str, within: float = 0.5) -> str | None:
    """What another rank posted as why its set-up failed, looking for up to `within`
    seconds (None: nothing, or the store cannot answer: cut, closed, or silent -- bounded
    as fail_bounded is)."""
    with contextlib.suppress(Exception), _store_guard.deadline(store, within + 1.0):
        if _store_guard.was_cut(store) or _procnet.server_closed(store):
            return None  # a store call would make torch log a C++ trace
        stop = _store_wait.posted_key(store, [prefix + "failed", *_watch.also_keys()], within)
        return None if stop is None else store.get(stop).decode()
    return None


def _setup_check(store: Any, prefix: str, rank: int, what: str) -> Any:
    """What the core's set-up runs between connect attempts and accept polls: it raises
    when a peer this thread watches is gone (_watch.watching) or, looking at most every
    0.25 s, when another rank posted why its set-up failed. Once the store's server has
    closed (its host gave up and exited) it stops looking: the set-up's own deadline and
    peer checks report what follows, as before there was a look."""
    probe = _watch.watched_probe(what)
    stops = [prefix + "failed", *_watch.also_keys()]
    due, me = [time.monotonic() + 0.25], _rendezvous._speaker(rank)  # a world rank

    def check() -> None:
        if probe is not None:
            probe()
        if time.monotonic() >= due[0]:
            due[0] = time.monotonic() + 0.25
            try:
                if not _procnet.server_closed(store):
                    _store_wait.raise_posted(store, stops, me, what)
                    return
            except _rendezvous._torch_store().DistError:  # it closed meanwhile
                pass
            due[0] = float("inf")
    return check


def _refuse_unreachable_loopback(peers: Any, labels: list[int] | None, name: str) -> None:
    """ValueError, raised alike on every rank (all read the same table), when a rank listens
    on a loopback address that ranks on other hosts would dial on their own -- before, they
    were refused there and said the rank had exited, and it waited for them until
    RINGREDUCE_CONNECT_TIMEOUT (found by a helper)."""
    bad = _env.netif.unreachable_loopback(peers.addrs, peers.hosts)
    if not bad:
        return
    label = (lambda r: labels[r]) if labels is not None else (lambda r: r)
    r, away = bad[0]
    far = ", ".join(str(label(p)) for p in away[:8]) + (", ..." if len(away) > 8 else "")
    raise ValueError(
        f"rank {label(r)} of {name} listens on {peers.addrs[r]}, a loopback address, but "
        f"rank(s) {far} run on other hosts and cannot reach it: a rank listens on the "
        f"interface that routes to MASTER_ADDR, and on rank {label(r)}'s host "
        f"({peers.hosts[r].split('/')[0]}) MASTER_ADDR is a loopback address or a name that "
        f"resolves to one (an /etc/hosts line such as '127.0.1.1 <hostname>'); set "
        f"MASTER_ADDR to rank 0's routable IP address, or RINGREDUCE_SOCKET_IFNAME to the "
        f"interface the hosts share, on every rank")


def _agreed_links(published: list, rank: int) -> tuple:
    """The members' addresses, and per member the id of the link to its process that both
    it and this rank published (0: none agreed: the two connect, making a new link). Both
    members of a pair read the same two ids, so they decide alike even while another set-up
    of theirs adds a link (isend/irecv make channels on helper threads): before, each
    decided from its own table, and one could wait for a connection the other never made
    (found by a helper)."""
    addrs = [a.partition("|")[0] for a in published]
    if "|" not in published[rank]:
        return addrs, []
    views = [[int(i) for i in a.partition("|")[2].split(",")] for a in published]
    return addrs, [views[rank][p] if p != rank and views[rank][p] == views[p][rank] else 0
                   for p in range(len(published))]


def _stream_id(peers: Any) -> int:
    """The stream a group's messages take on each shared link: the same on every member, a
    hash of the session its rank 0 drew for this set-up (random). Not of the store prefix
    alone: torch's subgroups each have a PrefixStore of their own, and the prefix inside it
    repeats for groups of one size -- a second dist.new_group([0, 1]) over TCP failed with
    "stream ... is already open on the link" (found by a helper)."""
    import hashlib

    key = f"{peers.prefix}|{peers.session}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little")


def set_call_sites(on: bool) -> None:
    """Call sites are the first frame outside ringreduce and torch (torch.distributed's
    wrappers, autograd's backward) -- the user's line."""
    import importlib.util

    from . import _C

    skip = [os.path.dirname(os.path.abspath(__file__)) + os.sep]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        skip.append(os.path.dirname(spec.origin) + os.sep)
    # torch wraps deprecated collectives (all_gather_into_tensor, reduce_scatter_tensor) in
    # typing_extensions.deprecated: its wrapper is not the user's line either.
    spec = importlib.util.find_spec("typing_extensions")
    if spec is not None and spec.origin:
        skip.append(spec.origin)
    _C.set_call_site_skip(skip)
    _C.set_call_sites(on)


def shm_options(transport: str, peers: Any) -> dict:
    """What the core needs to choose shared memory (transport/select.cc decides, from every
    rank's host identity and RINGREDUCE_TRANSPORT): the identities, the setting, and the
    common start of this init's segment names -- each creator appends its rank, pid and
    random bytes (segment.cc), which keeps names unique and unguessable even when two jobs
    share a secret, and tells its peers the result."""
    import hashlib

    tag = hashlib.sha256(f"{peers.secret}/{peers.prefix}".encode()).hexdigest()[:24]
    return {"shm_prefix": f"/rr-{tag}", "shm_hosts": list(peers.hosts),
            "shm_transport": transport}
