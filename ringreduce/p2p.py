"""Point-to-point: send / recv / isend / irecv between two ranks, with tags.

Messages from one rank to another with one tag in one group (the world, a ringreduce group,
a torch process group) travel on their own channel -- messages of different groups never
match, as in MPI and torch: a two-rank communicator used in one direction only, made the
first time the two ranks talk with that tag in that group (both directions at once, so two
ranks that both send first still meet) and kept until destroy(). Each channel has its own connection, shared memory when the ranks share a host,
and its own worker thread, so any number of isend/irecv may be outstanding at once and a
ring exchange or a 1F1B pipeline schedule cannot deadlock on ordering between channels.
Within a channel messages arrive in the order they were sent (MPI's non-overtaking rule);
sender and receiver must agree on the size and dtype (a mismatch raises
CollectiveMismatch on both; on a sender whose send returned early, at its next call on that
channel). `src`/`dst` are world ranks, as in torch.

A blocking send of at most EAGER_MAX bytes returns before the receiver posts, also as the
first message on its tag: it is copied and sent by a helper thread, which makes the channel
(destroy() waits for it). Any other first operation on a tag waits until the other side
posts its first operation toward this rank with that tag (both rendezvous through the job's
store), at most RINGREDUCE_TIMEOUT, as any wait for a peer; then a CollectiveTimeout says
which operation the peer has not posted. Posts made while their channel is being made are
queued on it in the order they were posted (_Turns).

Receiving from any source (`src=None`, MPI_ANY_SOURCE, torch's `dist.recv(t)`): the
receiver probes the channels toward it on that tag -- a message waits when the sender has
started its side (its shared-memory line is ahead, or its frame is in the socket) -- and
makes the channels other ranks are waiting to make (each rank marks in the store which
channels it is making). It takes the first message it finds, trying peers in turn from the
one after the last match (no sender starves); channels with a receive already posted are
skipped, so named receives keep their messages and two any-source receives never take the
same one. Waits spin briefly, then sleep up to 1 ms between probes, until RINGREDUCE_TIMEOUT.
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import time
import traceback
from typing import Any

from . import _C, _blame, _buffers, _rendezvous, _state, _store_guard, _store_wait, _watch, groups
from ._state import Group

log = logging.getLogger("ringreduce")
_LOCK = threading.Lock()  # guards Group.p2p and Group.p2p_locks (never held while connecting)
# Keyed by the group's id() first: channels, and so messages, are per group.
_PENDING: dict = {}  # (group, src, dst, tag) -> _Turns of the posts waiting for their channel
_MEETS = itertools.count()  # each _meet's own store prefix (a timeout there stops no one else)


def send(x: Any, dst: int, tag: int = 0, group: Any = None) -> None:
    """Send `x` to world rank `dst` (blocks until `x` may be reused)."""
    _post(x, dst, tag, group, "send", sending=True, async_op=False)


def recv(x: Any, src: int | None = None, tag: int = 0, group: Any = None) -> int:
    """Receive into `x` (same size and dtype as sent) from world rank `src`, or from
    whichever rank of `group` sends first when `src` is None; returns the sender's world
    rank."""
    if src is None:
        return _recv_any(x, tag, group, "recv", async_op=False)
    _post(x, src, tag, group, "recv", sending=False, async_op=False)
    return operator.index(src)


def isend(x: Any, dst: int, tag: int = 0, group: Any = None) -> Any:
    """Start sending `x` to `dst`; returns a Work (do not modify `x` until it completes).
    A Work never waited for is still completed by destroy() (and at exit), as a send that
    returned early is."""
    return _unwaited(_post(x, dst, tag, group, "isend", sending=True, async_op=True), dst, tag,
                     group)


def irecv(x: Any, src: int | None = None, tag: int = 0, group: Any = None) -> Any:
    """Start receiving into `x` from `src` (None: from any rank of `group`); returns a
    Work (read `x` after wait(); `Work.source_rank()` names the sender)."""
    if src is None:
        return _recv_any(x, tag, group, "irecv", async_op=True)
    w = _post(x, src, tag, group, "irecv", sending=False, async_op=True)
    w.source = operator.index(src)
    return w


def send_buffered(x: Any, dst: int, tag: int = 0, group: Any = None) -> Any:
    """torch's dist.send / dist.isend: isend(), except that a message of at most
    EAGER_MAX bytes on a channel not made yet is copied and sent from a helper thread
    (None is returned: the send is complete for the caller), as send() does."""
    return _unwaited(_post(x, dst, tag, group, "isend", sending=True, async_op=True,
                           eager=True), dst, tag, group)


# A blocking send of at most this many bytes returns before the receiver posts, also as the
# first message on its channel (copied, then sent by a helper thread while the channel is
# made): the channel's own eager limit (shared-memory slots), so that first and later sends
# behave alike and a ring of blocking sends-before-receives works from its first message.
EAGER_MAX: int = _C.P2P_EAGER_BYTES


class _Turns:
    """The posts on one direction's channel (src, dst, tag) while it is being made, or the
    any-source receives on a tag (_any_entry), in the order they were posted: each takes a
    ticket and is queued in turn, so messages never overtake each other (MPI's
    non-overtaking rule) however the helper threads that post them are scheduled. Every
    method runs under _LOCK."""

    __slots__ = ("cond", "dropped", "next", "serving")

    def __init__(self) -> None:
        self.next = 0  # tickets handed out
        self.serving = 0  # tickets queued on the channel (or failed)
        self.dropped: set[int] = set()  # tickets whose post never started (_pass_turn)
        self.cond = threading.Condition(_LOCK)

    def take(self) -> int:
        """A new ticket."""
        self.next += 1
        return self.next - 1

    def await_turn(self, ticket: int) -> None:
        while self.serving != ticket:
            self.cond.wait()

    def advance(self, dropped: int = -1) -> bool:
        """The ticket being served is done (or ticket `dropped` will never come); wake the
        next. True when no ticket is left."""
        if dropped < 0:
            self.serving += 1
        else:
            self.dropped.add(dropped)
        while self.serving in self.dropped:
            self.dropped.discard(self.serving)
            self.serving += 1
        self.cond.notify_all()
        return self.serving == self.next


def _pass_turn(g: Group, world: Group, key: tuple, turns: _Turns, dropped: int = -1) -> None:
    """The ticket being served is done (or ticket `dropped` will never post): pass the
    dropped ones, wake the next; when none is left, the key's entry goes and a tag-0
    channel may take the fast path."""
    with _LOCK:
        drained = turns.advance(dropped)
        if drained:
            del _PENDING[key]
    if drained and key[3] == 0:
        _fast_path(g, world, min(key[1:3]), max(key[1:3]))


def _post(x: Any, peer: int, tag: int, group: Any, what: str, sending: bool,
          async_op: bool, eager: bool = False) -> Any:
    from . import api

    g = _state.resolve(group, f"{what}()")
    world = _state.current(f"{what}()")
    _state.check_aborted(world, f"{what}()")
    name = "dst" if sending else "src"
    g.group_rank(peer, f"{what} {name}")  # an int, and a member of the group
    peer = _state.as_rank(peer, f"{what} {name}")
    if peer == world.rank:
        raise ValueError(f"{what}: {name}={peer} is this rank; "
                         f"{'send to' if sending else 'receive from'} another rank")
    tag = _check_tag(tag, what)
    src = world.rank if sending else peer
    dst = peer if sending else world.rank
    key = (id(g), src, dst, tag)
    with _LOCK:
        ch = _ready_locked(g, src, dst, tag)
        queued = key in _PENDING
        failed = g.p2p_failed.get((min(src, dst), max(src, dst), tag))
    if failed is not None:  # now, also for a send that would return early
        raise _failed_before(g, world, src, dst, tag, failed)
    if ch is not None and not queued:
        return _on_channel(x, src, async_op, ch, what)
    # The channel is being made (or posts still wait for it): bad input fails now, before
    # the first connect (broadcast checks it later); then queue in turn.
    buf = _buffers.as_buffer(x, f"{what}(x)", writable=not sending)
    # A peer the world knows dead (closed) fails the call here, before a send
    # returns early: else only a log line said so, later (found by a helper).
    _watch.probe(world, [peer], f"{what} {'to' if sending else 'from'} rank {peer} on tag {tag}",
                 named_only=True)
    eager = sending and (eager or not async_op) and _nbytes(buf.obj) <= EAGER_MAX
    if eager:
        x = _copy(x)  # the caller may reuse its buffer as soon as this returns
    with _LOCK:
        ch = _ready_locked(g, src, dst, tag)
        turns = _PENDING.get(key)
        if ch is None or turns is not None:
            turns = _PENDING.setdefault(key, _Turns())
            ticket = turns.take()
    if turns is None:  # made and drained meanwhile
        return _on_channel(x, src, async_op, ch, what)

    def start() -> Any:
        def post(c: Group) -> Any:
            return api.broadcast(x, src=src, async_op=async_op or eager, group=c)
        return _take_turn(g, world, key, turns, ticket, post, ch)

    if not async_op and not eager:
        return start()  # holds its turn until it is done
    # isend/irecv (and an eager send) return at once and make the channel on a helper
    # thread: the peer may be blocked making another channel to us first (another tag, the
    # other direction's first send).
    try:
        if eager:
            _send_later(world, g, start, dst, tag)
            return None
        return api.Work(_Deferred(start), (x,))
    except _store_guard.NoThread:
        # Its ticket is dropped: later posts on the key go on (they waited for it without
        # end: found by a review).
        _pass_turn(g, world, key, turns, dropped=ticket)
        raise


def _take_turn(g: Group, world: Group, key: tuple, turns: _Turns, ticket: int, post: Any,
               ch: Group | None = None) -> Any:
    """Make the channel (if `ch` is None), wait for `ticket`'s turn, post on it; the next
    ticket's turn comes when this one is posted (an async post: queued) or has failed."""
    err: BaseException | None = None
    try:
        if ch is None:
            ch = _channel(g, world, *key[1:])
    except BaseException as e:  # noqa: BLE001 - raised in turn below
        err = e
    with _LOCK:
        turns.await_turn(ticket)
    try:
        if err is not None:
            raise err
        return post(ch)
    finally:
        err = None  # no cycle error -> traceback -> this frame (see _store_wait.posted_error)
        _pass_turn(g, world, key, turns)


