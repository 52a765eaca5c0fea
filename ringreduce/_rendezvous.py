"""Rendezvous through a torch Store: agree on a secret, exchange listening addresses and
host identities. No store of our own: torch.distributed.TCPStore from MASTER_ADDR and
MASTER_PORT (as torchrun sets them), the launcher's agent store when
TORCHELASTIC_USE_AGENT_STORE says so, or any torch Store the caller passes.

Ownership: a TCPStore made here is shared by reference count (make_store acquires,
release_store releases) so init() and code of the same job that asks for the job's store
(benchmarks running torch's gloo next to ringreduce) get one object. The last release drops
it -- on rank 0 that stops the store server, so nothing of the job stays listening after
destroy(). Stores the caller or torch passed in are never released here: not ours.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import (
    _env,
    _job_settings,
    _procnet,
    _store_guard,
    _store_keys,
    _store_reach,
    _store_wait,
    _watch,
)
from ._awake import Awake
from ._farewell import (  # noqa: F401 - farewell_borrowed, _FAREWELL_S: used through here
    _FAREWELL_FAILED_S,
    _FAREWELL_S,
    _farewell,
    _farewell_deadline,
    _poll,
    _talk_until,
    farewell_borrowed,
)
from ._parent_stores import inherit, refuse  # a forked child's parents' stores
from ._procnet import store_host  # noqa: F401 - callers use _rendezvous.store_host
from ._store_instance import store_instance
from ._watch import rr_error as _rr_error

_STORES: dict[tuple, Any] = {}  # (addr, port) -> the TCPStore made here, while acquired
_REFS: dict[tuple, int] = {}  # (addr, port) -> how many make_store calls hold it
_MASTER: set = set()  # keys whose store hosts the server in this process
_IN_RANK0: set = set()  # servers (_server) that world rank 0's process serves
# Keys whose reference a failed init left: the store stays up so that ranks still joining
# can read why init failed (prefix + "failed"); the next init() adopts it (same address)
# or drops it, and destroy() drops it.
_LINGER: set = set()
# (addr, port) -> (key prefix, acked) of the last init on that address whose server rank 0
# may stop: a client of the next init there checks it is not talking to that server in its
# last moments (acked: this rank already told rank 0 it read the answer).
_CLOSED: dict[tuple, tuple] = {}
# Inits so far in this process per store server and instance (_store_instance): each init's
# keys have their own prefix. Per server: ranks whose earlier inits differ (two made a world on
# another port first) met different keys on a fresh store (a helper found; gloo runs it).
_GENERATIONS: dict[tuple, int] = {}


def _after_fork_in_child() -> None:
    """The stores made here are the parent's now; the child starts afresh."""
    torch_store = torch_default_store() if "torch.distributed" in sys.modules else None
    inherit(_STORES, torch_store)
    for registry in (_STORES, _REFS, _MASTER, _IN_RANK0, _LINGER, _CLOSED):
        registry.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass
class Peers:
    addrs: list[str]
    hosts: list[str]
    secret: str
    prefix: str = ""  # store key prefix of this init (unique per init on its store server)
    hb_addrs: list = None  # UDP heartbeat "host:port" per rank
    session: str = ""  # random per init (rank 0 draws it): keys this init's heartbeats


def _torch_store():
    try:
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover
        raise ImportError("ringreduce needs torch when world_size > 1: its ranks meet through "
                          "torch's TCPStore; pip install torch (world size 1 runs without it)"
                          ) from e
    return dist


