"""Waiting for keys in the job's store (a world's or group's set-up, a point-to-point
channel's first message) and posting why a rank gives up, so the others stop waiting at
once: every wait polls for the failure keys other ranks may post, probes the peers this
thread watches (ringreduce._watch), logs once after RINGREDUCE_STALL_WARN who it still
waits for and what they were doing, and at its timeout names the ranks whose keys are
missing. ringreduce._rendezvous._wait wraps poll_keys with the store's own deadline."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any

from . import _blame, _env, _procnet, _store_guard, _store_keys, _watch
from ._awake import Awake
from ._farewell import _poll
from ._watch import rr_error

log = logging.getLogger("ringreduce")


def timeout_error(msg: str) -> Exception:
    from ._C import CollectiveTimeout
    return CollectiveTimeout(msg)


def posted_key(store: Any, stops: list, within: float = 0.0) -> str | None:
    """The first of `stops` under which another rank posted why it failed, looking for up to
    `within` seconds (None: none)."""
    end = time.monotonic() + within
    while True:
        stop = next((k for k in stops if store.check([k]) and not _watch.passed_over(store, k)),
                    None)
        if stop is not None or time.monotonic() >= end:
            return stop
        time.sleep(0.02)


def raise_posted(store: Any, stops: list, rank: int, what: str, post_under: str = "") -> None:
    """Raise the failure another rank posted under one of `stops`, if any (and post it under
    `post_under` too, if given: for the ranks waiting there)."""
    stop = posted_key(store, stops)
    if stop is None:
        return
    # Made by a helper: an error held in a local of the frame raising it is a reference
    # cycle (error -> traceback -> frame -> error) that keeps every frame's locals -- a
    # failed group's listener and store connection -- until the cyclic GC runs (found
    # by a helper: 3 sockets per failed new_group() after destroy()).
    err = posted_error(store.get(stop).decode(), rank, what)
    try:
        raise fail(store, post_under, err) if post_under else err
    finally:
        del err


def posted_error(posted: str, rank: int, what: str) -> Exception:
    """The error for a failure another rank posted (fail()): its class, the rank it named
    (.peer_rank) and, for a lost rank, how it was lost (.cause) and the rank that found it
    (.relayed_by), as a PeerFailure relayed through a connection has them."""
    head, _, msg = posted.partition("\n")
    kind, *fields = head.split(" ")
    msg = f"rank {rank}: stopped waiting for {what} because another rank failed: {msg}"
    err = ValueError(msg) if kind == "ValueError" else (  # bad settings: the same class
        timeout_error(msg) if kind == "CollectiveTimeout" else
        _peer_failure(msg) if kind == "PeerFailure" else rr_error(msg))  # a lost rank too
    for f in fields:
        name, _, value = f.rpartition("=")
        if value.isdigit() and name in ("", "by"):  # "": the rank the poster's error named
            setattr(err, "relayed_by" if name else "peer_rank", int(value))
        elif name == "cause" and kind == "PeerFailure":
            err.cause = value  # type: ignore[attr-defined]
    setattr(err, _blame.SECONDARY, True)  # the launcher blames the rank that posted it
    return err


def _peer_failure(msg: str) -> Exception:
    from ._C import PeerFailure
    return PeerFailure(msg)


# A store call this slow may mean its host was stopped meanwhile; the next liveness probe
# then waits this long for the heartbeats of a host that is back.
_SLOW_STORE_S = 1.0
_RESUMED_GRACE_S = 1.0


def poll_keys(store: Any, keys: list[str], timeout: float, rank: int, what: str,
              prefix: str, hint: str, ranks: list[int] | None, name_keys: bool) -> None:
    from ._C import PeerFailure

    t0 = time.monotonic()
    deadline = t0 + timeout
    pause = 0.001
    stops = [prefix + "failed", *_watch.also_keys()]
    watch = _watch.watched()
    probe_at = t0 + 0.05
    warn_at = t0 + (_stall_warn() or math.inf)
    graced = False  # a grace since the last probe
    while True:
        asked = time.monotonic()
        if store.check(keys):
            break
        if time.monotonic() - asked >= _SLOW_STORE_S and not graced:
            # The store's host did not answer for a while (stopped -- a debugger, a suspended
            # job -- or overloaded) and now did: if it was stopped, it runs again and its
            # heartbeats are on their way. Probed at once, it was named silent for its
            # pause, after it was back (found by a helper, ~1 in 6 over TCP). Once per
            # probe: a store slow at every call must not put the probes off for good.
            probe_at = max(probe_at, time.monotonic() + _RESUMED_GRACE_S)
            graced = True
        raise_posted(store, stops, rank, what)
        if time.monotonic() >= warn_at:
            warn_at = math.inf
            _warn_stalled(store, keys, ranks, rank, what, hint, t0, deadline, watch, prefix)
        if watch is not None and time.monotonic() >= probe_at:
            try:
                _watch.probe(watch[0], watch[1], what)  # checks destroy() too
            except PeerFailure as e:
                # A rank that failed here posts why, then leaves: say why, not that it left.
                raise_posted(store, stops, rank, what)
                # This rank gives up: say so to the others waiting here, whose peers may all
                # be alive (a channel's other end, told that this rank's world lost a rank,
                # waited for its addresses until the connect timeout: found by a helper at
                # 32 ranks).
                raise fail(store, prefix, e, watch[0].rank) from None  # world rank: the finder
            probe_at = time.monotonic() + 0.1
            graced = False
        elif watch is not None:
            _watch.check_destroyed(watch[0], what)
        if time.monotonic() > deadline:
            gone = _missing(store, keys)
            missing = [keys[i] for i in gone]
            named = ", ".join(k.rsplit("/", 2)[-2] + "/" + k.rsplit("/", 1)[-1]
                              for k in missing[:8]) + (" ..." if len(missing) > 8 else "")
            secs = f"{timeout:.0f}" if timeout >= 10 else f"{timeout:.2g}"  # not "0 s"
            err = timeout_error(f"rank {rank}: timed out after {secs} s waiting for "
                                 f"{what}{': missing ' + named if name_keys else ''} ({hint})"
                                 f"{refused(store, prefix, ranks, gone)}")
            late = {ranks[i] for i in gone} if ranks is not None else set()
            if name_keys and late and ranks != list(range(len(keys))):  # a group's: say who
                err = timeout_error(f"{err} (world rank(s) {', '.join(map(str, sorted(late)))})")
            if len(late) == 1:  # the chain ends at the one rank that never wrote
                err.peer_rank = err.waiting_for = late.pop()  # type: ignore[attr-defined]
            raise fail(store, prefix, err)
        time.sleep(pause)
        pause = min(pause * 1.25, 0.1)  # late by at most a quarter of the wait (or 0.1 s)


def refused(store: Any, prefix: str, ranks: list[int] | None, gone: list[int]) -> str:
    """"; rank 2 came with job id 'b' and left, ..." for late ranks a process claimed with
    another launcher's job id (_rendezvous._exchange's note), else ""."""
    said = []
    for r in ([ranks[i] for i in gone] if ranks is not None else [])[:8]:
        with contextlib.suppress(Exception):
            if store.check([f"{prefix}refused/{r}"]):
                said.append(f"rank {r} came with job id "
                            f"{store.get(f'{prefix}refused/{r}').decode()!r}")
    if not said:
        return ""
    return (f"; {', '.join(said)} and left, as this job's id is {_env.run_id() or '(unset)'!r} "
            f"(from {_env.RUN_ID_VARS}): set those alike for every rank of the job (or, if "
            f"another job runs on this MASTER_PORT, give each job its own)")


def _missing(store: Any, keys: list[str]) -> list[int]:
    """Indices of `keys` not set yet (the timeout's and the stall report's late ranks)."""
    return [i for i, k in enumerate(keys) if not store.check([k])]


def _stall_warn() -> float:
    try:
        return float(_env.tunables().stall_warn or 0.0)
    except ValueError:  # a bad setting: init said so already
        return 0.0


def _warn_stalled(store: Any, keys: list[str], ranks: list[int] | None, rank: int, what: str,
                  hint: str, t0: float, deadline: float, watch: tuple | None,
                  prefix: str) -> None:
    """Log once, as a collective's stall report does, that this wait goes on: the world
    ranks it still waits for and -- one rank that the world's heartbeats know -- what that
    rank was doing (busy in another call: the program's calls do not meet)."""
    gone = _missing(store, keys) if ranks is not None else []
    late = sorted({ranks[i] for i in gone})
    who = f"; not there yet: world rank(s) {', '.join(map(str, late[:8]))}" \
        f"{' ...' if len(late) > 8 else ''}" if late else ""
    seen = ""
    comm = watch[0].comm if watch is not None else None
    if comm is not None and len(late) == 1:
        with contextlib.suppress(Exception):  # destroyed meanwhile: the wait says so next
            seen = comm.peer_context(late[0])
    now = time.monotonic()
    note = refused(store, prefix, ranks, gone)
    log.warning("stall: rank %d has waited %.0f s for %s%s%s (%s)%s; it gives up in %.0f s",
                rank, now - t0, what, who, seen, hint, note, max(0.0, deadline - now))


def alike(store: Any, prefix: str, world: int, check: Any, *args: Any) -> None:
    """check(*args), which raises the same ValueError on each of the `world` ranks (all read
    one table): before it is raised, every rank has read the table (or 2 s passed) -- rank
    0's process may host the store, and a rank still reading when it ended said "rank 0
    exited or crashed" (CI: a loopback listener refused)."""
    try:
        check(*args)
    except ValueError:
        key = prefix + "refused_alike"
        with contextlib.suppress(Exception):  # the store failed: the error is what matters
            store.add(key, 1)
            _poll(lambda: int(store.add(key, 0)) >= world, Awake(2.0))
        raise


def fail(store: Any, prefix: str, error: Exception, speaker: int | None = None) -> Exception:
    """Tell the other ranks why this one gives up (they stop waiting at their next poll)
    and which rank is to blame (their .peer_rank): the one its error names, else -- unless
    it timed out waiting for others -- the speaker: this rank, named at the message's start
    unless the message names it there already. A cause posted already is kept: ranks
    failing on its account would overwrite the first."""
    named = _blame.named_rank(error)
    if named is None and not isinstance(error, TimeoutError):  # CollectiveTimeout is one
        named = speaker
    head = type(error).__name__ + ("" if named is None else f" {named}")
    cause = getattr(error, "cause", None)
    if named is not None and named != speaker and isinstance(cause, str) and cause.isalnum():
        # A lost rank: how, and who found it (the rank that told this one, else this one)
        found = getattr(error, "relayed_by", None)
        found = found if isinstance(found, int) and found >= 0 else speaker
        head += f" cause={cause}" + ("" if found is None else f" by={found}")
    text = str(error)
    if speaker is not None and not text.startswith(
            tuple(f"{w}rank {speaker}{c}" for w in ("", "world ") for c in (" ", ":"))):
        text = f"rank {speaker}: {text}"
    try:
        # Else torch would log a C++ trace, then fail (a cut or closed connection).
        if not _store_guard.was_cut(store) and not _procnet.server_closed(store):
            _store_keys.publish_once(store, prefix + "failed", f"{head}\n{text}")
    except RuntimeError:
        pass  # the store is gone: the others will find out themselves
    return error


def fail_bounded(store: Any, prefix: str, error: Exception, speaker: int,
                 seconds: float = 5.0) -> None:
    """fail(), best effort, giving up after `seconds` on a store that stopped answering."""
    with contextlib.suppress(Exception), _store_guard.deadline(store, seconds):
        fail(store, prefix, error, speaker)