def _send_later(world: Group, g: Group, start: Any, dst: int, tag: int) -> None:
    """Run an eager send on a helper thread; destroy() and g.destroy() wait for it
    (_state.Group.eager).
    A failure is logged here (the channel is failed, so the next call on it raises too)."""
    site = _C.call_site_id()

    def run() -> None:
        _C.pin_call_site(site)
        try:
            start().wait()
        except Exception as e:  # noqa: BLE001 - reported, and again by the channel's next call
            log.error("rank %d: a send to rank %d on tag %d, which returned before rank %d "
                      "posted its receive, failed: %s", world.rank, dst, tag, dst, e)

    t = threading.Thread(target=run, name="ringreduce-p2p-eager", daemon=True)
    _outstanding(world, t, dst, tag, g)
    try:
        _store_guard.start(t, f"the thread that sends a message to rank {dst} on tag {tag}")
    except _store_guard.NoThread:
        with _state.EAGER_LOCK:
            world.eager[:] = [w for w in world.eager if w[0] is not t]
        raise


def _outstanding(world: Group, waiter: Any, dst: int, tag: int, g: Group) -> None:
    """Keep `waiter` (is_alive / join: a send's thread, or an unwaited isend) for destroy()
    and g.destroy(), which complete it (_state.Group.eager); drops the finished ones."""
    with _state.EAGER_LOCK:  # (a thread not started yet is kept: its start is next)
        world.eager[:] = [e for e in world.eager if e[0].is_alive() or _state.unstarted(e[0])]
        world.eager.append((waiter, dst, tag, g))