def make_store(master_addr: str | None, master_port: int | None, rank: int, world: int,
               timeout: float, use_agent_store: bool) -> Any:
    """Create (or reuse) the TCPStore for this job; pair every call with release_store()."""
    dist = _torch_store()  # first: without torch an address would not help
    if master_addr is None or master_port is None:
        raise ValueError(
            "world_size > 1 needs a rendezvous address: set MASTER_ADDR and MASTER_PORT "
            "(ringreduce-run and torchrun do; under mpirun across hosts pass them with "
            "-x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port>; MPICH's and Intel "
            "MPI's mpiexec: -genv MASTER_ADDR <host> -genv MASTER_PORT <port>), or pass "
            "master_addr=/master_port= or store= to init()"
        )
    key = (master_addr, master_port)
    refuse(None, key)
    if key in _LINGER:  # adopt the reference a failed init left
        _LINGER.discard(key)
        return _STORES[key]
    if key in _STORES:
        _REFS[key] += 1
        return _STORES[key]
    is_master = rank == 0 and not use_agent_store
    _check_resolves(master_addr, rank)
    what = "start the store on" if is_master else "reach the store at"
    why = _store_reach.no_route(master_addr, master_port) if is_master else None
    if why:
        raise _rr_error(
            f"rank {rank} could not {what} {master_addr}:{master_port}: this host has no "
            f"route there ({why}); rank 0 hosts the store, so {_env.origin('MASTER_ADDR')} "
            f"must be an address of rank 0's host")
    hint = ("is the port already in use? pick another MASTER_PORT" if is_master else
            "is rank 0 running, and is MASTER_ADDR reachable from this host?")
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        box = _build(dist, master_addr, master_port, is_master,  # what is left of it
                     max(0.1, deadline - time.monotonic()), deadline)
        if not box or isinstance(box[0], Exception) or not _is_old_server(key, box[0], deadline) \
                or time.monotonic() > deadline:
            break
        # rank 0's previous server, about to stop: drop it, connect again
        # Few reconnects: a torch TCPStore server stops answering after a few dozen quick
        # connect/close cycles (2.13, measured), which would block rank 0's farewell.
        time.sleep(pause)
        pause = min(2 * pause, 0.5)
    _CLOSED.pop(key, None)
    if not box:
        raise _store_wait.timeout_error(
            f"rank {rank} could not {what} {master_addr}:{master_port} within {timeout:.0f} s: "
            f"{_store_reach.why_unreachable(master_addr, master_port)} ({hint})")
    if isinstance(box[0], Exception):
        e = box[0]
        if is_master and "EADDRINUSE" in str(e):  # at once, not a timeout
            by = _refuse_second_rank0(dist, master_addr, master_port, world)
            raise _rr_error(
                f"rank {rank} could not {what} {master_addr}:{master_port}: port already in "
                f"use ({by}); pick another MASTER_PORT ({_first_line(e)})") from e
        # torch's own timeout may come first (it retries refused connects until then): say
        # why, as below, not only "timed out" (the CI saw both orders).
        why = "" if is_master else \
            _store_reach.why_unreachable(master_addr, master_port) + "; torch: "
        raise _store_wait.timeout_error(
            f"rank {rank} could not {what} {master_addr}:{master_port} within {timeout:.0f} s: "
            f"{why}{_first_line(e)} ({hint})") from e
    _STORES[key] = box[0]
    _REFS[key] = 1
    if is_master:
        _MASTER.add(key)
    elif not use_agent_store:
        _IN_RANK0.add(_server(box[0]))  # served by rank 0's process (store_failed)
    return box[0]


_CONNECTING: set = set()  # store connects still running: their end Events (join_connects_at_exit)


def _build(dist: Any, addr: str, port: int, is_master: bool, timeout: float,
           deadline: float) -> list:
    """[the TCPStore], [the exception making it raised], or [] at the deadline. TCPStore's own
    timeout does not cover a server that accepts and never answers (another program on
    MASTER_PORT): it is built on a helper thread, and the wait stops at the deadline."""
    box: list = []
    done = threading.Event()  # not join(): one that Ctrl-C interrupted marks the thread
    # stopped (Python 3.11), and join_connects_at_exit then let it come back from C++ while
    # the interpreter finalized: SIGABRT (found by a helper)

    def build() -> None:
        _CONNECTING.add(done)
        try:
            if not is_master and not _store_reach.wait_routable(addr, port, deadline):
                return  # (nothing in C++ to come back at exit; the caller says why)
            # multi_tenant: torch's env:// rendezvous (init_process_group after init())
            # hosts its store on MASTER_PORT too, multi-tenant: it then shares this server
            # instead of failing with EADDRINUSE (found by a helper).
            box.append(dist.TCPStore(addr, port, world_size=None, is_master=is_master,
                                     timeout=timedelta(seconds=timeout),
                                     wait_for_workers=False, multi_tenant=is_master))
        except Exception as e:  # noqa: BLE001 - torch's RuntimeError/DistNetworkError, re-raised
            box.append(e)
        finally:
            _CONNECTING.discard(done)
            done.set()

    _store_guard.start(threading.Thread(target=build, name="ringreduce-store-connect",
                                        daemon=True), "the thread connecting to the store")
    done.wait(max(0.0, deadline - time.monotonic()) + 1.0)
    return box


def join_connects_at_exit(seconds: float = 5.0) -> None:
    """Wait (bounded) for store connects still retrying past their deadline: torch's retries
    overshoot its timeout by a second or more, and a thread coming back from C++ while the
    interpreter finalizes is ended inside a noexcept frame -- the process then aborted
    ("terminate called without an active exception", SIGABRT) after init() had raised its
    clear timeout (found by a helper: unroutable MASTER_ADDR, 3 runs in 4). A thread blocked
    for good (a server that never answers) is left: it never comes back."""
    end = time.monotonic() + seconds
    for done in list(_CONNECTING):
        done.wait(max(0.0, end - time.monotonic()))