class _Unwaited:
    """An isend's Work as destroy() waits for it, like an early-returned send's thread
    (is_alive / join); a failure nobody waited for is logged then."""

    __slots__ = ("work",)

    def __init__(self, work: Any):
        self.work = work

    def is_alive(self) -> bool:
        return not self.work.is_completed()

    def join(self, timeout: float) -> None:
        try:
            self.work.wait(timeout)
        except Exception as e:  # noqa: BLE001 - the owner never waited: say it here
            log.error("a send started with isend() and never waited for failed: %s", e)
            self.work = _DONE


class _Done:
    @staticmethod
    def is_completed() -> bool:
        return True


_DONE = _Done()


def _unwaited(w: Any, dst: int, tag: int, group: Any) -> Any:
    """Register isend's Work `w` on `group` with the world, whose destroy() (and the
    group's) completes it."""
    if w is not None:
        _outstanding(_state._DEFAULT[0], _Unwaited(w), dst, tag, _state.resolve(group, "isend()"))
    return w


def _nbytes(x: Any) -> int:
    return int(x.nbytes)  # numpy arrays and torch tensors alike


def _copy(x: Any) -> Any:
    return x.detach().clone() if hasattr(x, "detach") else x.copy()


def _on_channel(x: Any, src: int, async_op: bool, ch: Group, what: str) -> Any:
    """The message on its ready channel (a broadcast from `src`); bad input's error names
    the call the user made (`send(x): ...`), not the broadcast that carries it."""
    from . import api

    try:
        return api.broadcast(x, src=src, async_op=async_op, group=ch)
    except (ValueError, TypeError) as e:
        text = str(e)
        if not text.startswith("broadcast(x): "):
            raise
        raise type(e)(f"{what}(x): {text[len('broadcast(x): '):]}") from None