def _refuse_second_rank0(dist: Any, addr: str, port: int, world: int) -> str:
    """Rank 0 found MASTER_PORT taken: when the store there is this job's, with rank 0 of
    this init already claimed, two processes were started as rank 0 -- raise the duplicate's
    ValueError, and post it so that the other rank 0 and everyone else stop at once (before,
    this one blamed another program for the port and the others waited out the connect
    timeout; found by a helper). Else returns who holds the port, for the caller's message:
    a store of another job (_another_job), or one that may be (its rank 0's settings did
    not come in time and one of the two has a launcher's job id) is left alone -- two
    launchers started on one port stopped each other, blaming a duplicate RANK (a helper)."""
    other = "by another program, or by a store this process still holds open"
    box = _build(dist, addr, port, False, 3.0, time.monotonic() + 3.0)
    if not box or isinstance(box[0], Exception):
        return other  # no store answers there
    store, seen, another = box[0], False, None
    with contextlib.suppress(Exception), _store_guard.deadline(store, 7.0):  # a frozen one
        claim = _world_prefix(store, _inits(store, create=False) + 1)  # the init to run here
        seen = _appears(store, claim + "claim/0", 2.0)  # claimed right after binding
        if seen:
            another = _another_job(store, claim, 2.0)
    if another or (seen and another is None and _env.run_id()):
        return (f"by another ringreduce job: its job id ({_env.RUN_ID_VARS}) differs"
                if another else
                "by another ringreduce job, or by this job's first rank 0")
    if seen:
        raise _store_wait.fail(store, claim, ValueError(
            f"rank 0 was claimed by 2 processes (a store of this job already serves "
            f"{addr}:{port}, and its rank 0 has joined); every process needs a distinct RANK "
            f"in [0, {world})"))
    return other


def _another_job(store: Any, prefix: str, timeout: float, rank: int | None = None
                 ) -> bool | None:
    """Whether the init under `prefix` is another job's: its rank 0 published (within
    `timeout`) another launcher's job id (_env.run_id) than this process's (or none). False
    without an id on either side (RANK/WORLD_SIZE set by hand). rank: this rank, waiting as
    init's ranks wait; else a poll, and None (unknown) when rank 0's settings did not come."""
    key = prefix + "cfg/0"
    if rank is not None:
        _wait(store, [key], timeout, rank, "rank 0 to publish its settings", prefix)
    elif not _appears(store, key, timeout):
        return None
    theirs = _job_settings.run_id_of(store.get(key).decode())
    return theirs != _env.run_id()


def _appears(store: Any, key: str, seconds: float, *or_keys: str) -> bool:
    """Whether `key` (or one of `or_keys`) is in the store within `seconds` (every 50 ms)."""
    end = time.monotonic() + seconds
    while not any(store.check([k]) for k in (key, *or_keys)):
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)
    return True


def _check_resolves(host: str, rank: int) -> None:
    """Fail at once on a MASTER_ADDR no resolver knows (torch's TCPStore retries it until
    the connect timeout, 120 s by default). Only a definite "no such name": a resolver that
    cannot answer now (EAI_AGAIN) is waited for, as before."""
    import socket

    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            bare = host[1:-1] if host.startswith("[") and host.endswith("]") else ""
            hint = (f"; write an IPv6 address without brackets ({bare!r}), as torch's "
                    f"TCPStore takes it" if bare else "")
            raise _rr_error(
                f"rank {rank}: {_env.origin('MASTER_ADDR')}={host!r} does not resolve on "
                f"this host ({e.strerror or e}); set MASTER_ADDR to rank 0's host name or IP "
                f"address{hint}") from None


def _is_old_server(key: tuple, store: Any, deadline: float) -> bool:
    """True when a client just reached the server of the previous init on this address,
    which rank 0 stops (release_store): it has that init's "bye" key, which a new server
    cannot have. Until rank 0 answers there, wait on this connection: "keep" -> False (it
    stays: use it); "close" -> say "acked" if this rank had not (rank 0 then stops it at
    once), True."""
    if key not in _CLOSED:
        return False
    prefix, acked = _CLOSED[key]
    try:
        if not store.check([prefix + "bye"]):
            return False
        while not store.check([prefix + "bye-ack"]):
            if time.monotonic() > deadline:
                return False  # rank 0 never answered: use it (its failure reads clearly)
            time.sleep(0.01)
        if bytes(store.get(prefix + "bye-ack")) == b"keep":
            return False
        if not acked:
            store.add(prefix + "acked", 1)
            _CLOSED[key] = (prefix, True)
        return True
    except RuntimeError:  # it closed under us: connect again
        return True


def store_key(store: Any) -> tuple | None:
    """The registry key of a store made by make_store, None for anyone else's store."""
    for key, s in _STORES.items():
        if s is store:
            return key
    return None


def linger(key: tuple | None) -> None:
    """Keep the reference of a failed init until the next init() or destroy()."""
    if key is not None:
        _LINGER.add(key)


def release_lingering(keep: tuple | None = None) -> None:
    """Drop what failed inits left (but `keep`, about to be adopted by make_store)."""
    for key in list(_LINGER - {keep}):
        _LINGER.discard(key)
        release_store(key, 0, 1, "", 0.0, farewell=False)


def release_store(key: tuple | None, rank: int, world: int, prefix: str, timeout: float,
                  farewell: bool = True, failed: bool = False, lost: int = -1) -> None:
    """Drop one reference taken by make_store(); the last one closes the store.

    Every rank of the init that used the store calls this at destroy (prefix: that init's
    key prefix). With `farewell`, rank 0 -- it hosts the server -- waits (at most `timeout`,
    capped at _FAREWELL_S, or _FAREWELL_FAILED_S when the communicator `failed`) until
    every rank said it is done with the store ("bye"), tells them whether the server stops
    ("close") or stays because something else in its process still holds the store
    ("keep": torch's default process group, another make_store caller), and waits until
    they read that ("acked") before it drops the server -- a store call that finds the
    server gone makes torch log a stack trace. After "close" the others' next make_store on
    that address refuses the old server (_is_old_server), so a re-init on the same
    MASTER_PORT cannot end up talking to it in its last moments.
    `lost`: a rank this rank's communicator found dead or frozen (-1: none); the first rank
    to report it says its goodbye for it (_proxy), so rank 0 does not wait out the cap.
    farewell=False just drops the reference. Never raises: the store has served its
    purpose, and a missing peer only costs the wait.
    """
    if key is None or key not in _REFS:
        return
    _REFS[key] -= 1
    store = _STORES[key]
    closing = False
    if _REFS[key] <= 0:
        del _STORES[key], _REFS[key]
        _IN_RANK0.discard(_server(store))
        # 2 references = `store` here + getrefcount's argument: no Python code holds it.
        if key in _MASTER and sys.getrefcount(store) > 2:
            gc.collect()  # a failed wait's traceback cycle: its frames hold the store
        closing = (key in _MASTER and sys.getrefcount(store) <= 2
                   and not _torch_holds(store))
        _MASTER.discard(key)
    if not farewell:
        return
    deadline = _farewell_deadline(timeout, failed)
    box = [store]
    del store
    words: list = []
    _talk_until(deadline, _farewell, box, rank, world, prefix, closing, deadline, words, lost)
    # Unless rank 0 said it keeps the server, make_store on this address must not use it
    # again: it stops when rank 0's farewell ends, also when this rank stopped waiting for
    # the answer first (a rank far behind), and a client still on it then fails.
    if rank != 0 and words != [b"keep"]:
        _CLOSED[key] = (prefix, words == [b"close"])


def _torch_holds(store: Any) -> bool:
    """True when torch's default process group was given `store` (wrapped in PrefixStores,
    which keep it alive from C++, invisible to sys.getrefcount)."""
    s = torch_default_store()
    while s is not None:
        if s is store:
            return True
        s = getattr(s, "underlying_store", None)
    return False


def torch_default_store() -> Any:
    """torch.distributed's store when a default process group exists (it already owns
    MASTER_PORT), else None. Our keys live under their own prefix."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.distributed_c10d._get_default_store()
    except (ImportError, RuntimeError, AttributeError):
        pass
    return None


def _wait(store: Any, keys: list[str], timeout: float, rank: int, what: str,
          prefix: str, hint: str | None = None,
          ranks: list[int] | None = None, name_keys: bool = True) -> None:
    """Wait for `keys`, polling, so that a rank that failed its own init checks (and said
    so under prefix + "failed") stops everyone at once instead of at the timeout; the
    timeout's message ends with `hint` (default:
    _env.same_launch_hint()). A store that fails meanwhile (its host, rank 0,
    exited) is a RingReduceError saying so, not torch's bare DistNetworkError. ranks: the
    world rank that writes each key, if known: a timeout missing one rank's keys names it
    (CollectiveTimeout's .peer_rank and .waiting_for, as a collective's). name_keys=False:
    the timeout's message does not list the missing keys and their ranks (`what` says)."""
    from ._C import RingReduceError

    rank = _speaker(rank)
    hint = _env.same_launch_hint() if hint is None else hint
    refuse_if_cut(rank, f"the wait for {what}", store)
    try:
        with _store_guard.deadline(store, timeout + _store_guard.MARGIN_S):
            _store_wait.poll_keys(store, keys, timeout, rank, what, prefix, hint, ranks, name_keys)
    except _store_guard.StoreSilent as e:
        raise silent_error(rank, f"the wait for {what}", store, e) from e
    except RingReduceError:
        raise  # ours (a timeout, another rank's failure): it says what happened
    except RuntimeError as e:  # torch's DistStoreError / DistNetworkError: the store is gone
        watch = _watch.watched()
        if watch is not None:  # because this rank's destroy() released it meanwhile?
            _watch.check_destroyed(watch[0], what)
        raise store_failed(rank, f"the wait for {what}", e, store) from e