def _check_tag(tag: Any, what: str) -> int:
    """The tag as an int (numpy ints too, not floats or bools)."""
    try:
        t = operator.index(tag)
    except TypeError:
        t = -1
    if isinstance(tag, bool) or not 0 <= t < 2**31:
        raise ValueError(f"{what}: tag must be an int in [0, 2**31), got {tag!r}")
    return t


def _recv_any(x: Any, tag: int, group: Any, what: str, async_op: bool) -> Any:
    from . import api

    g = _state.resolve(group, f"{what}()")
    world = _state.current(f"{what}()")
    _state.check_aborted(world, f"{what}()")
    tag = _check_tag(tag, what)
    buf = _buffers.as_buffer(x, f"{what}(x)", writable=True)  # bad input fails before any wait
    if buf.count == 0:  # found by a helper: it waited for the timeout, then blamed
        raise ValueError(f"{what}(src=None): x has no elements; a zero-size message is not "
                         f"sent (zero-size buffers are no-ops), so no sender can be found for "
                         f"it -- name src, or send at least one element")
    peers = [r for r in (g.ranks or range(g.size)) if r != world.rank]
    if not peers:
        raise ValueError(f"{what}: src=None receives from another rank of the group, and "
                         f"{g.name} has no other rank")

    entry = _any_entry(g, tag)
    turns = entry[0]
    with _LOCK:
        ticket = turns.take()

    def start(box: list) -> Any:  # posts the receive; box gets the sender's rank
        served = False
        try:
            with _LOCK:
                turns.await_turn(ticket)
            served = True
            src, ch = _match(g, world, peers, tag, what, entry)
            box.append(src)
            return api.broadcast(x, src=src, async_op=True, group=ch)
        finally:
            with _LOCK:
                turns.advance(-1 if served else ticket)

    box: list = []
    if not async_op:
        # Posted asynchronously even here: the channel must look busy to other threads'
        # matches the moment it is chosen (the turn is held until then).
        start(box).wait()
        return box[0]
    try:
        w = api.Work(_Deferred(lambda: start(box)), (x,))
    except _store_guard.NoThread:
        with _LOCK:
            turns.advance(ticket)  # later posts go on
        raise
    w.source = lambda: box[0]
    return w


def _any_entry(g: Group, tag: int) -> list:
    """[turns, next peer index] of `tag`'s any-source receives. Each takes a ticket as it is
    posted and matches in its turn, so a sender's messages fill them in posting order (MPI's
    non-overtaking rule; before, the posts' helper threads raced for a lock, and messages
    landed swapped or in a buffer of the wrong size: found by a helper), and a match and the
    posting of its receive (which makes the channel busy) happen in one turn, so two posts
    never take the same message."""
    with _LOCK:
        return g.p2p_locks.setdefault(("any", tag), [_Turns(), 0])


def _match(g: Group, world: Group, peers: list[int], tag: int, what: str,
           entry: list) -> tuple:
    """The first rank of `peers` (from entry[1] on) whose message on `tag` waits for this
    rank, and its channel. Its store reads (_wanted) end at the receive's deadline (one
    watchdog arming for the whole wait, not one per read)."""
    try:
        with _rendezvous.store_used(world.rank, f"a receive from any rank (tag {tag})",
                                    g.store, _deadline(g, world)[0]), _watch.while_alive(g):
            return _poll_peers(g, world, peers, tag, what, entry)
    except KeyboardInterrupt as e:  # noted as a named receive's interruption is
        if hasattr(e, "add_note"):  # Python >= 3.11
            e.add_note(f"ringreduce: interrupted: rank {world.rank} during {what}(src=None, "
                       f"tag={tag}) on {g.name}, waiting for a message from any of {peers}")
        raise


def _poll_peers(g: Group, world: Group, peers: list[int], tag: int, what: str,
                entry: list) -> tuple:
    timeout, which = _deadline(g, world)
    t0 = time.monotonic()
    store_at, store_every, naps, probe_at = t0, 0.001, 0, t0 + 0.05
    asked = list(peers)  # senders not known to have left the job (their liveness is checked)
    all_left_at = None  # when `asked` became empty
    while True:
        now = time.monotonic()
        # destroyed on another thread (g: see _match): before g.store is used
        _watch.check_destroyed(world, f"{what}(src=None, tag={tag})")
        if now >= probe_at and asked:  # a dead or frozen sender: PeerFailure, not the
            # timeout (one that left the job is no failure: another may still send)
            gone = _watch.probe(world, asked, f"{what}(src=None, tag={tag})", any_of=True)
            if gone is not None:
                asked.remove(gone)
                all_left_at = now if not asked else None
            probe_at = now + (0 if gone is not None else 0.1)
        look_in_store = now >= store_at
        n = len(peers)
        for i in range(n):
            src = peers[(entry[1] + i) % n]
            with _LOCK:
                if (id(g), src, world.rank, tag) in _PENDING:
                    continue  # a named irecv posted earlier is about to take it
            ch = _ready(g, src, world.rank, tag)
            if ch is None:
                if not look_in_store or not _wanted(g, world, src, tag):
                    continue
                ch = _channel(g, world, src, world.rank, tag)  # src is making it now
            if ch.comm.incoming(0 if src < world.rank else 1):
                entry[1] = (entry[1] + i + 1) % n
                return src, ch
        if look_in_store:  # one store read per peer without a channel: back off
            store_every = min(store_every * 2, 0.05)
            store_at = now + store_every
        if all_left_at is not None and now - all_left_at > 0.5 and look_in_store:
            # every sender left, and no message waits (above, its store too; a channel busy
            # with an earlier receive, or data on another socket than the goodbye, get half
            # a second): none will come -- before, it waited for RINGREDUCE_TIMEOUT and then
            # said only that nobody sent (found by a helper)
            from ._C import PeerFailure

            raise _all_left(PeerFailure(
                f"rank {world.rank}: {what}(src=None, tag={tag}): every rank it could receive "
                f"from ({', '.join(map(str, peers))}) left the job (destroy(), or its program "
                f"ended) without a message for it; nothing more can arrive"), peers)
        if now - t0 > timeout:
            from ._C import CollectiveTimeout

            raise CollectiveTimeout(
                f"{what}(src=None, tag={tag}): no rank of {peers} sent this rank a "
                f"message within {timeout:g} s ({which})")
        naps += 1
        time.sleep(0 if naps < 100 else min(1e-3, 1e-5 * (naps - 99)))