def allgather(store: Any, prefix: str, rank: int, world: int, timeout: float, step: str,
              value: str) -> list[str]:
    """Every rank's `value` for `step`, in rank order, through the store (a socketless
    group's shared-memory setup: segment names, then two barriers)."""
    from ._C import RingReduceError

    p = f"{prefix}shm/{step}/"
    keys = [p + str(r) for r in range(world)]
    try:
        with store_used(rank, "a group's shared memory setup", store, timeout):
            store.set(p + str(rank), value)
            _store_keys.wrote(prefix, p + str(rank))
            _wait(store, keys, timeout, rank, f"all ranks to reach shared memory setup "
                  f"({step})", prefix)
            return [v.decode() for v in store.multi_get(keys)]
    except RingReduceError:
        raise  # ours (a timeout, another rank's failure): it says what happened
    except RuntimeError as e:  # torch's DistStoreError / DistNetworkError: the store is gone
        raise store_failed(rank, "a group's shared memory setup", e, store) from e


def exchange(store: Any, rank: int, world: int, my_addr: str, secret: str | None,
             timeout: float, my_hb: str = "", prefix: str | None = None,
             settings: str = "", ranks: list[int] | None = None) -> Peers:
    """Publish this rank's address and host; return everyone's, plus the job secret.
    prefix: the keys' prefix (a group's, unique in the job); default: this init's own.
    settings: this rank's job-wide knobs (_env.job_wide); init raises ValueError on every
    rank, naming the variable, if they differ (a group's are its world's). ranks: a
    group's world rank of each member, which a timeout names."""
    from ._C import RingReduceError

    during = "init" if prefix is None else "a group's creation"
    refuse_if_cut(rank, during, store)
    try:
        # Four waits of at most `timeout` each (rank 0's settings, the world size, the
        # secret, the addresses): a call stuck in torch's client past that.
        with _store_guard.deadline(store, 4 * timeout + _store_guard.MARGIN_S):
            return _exchange(store, rank, world, my_addr, secret, timeout, my_hb, prefix,
                             settings, ranks)
    except _store_guard.StoreSilent as e:
        raise silent_error(rank, during, store, e) from e
    except KeyboardInterrupt:
        # Ctrl-C on this rank only (a debugger, a signal to one pid): the others stop at
        # their next poll, not at the connect timeout. (A store that is gone: they find out.)
        # A group's creation says so itself, naming the group (groups._interrupts_told).
        if prefix is None:
            _store_wait.fail(store, _world_prefix(store), _rr_error(
                f"rank {rank} was interrupted (KeyboardInterrupt) during {during}"))
        raise
    except (ValueError, RingReduceError) as e:
        gone = getattr(e, "store_error", None)  # _wait's: say which phase it was
        if gone is not None:
            raise store_failed(rank, during, gone, store) from gone
        if rank == 0 and prefix is None:  # init: this process usually hosts the store and
            _linger(store, world)  # may exit next: let the others read "failed". A group's
        raise  # store is the world's, which outlives this error: nothing to wait for
    except RuntimeError as e:  # torch's DistStoreError / DistNetworkError: the store is gone
        raise store_failed(rank, during, e, store) from e


def fail_setup(store: Any, rank: int, world: int, prefix: str | None, error: Exception) -> None:
    """This rank failed before publishing its address (a bad setting): tell the others now,
    not at their connect timeout -- unless the store is another launched job's (on this
    MASTER_PORT by mistake) or a failure is told already. prefix: a group's; None: init's."""
    if prefix is None:
        _count_init(store)
    told = f"rank {rank} could not start: {error}"
    p = _world_prefix(store) if prefix is None else prefix
    with contextlib.suppress(Exception):  # the original error is what matters here
        if prefix is None and rank and _env.run_id() and _appears(
                store, p + "cfg/0", 2.0, p + "failed") and (
                store.check([p + "failed"]) or _another_job(store, p, 0.0)):
            return
        _store_wait.fail(store, p, (ValueError if isinstance(error, ValueError) else _rr_error)(told))
        if rank == 0 and prefix is None:  # this process may host the store and exit next
            _linger(store, world)


def _linger(store: Any, world: int, cap: float = 2.0) -> None:
    """Rank 0's init failed: before its process (the store's host) may exit, wait until
    every process has reached the store -- counted by claims, so two claiming one RANK
    count twice and the missing RANK is not waited for (at most `cap` s; a rank that starts
    slowly would otherwise find no store and only time out), then 0.5 s for them to read
    "failed"."""
    p = _world_prefix(store)

    def everyone_came() -> bool:  # as many claims as processes (a duplicate RANK too)
        return sum(int(store.add(p + f"claim/{r}", 0)) for r in range(world)) >= world

    with contextlib.suppress(Exception):  # the store failed too: only the pause is left
        _poll(everyone_came, Awake(cap))
    time.sleep(0.5)


def _first_line(e: Exception) -> str:
    """The first line of torch's error (its C++ ones go on with a stack trace), or its repr
    when it has no text."""
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


@contextlib.contextmanager
def store_used(rank: int, during: str, store: Any, seconds: float | None = None
               ) -> Iterator[None]:
    """Store calls inside, at most `seconds` (plus _store_guard.MARGIN_S) long: torch's
    DistError (the store went away) becomes store_failed's error, a store that stopped
    answering silent_error's; everything else (ours: a timeout, the fd-limit check) passes
    unchanged."""
    refuse_if_cut(rank, during, store)
    margin = _store_guard.MARGIN_S
    try:
        with _store_guard.deadline(store, None if seconds is None else seconds + margin):
            yield
    except _store_guard.StoreSilent as e:
        raise silent_error(rank, during, store, e) from e
    except _torch_store().DistError as e:
        raise store_failed(rank, during, e, store) from e


def _in_rank0(store: Any) -> bool:
    return store is not None and _server(store) in _IN_RANK0


def _note_rank0_serves(store: Any, serves: bool) -> None:
    """What a world's rank 0 said at init: whether its process serves `store`'s server --
    known for ringreduce's own store (make_store), told for torch's or the caller's (torch's
    env:// rank 0 serves it, torchrun's agent does): a store failing there means rank 0 is
    gone, a PeerFailure naming it (a RingReduceError on torch's store before: found by a
    helper)."""
    key = _server(store)
    if key != ("",):
        (_IN_RANK0.add if serves else _IN_RANK0.discard)(key)


def refuse_if_cut(rank: int, during: str, store: Any) -> None:
    """Raise silent_error's error, without a store call, if the watchdog cut this store's
    connection earlier: torch would fail at once too, but log a C++ stack trace first."""
    cut = _store_guard.cut_before(store)
    if cut is not None:
        raise silent_error(rank, during, store, cut, earlier=True)


def silent_error(rank: int, during: str, store: Any, e: _store_guard.StoreSilent,
                 earlier: bool = False) -> Exception:
    """The error for a store that did not answer until the deadline (see deadline). Served
    by world rank 0's process: a PeerFailure naming rank 0 as silent, as a frozen peer is
    named; else (a launcher's agent, torch's or the caller's store) a CollectiveTimeout."""
    rank = _speaker(rank)
    head = (f"rank {rank}: the rendezvous store did not answer for {e.seconds:.0f} s during "
            f"{during}") if not earlier else (
        f"rank {rank}: cannot use the rendezvous store during {during}: it did not answer "
        f"for {e.seconds:.0f} s earlier, and this process shut its connection then")
    if _in_rank0(store):
        from ._C import PeerFailure

        err = PeerFailure(f"{head}; rank 0's process serves it: rank 0 is frozen (stopped, "
                          f"in a debugger, swapping) or its host is unreachable")
        err.peer_rank, err.cause = 0, "silent"  # type: ignore[attr-defined]
        return err
    return _store_wait.timeout_error(
        f"{head} (port {e.port}); the process serving it -- the launcher's agent, or torch's "
        f"rank 0 -- is frozen (stopped, in a debugger, swapping) or its host is unreachable")


def store_failed(rank: int, during: str, e: Exception, store: Any = None) -> Exception:
    """The error for a store that stopped answering. One that world rank 0's process serves
    (not the launcher's agent's, not the caller's own) means rank 0 is gone: a PeerFailure
    naming it (peer_rank 0), as any other dead peer is named -- before, a RingReduceError
    that `except rr.PeerFailure` missed (found by a helper). A store whose connection the
    watchdog shut (an earlier call found it silent) is silent_error's, again."""
    cut = _store_guard.cut_before(store)
    if cut is not None:
        return silent_error(rank, during, store, cut, earlier=True)
    why = f"{type(e).__name__}: {_first_line(e)}"
    rank = _speaker(rank)
    if _in_rank0(store):
        from ._C import PeerFailure

        if _rank0_left():
            err = PeerFailure(
                f"rank {rank}: the rendezvous store failed during {during} ({why}); rank 0's "
                f"process serves it, and rank 0 left the job (destroy()) and exited: nothing "
                f"can be set up through the store after that -- create groups and "
                f"point-to-point channels before rank 0 calls destroy(), or let a launcher "
                f"host the store (torchrun, ringreduce.run)")
            err.peer_rank, err.cause = 0, "left"  # type: ignore[attr-defined]
        else:
            err = PeerFailure(f"rank {rank}: the rendezvous store failed during {during} "
                              f"({why}); rank 0's process serves it: rank 0 exited or crashed")
            err.peer_rank, err.cause = 0, "closed"  # type: ignore[attr-defined]
    else:
        err = _rr_error(
            f"rank {rank}: the rendezvous store failed during {during} ({why}); the store "
            f"lives in rank 0 (or the launcher's agent) -- did it exit or crash?")
    err.store_error = e  # type: ignore[attr-defined]
    return err