def _all_left(err: Exception, peers: list[int]) -> Exception:
    """`err` with the attributes of a PeerFailure for `peers` leaving (made here: an error
    held in the raising frame's locals would be a reference cycle through its traceback)."""
    err.peer_rank = peers[0] if len(peers) == 1 else None  # type: ignore[attr-defined]
    err.cause = "left"  # type: ignore[attr-defined]
    return err


def _wanted(g: Group, world: Group, src: int, tag: int) -> bool:
    lo, hi = min(src, world.rank), max(src, world.rank)
    store = g.store  # None: destroyed meanwhile (the caller's next check says so)
    with _rendezvous.store_used(world.rank, f"a receive from any rank (tag {tag})", store):
        return store is not None and bool(store.check([f"{_base(g, lo, hi, tag)}want{src}"]))


def _base(g: Group, lo: int, hi: int, tag: int) -> str:
    """The channel's keys in `g.store`: under the group's own prefix (a torch process group's
    store is its own PrefixStore), so every group has its own channels."""
    return f"{g.store_prefix}p2p/{lo}-{hi}/t{tag}/"


class _Deferred:
    """A Work's C++ handle stand-in: `start()` runs on a helper thread and returns the
    real Work, which wait() then waits for (errors of either step re-raised at wait())."""

    rings_bell = True  # its helper rings when done; the real Work when that completes

    def __init__(self, start: Any):
        self._done = threading.Event()
        self._work: Any = None
        self._error: BaseException | None = None
        site = _C.call_site_id()  # the user's line, for errors and stall reports

        def run() -> None:
            _C.pin_call_site(site)
            try:
                self._work = start()
            except BaseException as e:  # noqa: BLE001 - re-raised by wait()
                # Its frames' locals would keep the store (and its port, after destroy())
                # alive for as long as the caller keeps the Work.
                traceback.clear_frames(e.__traceback__)
                self._error = e
            finally:
                self._done.set()
                _C.ring_completion_bell()

        t = threading.Thread(target=run, name="ringreduce-p2p-connect", daemon=True)
        with _LOCK:  # (another's thread not started yet is kept: its start is next)
            _state.HELPERS[:] = [h for h in _state.HELPERS
                                 if h.is_alive() or _state.unstarted(h)] + [t]
        try:
            _store_guard.start(t, "the thread that makes a point-to-point channel")
        except _store_guard.NoThread:  # left in HELPERS, it failed destroy()'s join (a helper)
            with _LOCK:
                _state.HELPERS.remove(t)
            raise

    def wait(self, timeout: float | None = None) -> bool:
        t0 = time.monotonic()
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - t0))
        return self._work.wait(left)

    def is_completed(self) -> bool:
        return self._done.is_set() and (self._error is not None or self._work.is_completed())


def _ready(g: Group, src: int, dst: int, tag: int) -> Group | None:
    with _LOCK:
        return _ready_locked(g, src, dst, tag)


def _ready_locked(g: Group, src: int, dst: int, tag: int) -> Group | None:
    pair = g.p2p.get((min(src, dst), max(src, dst), tag))
    return None if pair is None else pair[0] if src < dst else pair[1]


def _deadline(g: Group, world: Group) -> tuple[float, str]:
    """How long a wait for a peer of group `g` may last, and what sets it: the group's own
    timeout (new_group(timeout=), torch's too), else the world's (RINGREDUCE_TIMEOUT,
    init(timeout=) or torch's: a world made with init_process_group(timeout=8 s) was said to
    use the variable, found by a helper), as for its collectives."""
    secs = g.timeout
    if g is not world and secs != world.timeout:
        return secs, f"the timeout of {g.name}"
    return secs, world.timeout_from