def _speaker(rank: int) -> int:
    """The rank a message names this process by: `rank` is its rank in what is being set
    up (a group's, a channel's); errors name world ranks, as every other message does."""
    w = _watch.watched()
    return rank if w is None else w[0].rank


def _rank0_left() -> bool:
    """Whether the world this thread watches (see watching) heard rank 0's goodbye."""
    from ._C import PeerFailure

    w = _watch.watched()
    comm = None if w is None else w[0].comm
    if comm is None or w[0].rank == 0:
        return False
    try:
        comm.probe_peers([0])
    except PeerFailure as e:
        return getattr(e, "peer_rank", None) == 0 and getattr(e, "cause", None) == "left"
    except RuntimeError:  # destroyed meanwhile
        pass
    return False


def _server(store: Any) -> tuple:
    """The TCPStore server `store` talks to, under any PrefixStores: (host, port); ("",)
    for other stores (FileStore, HashStore: told apart by their instance)."""
    s = _procnet.find_store(store, lambda s: isinstance(getattr(s, "port", None), int))
    return ("",) if s is None else (str(getattr(s, "host", "")), s.port)


def _inits(store: Any, create: bool = True) -> int:
    return _GENERATIONS.get((*_server(store), store_instance(store, create)), 0)


def _count_init(store: Any) -> None:
    _GENERATIONS[(*_server(store), store_instance(store))] = _inits(store) + 1


def _restart(store: Any) -> str:
    """The torchrun attempt whose keys this process's inits use: TORCHELASTIC_RESTART_COUNT
    on a store that outlives the attempt -- the agent's (TORCHELASTIC_USE_AGENT_STORE), which
    still holds the failed attempts' keys (as torch's own env:// rendezvous prefixes
    "/worker/attempt_N"), or a FileStore/HashStore the caller passes; "" on a TCPStore that
    is not the agent's (rank 0's, made again by each attempt), where agents' counts may
    differ (an agent restarting on a membership change keeps its count: torch issue 135712)
    -- found by a helper: two agents restarting at counts 0 and 1 on a fresh store waited
    for each other's keys."""
    if not _env.store_tunables().use_agent_store and _server(store) != ("",):
        return ""
    restart = _env.restart_count()
    return "" if restart in ("", "0") else restart


def _world_prefix(store: Any, generation: int | None = None) -> str:
    """Store keys of this process's latest init on `store`'s server. A torchrun restart
    starts fresh processes, counting inits from 1 again: on a store that outlives it they get
    the attempt's own prefix (before, every restarted rank found its rank "claimed by 2
    processes"), see _restart."""
    gen = _inits(store) if generation is None else generation
    restart = _restart(store)
    return f"ringreduce/{gen}{'-r' + restart if restart else ''}/"


def _claimed_twice(rank: int, n: int, world: int, init: bool) -> ValueError:
    """Rank `rank`'s claim was the n-th; init: a world's (else a group's or channel's)."""
    why = (f"rank {rank} was claimed by {n} processes; every process needs a distinct RANK "
           f"in [0, {world})")
    if init and not _env.run_id():  # hand-set variables: another job cannot be told apart
        why += " (or another job runs on this MASTER_PORT: give each job its own port)"
    if not init or not _env.run_id() or \
            not _env.store_tunables().use_agent_store:
        return ValueError(why)
    return ValueError(
        f"{why} -- or, under torchrun with several agents (--nnodes), an earlier attempt's "
        f"rank {rank} claimed it on the agent's store: this agent restarted its workers with "
        f"TORCHELASTIC_RESTART_COUNT={_env.restart_count()}, "
        f"which agents do not agree on when one restarts on a membership change (torch issue "
        f"135712; torch's gloo hangs there). Set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for "
        f"torchrun: each rendezvous round then gets a fresh store")


def _exchange(store: Any, rank: int, world: int, my_addr: str, secret: str | None,
              timeout: float, my_hb: str, prefix: str | None, settings: str = "",
              ranks: list[int] | None = None) -> Peers:
    if prefix is None:
        _count_init(store)
    p = _world_prefix(store) if prefix is None else prefix
    if prefix is None and rank != 0 and _another_job(store, p, timeout, rank):
        # Nothing claimed in it: before, a job started on this one's MASTER_PORT by mistake
        # (two launchers on one port) failed it, or ran in it as one of its ranks (a helper).
        # Only a note: the ranks waiting for this rank's address name it in their stall
        # report and timeout (a rank of theirs whose launcher set another job id, found by a
        # helper, left them a bare "missing addr/2" after 120 s).
        with contextlib.suppress(Exception):
            store.set(p + f"refused/{rank}", _env.run_id() or "(unset)")
        raise ValueError(
            f"rank {rank}: the store at MASTER_PORT serves another job (its job id is not "
            f"this rank's {_env.run_id() or '(unset)'}; ids come from {_env.RUN_ID_VARS}): "
            f"pick another MASTER_PORT for this job -- or, if that job is this one, its ranks' "
            f"job ids differ: set those variables alike for every rank")
    n = store.add(p + f"claim/{rank}", 1)
    _store_keys.wrote(p, p + f"claim/{rank}")
    if n > 1:
        raise _store_wait.fail(store, p, _claimed_twice(rank, n, world, prefix is None))
    if rank == 0:
        # Before "world" and its address, which the others wait for: the session is there
        # once those are.
        store.set(p + "session", secrets.token_hex(16))
        if prefix is None:
            store.set(p + "store0", "serves" if _procnet.serves(store) else "")
            _store_keys.wrote(p, p + "store0")
        store.set(p + "world", str(world))
        # "": rank 0 was given a secret (not published): a rank without one must not wait
        # (a group's members all have the world's).
        if secret is None or prefix is None:
            store.set(p + "secret", secrets.token_hex(32) if secret is None else "")
            _store_keys.wrote(p, p + "secret")
        _store_keys.wrote(p, p + "session", p + "world")
    if prefix is None:  # a group's size follows from its member list, agreed before
        _wait(store, [p + "world"], timeout, rank, "rank 0 to publish the world size", p)
        w0 = int(store.get(p + "world"))
        if w0 != world:
            raise _store_wait.fail(store, p, ValueError(
                f"rank 0 runs with WORLD_SIZE={w0} but rank {rank} with {world}; start every "
                f"rank with the same world size"))
    if secret is None:
        _wait(store, [p + "secret"], timeout, rank, "rank 0 to publish the job secret", p)
        secret = store.get(p + "secret").decode()
        if not secret:
            raise _store_wait.fail(store, p, ValueError(
                f"RINGREDUCE_SECRET (or init(secret=)) is set on rank 0 but not on rank "
                f"{rank}; it must be the same on every rank of a job: set it alike for all "
                f"of them, or for none (rank 0 then draws one)"))
    cfg = ("cfg",) if prefix is None else ()  # before addr/N, which the others wait for
    if cfg:  # a rank with another secret fails every handshake: say so before connecting
        settings = _job_settings.published(settings, secret)
    mine = [p + f"{k}/{rank}" for k in (*cfg, "addr", "host", "hb")]
    store.multi_set(mine, [*(settings for _ in cfg), my_addr, _env.host_identity(), my_hb])
    _store_keys.wrote(p, *mine)
    keys = [p + f"addr/{r}" for r in range(world)]
    what = "all ranks to publish their addresses" if prefix is None else (
        f"the {world} ranks of {prefix.rstrip('/')} (a group or point-to-point channel being "
        f"set up) to publish their addresses")
    hint = (f"{_env.same_launch_hint()} Ranks that start slowly need a longer "
            "RINGREDUCE_CONNECT_TIMEOUT") if prefix is None else (
        "addr/N: the member of group rank N; did every member call new_group (or the matching "
        "send/recv), in the same order?")
    _wait(store, keys, timeout, rank, what, p, hint,
          ranks=list(range(world)) if prefix is None else ranks)
    got = [v.decode() for v in store.multi_get(
        [*keys, *(p + f"{k}/{r}" for k in ("host", "hb", *cfg) for r in range(world)),
         *(p + "store0" for _ in cfg), p + "session"])]
    if cfg:
        _store_wait.alike(store, p, world, _job_settings.check_same, got[3 * world:4 * world], rank)
        _note_rank0_serves(store, rank != 0 and got[4 * world] == "serves")
    return Peers(addrs=got[:world], hosts=got[world:2 * world], secret=secret, prefix=p,
                 hb_addrs=got[2 * world:3 * world], session=got[-1])