def _meet(g: Group, world: Group, store: Any, base: str, peer: int, src: int, dst: int,
          tag: int) -> None:
    """Wait (the group's timeout, as for any peer) until `peer` starts making this pair's
    channels too: it may legitimately arrive late (a pipeline stage still computing). Making
    them then takes connect time only."""
    timeout, which = _deadline(g, world)
    site = _C.current_call_site()
    with _watch.watching(world, [peer]):  # a dead or frozen peer: PeerFailure
        _rendezvous._wait(
            store, [f"{base}want{peer}"], timeout,
            world.rank, f"rank {peer} to post a send, recv, isend or irecv toward rank "
            f"{world.rank} on tag {tag} (the first message {src} -> {dst} on that tag; "
            f"{which}{'; called from ' + site if site else ''})",
            f"{base}meet/{world.rank}/{next(_MEETS)}/",  # own "failed"
            hint="is it blocked in another send/recv? Blocking calls on several tags must be "
                 "posted in an order in which both ranks meet; isend/irecv never wait for "
                 "each other", ranks=[peer], name_keys=False)


_WARN_AT = (64, 512, 4096)  # pairs of channels: warn as each of these counts is reached


def _warn_many(world: Group, pairs: int, tags: int) -> None:
    """Each (peer, tag) costs two channels, kept until destroy(): a communicator each, with
    its own thread and, over shared memory, its own segments (~40 KiB per rank, plus 2 MiB
    of slots on the sending side once it sends more than 16 KiB)."""
    log.warning("rank %d now holds %d point-to-point channels (%d distinct tags): each "
                "(peer, tag) costs two communicators, kept until destroy(), each with a "
                "thread (and its own shared memory between ranks of one host); use a few tags (e.g. one per stage or "
                "direction, not one per message or micro-batch)", world.rank, 2 * pairs, tags)


def _channel(g: Group, world: Group, src: int, dst: int, tag: int) -> Group:
    """The channel src -> dst for `tag` in group `g` (made with its reverse on first use)."""
    lo, hi = min(src, dst), max(src, dst)
    key = (lo, hi, tag)
    with _LOCK:
        pair = g.p2p.get(key)
        making = g.p2p_locks.setdefault(("make", *key), threading.Lock()) if pair is None else None
    if pair is None:
        assert making is not None
        with making:  # one thread makes it; others for the same pair wait here
            with _LOCK:
                pair, failed = g.p2p.get(key), g.p2p_failed.get(key)
            if failed is not None:  # its store keys are spent: a new try would not meet
                raise _failed_before(g, world, lo, hi, tag, failed)
            if pair is None:
                with _watch.while_alive(g):
                    up, down = _make_pair(g, world, lo, hi, src, dst, tag)
                with _LOCK:
                    gone = g.destroyed  # g.destroy() ran meanwhile: it could not see these
                    if not gone:
                        pair = g.p2p[key] = (up, down)
                    made = len(g.p2p)
                    tags = len({k[2] for k in g.p2p}) if made in _WARN_AT else 0
                if gone:
                    for ch in (up, down):
                        groups.destroy_group(ch, world)
                    raise _watch.rr_error(
                        f"rank {world.rank}: {g.name} was destroyed while the channel {src} "
                        f"-> {dst} for tag {tag} was being made; wait for a group's "
                        "isend/irecv before destroying it")
                if tags:
                    _warn_many(world, made, tags)
                if tag == 0:
                    _fast_path(g, world, lo, hi)
    return pair[0] if src == lo else pair[1]


def _failed_before(g: Group, world: Group, a: int, b: int, tag: int, why: str) -> Exception:
    return _watch.rr_error(
        f"rank {world.rank}: the channels between ranks {min(a, b)} and {max(a, b)} for tag "
        f"{tag}{'' if g is world else ' in ' + g.name} could not be made earlier ({why}); "
        "they stay unusable: use another tag, or destroy() and init() again")


def _make_pair(g: Group, world: Group, lo: int, hi: int, src: int, dst: int,
               tag: int) -> tuple:
    """Make the channels lo -> hi and hi -> lo for `tag` (this rank is one of the two)."""
    base, store, peer = _base(g, lo, hi, tag), g.store, lo + hi - world.rank
    where = "" if g is world else f" in {g.name}"
    during = f"making the channel {src} -> {dst} for tag {tag}{where}"
    with _watch.watching(world, [peer]), \
            _rendezvous.store_used(world.rank, during, store,  # names rank 0 `left` if so
                                    _deadline(g, world)[0]):
        store.set(f"{base}want{world.rank}", b"1")  # for any-source receivers
    try:
        _meet(g, world, store, base, peer, src, dst, tag)
    except KeyboardInterrupt as e:  # noted as a receive on a made channel's is (in C++)
        if hasattr(e, "add_note"):  # Python >= 3.11
            e.add_note(f"ringreduce: interrupted: rank {world.rank} while {during} (the first "
                       f"message between ranks {lo} and {hi} on that tag), waiting for rank "
                       f"{peer} to post its side")
        raise
    except Exception as e:
        # The peer may come later, find this rank's "want" and wait in the channel's set-up:
        # tell it there (it waited out the connect timeout: found by a review).
        _store_wait.fail_bounded(store, f"{base}up/", e, world.rank)
        with _LOCK:
            g.p2p_failed[(lo, hi, tag)] = _said(e)
        raise
    # A group's own timeout bounds its channels' waits too (world channels: None, the world's).
    secs = None if g is world else _deadline(g, world)[0]
    made: list = []
    try:
        for d, a, b in (("up", lo, hi), ("down", hi, lo)):
            made.append(groups._make(world, [lo, hi], f"{base}{d}/",
                                     f"p2p {a}->{b} tag {tag}{where}", secs, p2p=g.store_prefix,
                                     store=store))
    except Exception as e:
        with _LOCK:  # both ranks claimed the keys: later posts get this error, not a new try
            g.p2p_failed[(lo, hi, tag)] = _said(e)
        for ch in made:
            groups.destroy_group(ch, world)
        if type(e) in (_C.RingReduceError, RuntimeError, OSError, MemoryError) and \
                not getattr(e, _blame.SECONDARY, False) and \
                not (g.destroyed or world.destroyed or world.aborted):  # this rank's own
            _fail_siblings(g, world, lo, hi, f"for tag {tag}{where}: {_said(e)}")
        raise
    if made[0].store_keys:  # its destroy() deletes the "want" key too (it stayed for good)
        made[0].store_keys.append(f"{base}want{world.rank}")
    return made[0], made[1]


def _said(e: BaseException) -> str:
    """What a failed channel set-up says of its error (kept for later posts, told to peers)."""
    return f"{type(e).__name__}: {str(e)[:500]}"


def _fail_siblings(g: Group, world: Group, lo: int, hi: int, what: str) -> None:
    """The channels between `lo` and `hi` for a tag could not be made on this rank (no room in
    /dev/shm for their segments, no descriptors...; `what`: "for tag T[ in group]: error"):
    its made channels with that peer in group `g` (other tags) fail too, and tell the peer. A
    receive from the peer on another tag waited for RINGREDUCE_TIMEOUT after an eager send's
    channel failed (only logged), while the peer, told of it, went on (a helper)."""
    why = (f"rank {world.rank} could not make its point-to-point channels with rank "
           f"{lo + hi - world.rank} {what}")
    with _LOCK:
        pairs = [pair for (a, b, _), pair in g.p2p.items() if {a, b} == {lo, hi}]
    for ch in (ch for pair in pairs for ch in pair):
        if ch.comm is not None and not ch.destroyed:
            ch.comm.fail_from(why, world.rank)


def _fast_path(g: Group, world: Group, lo: int, hi: int) -> None:
    """Let rr.send / rr.recv to and from the peer take the C fast path once the pair's tag-0
    channels exist and no post waits for its turn on them (the fast path would overtake).
    World channels only: the fast path serves calls without group=."""
    if g is not world:
        return
    with _LOCK:
        pair = g.p2p.get((lo, hi, 0))
        if pair is None or (id(g), lo, hi, 0) in _PENDING or (id(g), hi, lo, 0) in _PENDING:
            return
    if world.rank in (lo, hi):
        up, down = pair
        me_lo = world.rank == lo
        _state.add_channel(world, hi if me_lo else lo, up if me_lo else down,
                           down if me_lo else up)
