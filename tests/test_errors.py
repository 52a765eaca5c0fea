"""Failure paths: bad inputs, a peer killed mid-collective, ranks that disagree, a stuck
rank (timeout), re-initialisation after a failure, wrong secrets and strangers on the
listening port. Every multi-process test has a hard timeout (tests/_spawn.py) well below
its pytest timeout, and asserts on every rank's story, not only on "it did not hang"."""

from __future__ import annotations

import re
from pathlib import Path

import error_workers
import numpy as np
import pytest
import torch
from _spawn import proc_state, run_world, run_world_raw

import ringreduce as rr

TRANSPORTS = ["tcp", "shm"]


def _env(transport: str, **extra: str) -> dict[str, str]:
    return {"RINGREDUCE_TRANSPORT": transport, **extra}


# ----------------------------------------------------------------------- bad inputs


def test_collectives_before_init_say_to_call_init() -> None:
    assert not rr.is_initialized()
    x = np.ones(3, dtype=np.float32)
    calls = [
        lambda: rr.allreduce(x), lambda: rr.broadcast(x), lambda: rr.barrier(),
        lambda: rr.allgather(x), lambda: rr.reduce_scatter(x),
        lambda: rr.allreduce_coalesced([x]), lambda: rr.get_rank(), lambda: rr.get_world_size(),
        lambda: rr.allreduce(x, async_op=True),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match=r"not initialised: call ringreduce\.init\(\)"):
            call()
    assert np.array_equal(x, np.ones(3, dtype=np.float32))
    rr.destroy()  # a no-op when not initialised
    assert not rr.is_initialized()


def test_exception_hierarchy() -> None:
    assert issubclass(rr.RingReduceError, RuntimeError)
    for cls in (rr.CollectiveTimeout, rr.PeerFailure, rr.CollectiveMismatch):
        assert issubclass(cls, rr.RingReduceError)
    assert issubclass(rr.CollectiveTimeout, TimeoutError)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_bad_inputs_raise_before_any_data_moves(world: int) -> None:
    """Only the last rank makes ~30 bad calls; then every rank runs correct collectives,
    which would mismatch or hang had any bad call started one."""
    env = {"RINGREDUCE_TIMEOUT": "15"}
    res = run_world(world, error_workers.bad_inputs, timeout=60, env=env)
    for r, errs in enumerate(res):
        assert errs == [], f"rank {r}:\n" + "\n".join(errs)


# ------------------------------------------------------------------- dead peer


KILL_CASES = [(2, "ring", "tcp"), (2, "tree", "tcp"), (4, "ring", "tcp"), (4, "tree", "tcp"),
              (2, "auto", "shm"), (4, "auto", "shm"), (4, "ring", "shm")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world,algo,transport", KILL_CASES)
def test_killed_peer_raises_peer_failure_everywhere(world: int, algo: str, transport: str,
                                                    tmp_path: Path) -> None:
    stamp = tmp_path / "killed_at"
    outs = run_world_raw(world, error_workers.peer_kill, algo, str(stamp), timeout=60,
                         env=_env(transport, RINGREDUCE_TIMEOUT="30"))
    story = "\n".join(o.describe() for o in outs)
    assert outs[1].returncode == -9 and not outs[1].has_result, f"rank 1 did not die:\n{story}"
    t_kill = float(stamp.read_text())
    for o in outs:
        if o.rank == 1:
            continue
        assert o.ok, story
        v = o.value
        assert v["type"] == "PeerFailure", f"rank {o.rank}: {v}"
        assert re.search(r"\brank 1\b", v["msg"]), f"rank {o.rank} does not name rank 1: {v['msg']}"
        assert isinstance(v["peer_rank"], int) and 0 <= v["peer_rank"] < world, v
        latency = v["t_err"] - t_kill
        assert latency < 5.0, f"rank {o.rank} noticed the dead peer only after {latency:.1f} s"
        # The communicator is poisoned: later calls fail fast with a clear message.
        assert v["after"] and re.search(r"unusable|aborted|destroy", v["after"]), v["after"]
        assert "init" in v["after"], f"the error does not say to init again: {v['after']}"
        assert v["destroy_s"] < 3.0, f"destroy() took {v['destroy_s']:.1f} s with a dead peer"


@pytest.mark.timeout(90)
def test_a_peer_killed_after_sending_is_named_while_waiting_for_another() -> None:
    outs = run_world_raw(3, error_workers.dies_after_sending, timeout=60, expendable=[1],
                         env={"RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_TIMEOUT": "30"})
    v = outs[0].value
    assert v is not None, outs[0].describe()
    assert v["error"].startswith("PeerFailure") and "rank 1 (" in v["error"], v
    assert "stopped responding" not in v["error"] and v["secs"] < 3.0, v  # killed at 1 s


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_an_awaited_rank_that_dies_after_another_is_named(transport: str) -> None:
    """Waiting for rank 2's first message while rank 1 (not involved) dies first, then rank
    2: named within the heartbeat timeout after rank 2's death (the world's failure over rank
    1 closed its connections, so not at once), not at RINGREDUCE_TIMEOUT (30 s)."""
    outs = run_world_raw(3, error_workers.awaited_rank_dies_after_another, timeout=60,
                         expendable=[1, 2], env={"RINGREDUCE_TRANSPORT": transport,
                                                 "RINGREDUCE_TIMEOUT": "30"})
    v = outs[0].value
    assert v is not None, outs[0].describe()
    assert v["error"] == "PeerFailure" and v["peer"] == 2, v
    assert v["secs"] < 12, v  # killed at 3 s; heartbeat timeout 4 s


# ------------------------------------------------------------------- mismatches


MISMATCH_NAMES = [n for n in error_workers.MISMATCHES
                  if n not in ("broadcast-root", "kind", "reduce-root", "gather-root",
                               "scatter-root", "zero-count", "algo-shm")]


SEND_ONLY_MAY_RETURN = ("broadcast", "reduce-root", "gather-root", "scatter-root",
                        "zero-count")


def _check_mismatch(outs: list, world: int) -> None:
    """Every rank must fail promptly (no hang, no silent success) and the failure must name
    the field that differs. Exceptions, each asserted narrowly:
    - in a broadcast, ranks whose own frames agreed (the root only sends; with 3 ranks a
      receiver whose count matches the root's) may return; their next collective must then
      fail naming the field (the disagreeing receiver's abort reached them); likewise a
      leaf of a TCP reduce / gather tree, which only sends;
    - a rank whose send hits a socket its peer closed after detecting the mismatch reports
      "closed the connection" (a race with reading that peer's abort frame; see the
      report) -- accepted only while another rank names the field."""
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    by_name: dict[str, list[tuple[int, dict]]] = {}
    for o in outs:
        for res in o.value:
            by_name.setdefault(res["name"], []).append((o.rank, res))
    for name, results in by_name.items():
        assert len(results) == world, f"{name}: only {len(results)} ranks reported"
        named = []
        for r, res in results:
            where = f"rank {r}, {name}"
            assert res["fresh_comm_ok"] is True, f"{where}: fresh communicator: {res['fresh_comm_ok']}"
            phrase = res["phrase"]
            if res["type"] is None and name.startswith(SEND_ONLY_MAY_RETURN):
                assert res["after"] and phrase in res["after"], (
                    f"{where}: broadcast returned and the next call says {res['after']}")
                named.append(r)
                continue
            assert res["type"] in ("CollectiveMismatch", "PeerFailure"), (
                f"{where}: expected CollectiveMismatch (or PeerFailure carrying it), got "
                f"{res['type']}: {res['msg']}")
            # The promise: a mismatched collective is an error within ~1 s (data-path
            # mismatches take microseconds; kind mismatches ride on heartbeats, 0.5 s), not at
            # the timeout (4 s or more here). 2 s: ranks leave the store barrier starting the
            # clock apart, and a loaded host delays a heartbeat (CI runs 4 files on 2 cores).
            assert res["elapsed"] < 2.0, f"{where}: detected only after {res['elapsed']:.2f} s"
            assert res["after"] is not None, f"{where}: the next collective succeeded"
            if res["type"] == "CollectiveMismatch":  # who differs (found here) / who said so
                odd, via, peer = world - 1, res["relayed_by"], res["peer_rank"]
                assert (via is None) != (peer is None), f"{where}: {res}"
                assert peer in (None, odd) if r != odd else peer != r, f"{where}: {res}"
                assert via is None or 0 <= via < world and via != r, f"{where}: {res}"
            if phrase in res["msg"]:
                named.append(r)
                if name == "op":  # by number, not "peer" / "this rank": relayed text stays clear
                    assert re.search(rf"rank {world - 1} (uses )?max\b", res["msg"]), (
                        f"{where}: the odd rank is not named with its op: {res['msg']}")
            else:
                assert res["type"] == "PeerFailure" and "closed the connection" in res["msg"], (
                    f"{where}: message lacks {phrase!r}: {res['msg']}")
        assert named, f"{name}: no rank named the mismatch:\n" + "\n".join(
            f"rank {r}: {res['msg']}" for r, res in results)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [2, 3])
def test_mismatched_collectives_are_detected(world: int, transport: str) -> None:
    outs = run_world_raw(world, error_workers.mismatch, MISMATCH_NAMES, timeout=90,
                         env=_env(transport, RINGREDUCE_TIMEOUT="10"))
    _check_mismatch(outs, world)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport,world", [
    ("tcp", 2), ("shm", 2), ("shm", 3), ("tcp", 3),
])
def test_mismatched_kinds_are_detected(world: int, transport: str) -> None:
    """The last rank broadcasts while the others all-reduce (world 3: the tree all-reduce
    waits for the last rank's fold while that rank waits for the broadcast from rank 0)."""
    outs = run_world_raw(world, error_workers.mismatch, ["kind"], timeout=40,
                         env=_env(transport, RINGREDUCE_TIMEOUT="4"))
    _check_mismatch(outs, world)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport,world", [("tcp", 2), ("tcp", 3), ("shm", 2), ("shm", 3)])
def test_mismatched_broadcast_roots_are_detected(world: int, transport: str) -> None:
    """TCP, 2 ranks: each believes it is the root, so both only send and return (as NCCL's and
    gloo's would); their next collective reads the stale broadcast frame and must name the
    root mismatch, not only the sequence numbers."""
    outs = run_world_raw(world, error_workers.mismatch, ["broadcast-root"], timeout=40,
                         env=_env(transport, RINGREDUCE_TIMEOUT="4"))
    _check_mismatch(outs, world)


@pytest.mark.timeout(60)
def test_a_root_mismatch_in_the_last_call_is_reported_at_destroy() -> None:
    """TCP, 2 ranks, both roots of the job's last broadcast: both return with their own
    data and no later call fails; destroy() warns (best effort: the rank whose peer's frame
    has arrived) that the results differ, naming the field."""
    outs = run_world_raw(2, error_workers.roots_then_leave, timeout=40, env=_env("tcp"))
    assert [o.value for o in outs] == [[0.0] * 10, [1.0] * 10], [o.describe() for o in outs]
    warned = [o for o in outs if "is leaving world with data unread" in o.stderr]
    assert warned, [o.stderr for o in outs]
    assert all("root mismatch in broadcast #1" in o.stderr for o in warned), warned[0].stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport,world", [("tcp", 3), ("shm", 2), ("shm", 3)])
def test_scatter_roots_and_empty_calls_are_named(world: int, transport: str) -> None:
    """A TCP scatter whose last rank believes it is the root returns everywhere (each root
    keeps its own block); the next call must say "root mismatch in scatter", not only the
    sequence numbers. A rank whose all-reduce had 0 elements skips it: the mismatch that
    follows asks whether a rank passed an empty buffer (found by a helper)."""
    outs = run_world_raw(world, error_workers.mismatch, ["scatter-root", "zero-count"],
                         timeout=80, env=_env(transport, RINGREDUCE_TIMEOUT="4"))
    _check_mismatch(outs, world)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_a_tree_against_shared_memory_is_named(world: int) -> None:
    """algo= per call differs on the last rank: shared memory there, a tree on the others
    (whose frames it never reads): each rank waited for the others until the timeout (the
    stall report at 10 s saw a cycle); the heartbeats' algorithms name it within 1 s."""
    outs = run_world_raw(world, error_workers.mismatch, ["algo-shm"], timeout=40,
                         env=_env("shm", RINGREDUCE_TIMEOUT="4"))
    _check_mismatch(outs, world)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport,world", [("tcp", 2), ("tcp", 3), ("shm", 2), ("shm", 3)])
def test_mismatched_reduce_and_gather_roots_are_detected(world: int, transport: str) -> None:
    """The last rank passes itself as dst. Over TCP both roots wait to receive, so only the
    roots in the heartbeats can name it before the 4 s timeout (_check_mismatch's bound)."""
    outs = run_world_raw(world, error_workers.mismatch, ["reduce-root", "gather-root"],
                         timeout=40, env=_env(transport, RINGREDUCE_TIMEOUT="4"))
    _check_mismatch(outs, world)


@pytest.mark.timeout(60)
def test_a_rank_that_left_after_the_same_collective_is_not_said_to_skip_it() -> None:
    """Rank 2 ran reduce #4 with another root and left: rank 0's error says the leaver's
    last collective was #4 and asks about other arguments (was: only "did it skip this
    collective, or fail?", and its state from a heartbeat 0.5 s old: "idle after #0")."""
    outs = run_world_raw(4, error_workers.reduce_root_then_leave, timeout=40,
                         env=_env("tcp", RINGREDUCE_TIMEOUT="10"))
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    msg = outs[0].value
    assert "rank 2" in msg and "after its collective #4" in msg, story
    assert "other arguments (root, size, group)" in msg and "reduce #4" in msg, story
    assert "idle after collective #0" not in msg, story


# --------------------------------------------------------------------- timeouts


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world,async_op", [(2, True), (3, False)])
def test_stuck_rank_times_out_then_reinit_works(world: int, async_op: bool,
                                                transport: str) -> None:
    res = run_world(world, error_workers.collective_timeout, async_op, timeout=60, init=False,
                    env=_env(transport, RINGREDUCE_CONNECT_TIMEOUT="30"))
    late = world - 1
    for r, v in enumerate(res):
        first = v["first"]
        assert first["type"] is not None, f"rank {r}: the all-reduce with a stuck peer succeeded"
        assert first["is_rr"], f"rank {r}: {first}"
        if r != late:
            assert first["type"] == "CollectiveTimeout" and first["is_timeout"], (
                f"rank {r}: expected CollectiveTimeout, got {first['type']}: {first['msg']}")
            assert 1.5 <= first["elapsed"] <= 4.5, (
                f"rank {r}: timeout=2 fired after {first['elapsed']:.1f} s")
            assert "timed out" in first["msg"]
            assert re.search(r"waiting for data from rank \d", first["msg"]), first["msg"]
            if world == 2:
                assert re.search(rf"\brank {late}\b", first["msg"]), first["msg"]
        if async_op and r != late:
            assert v["queued_s"] < 0.5, "an async call blocked"
        assert v["after"] is not None and re.search(r"unusable|aborted", v["after"]), v["after"]
        assert v["destroy_s"] < 3.0, f"rank {r}: destroy() took {v['destroy_s']:.1f} s"
        assert v["initialized_after_destroy"] is False
        s = world * (world + 1) // 2
        assert v["reinit_sum"] == [s] * 5, f"rank {r}: after re-init got {v['reinit_sum']}"


@pytest.mark.exclusive  # its ranks' order of events holds on an idle machine only (see README)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rank_leaving_after_reinit_is_named_itself(transport: str) -> None:
    """A goodbye names the rank its process's first failure lost; a new init() forgets an
    earlier job's failure (else a peer of the next job named that stale rank)."""
    res = run_world(3, error_workers.left_after_reinit, timeout=60, init=False,
                    env=_env(transport, RINGREDUCE_CONNECT_TIMEOUT="30"))
    v = res[0]
    assert (v["type"], v["peer_rank"], v["cause"], v["relayed_by"]) == \
        ("PeerFailure", 2, "left", None), v


_stagger_cache: dict[str, list] = {}


def _staggered(transport: str) -> list[dict]:
    """error_workers.stuck_rank_named on 3 ranks, run once per transport for the two tests below."""
    if transport not in _stagger_cache:
        _stagger_cache[transport] = run_world(
            3, error_workers.stuck_rank_named, timeout=30, init=False,
            env=_env(transport, RINGREDUCE_CONNECT_TIMEOUT="30"))
    return _stagger_cache[transport]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_timeout_names_the_rank_that_never_arrived(transport: str) -> None:
    res = _staggered(transport)
    for r in (0, 1):
        assert res[r]["type"] == "CollectiveTimeout", res[r]
    for r in (0, 1):
        assert re.search(r"\brank 2\b", res[r]["msg"]), f"rank {r}: {res[r]['msg']}"
        # The error's fields say it too: whom this rank waited for, where the chain ends.
        assert res[r]["peer_rank"] == 2, res[r]
        if res[r]["relayed_by"] is None:  # timed out itself: whom it waited for
            assert res[r]["waiting_for"] in (0, 1, 2) and res[r]["waiting_for"] != r, res[r]
        else:  # told by the rank that timed out (its abort), which named rank 2 too
            assert res[r]["relayed_by"] == 1 - r and res[r]["waiting_for"] is None, res[r]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_late_rank_learns_why_its_peers_gave_up(transport: str) -> None:
    res = _staggered(transport)
    late = res[2]
    assert late["type"] is not None and late["is_rr"], late
    assert "timed out" in late["msg"], f"the late rank was told: {late['msg']}"


# --------------------------------------------------------------- authentication


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_wrong_secret_is_refused(world: int) -> None:
    """The handshake refuses a process with another secret (init's own comparison of the
    secrets, which names it first -- test_job_wide_settings_that_differ_are_named_at_init
    -- switched off here)."""
    odd = world - 1
    outs = run_world_raw(world, error_workers.init_only_unchecked, timeout=40, init=False,
                         env={"RINGREDUCE_CONNECT_TIMEOUT": "5"},
                         rank_env={odd: {"RINGREDUCE_SECRET": "not-the-job-secret"}})
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    v = outs[odd].value
    assert v["type"] == "PeerFailure", f"the impostor's init: {v}"
    assert re.search(r"authentication failed|wrong job secret", v["msg"]), v["msg"]
    assert v["elapsed"] < 8, v
    for o in outs[:odd]:
        v = o.value
        assert v["type"] is not None, f"rank {o.rank} initialised with an impostor in the job"
        assert v["is_rr"], v
        assert v["elapsed"] < 9, f"rank {o.rank}: init failed only after {v['elapsed']:.1f} s"
        assert re.search(rf"\brank\(s\) .*\b{odd}\b|\brank {odd}\b", v["msg"]), v["msg"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("var,values", [
    ("RINGREDUCE_SEGMENT_BYTES", ("64", "1M")),  # was "frame size mismatch in allgather"
    ("RINGREDUCE_TREE_THRESHOLD_BYTES", ("0", "1G")),  # was "pass the same algo="
    ("RINGREDUCE_TRANSPORT", ("tcp", "auto")),  # was "collective mismatch"
    ("RINGREDUCE_HALF_WIRE", ("32", None)),
    ("RINGREDUCE_HEARTBEAT_INTERVAL", ("3", None)),  # was "rank 1 stopped responding"
    ("RINGREDUCE_HEARTBEAT_TIMEOUT", ("1", None)),
    ("RINGREDUCE_CHECKSUM", ("1", None)),  # a rank that checksums refuses frames without
    ("RINGREDUCE_CMA", ("0", None)),  # a root's 1 read a receiver's buffer that had said 0
    # one rank's fit (another file, or none): "algorithm mismatch ... pass the same algo="
    ("RINGREDUCE_TUNING_FILE's alpha_us", ("tuning.json", None)),
    # Rank 0 draws one; rank 1's own failed every handshake: rank 0 waited out the connect
    # timeout, rank 2 blamed rank 1 as crashed.
    ("RINGREDUCE_SECRET", (None, "b")),
])
def test_job_wide_settings_that_differ_are_named_at_init(var: str, values: tuple,
                                                         tmp_path: Path) -> None:
    if var.startswith("RINGREDUCE_TUNING_FILE"):
        fit = tmp_path / values[0]
        fit.write_text('{"alpha_us": 100000, "beta_ns_per_byte": 0.1}')
        rank_env = {0: {"RINGREDUCE_TUNING_FILE": str(fit)}}
    else:
        rank_env = {r: {var: v} for r, v in enumerate(values) if v is not None}
    outs = run_world_raw(3, error_workers.init_only, timeout=40, init=False,
                         rank_env=rank_env)
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    for o in outs:
        v = o.value
        assert v["type"] == "ValueError", f"rank {o.rank}: {v}"
        assert f"{var} differs between ranks" in v["msg"] and "rank 2:" in v["msg"], v["msg"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [1, 0])  # 0: the store's host, which exits after
def test_a_rank_that_cannot_start_stops_the_others_at_once(bad: int) -> None:
    """A rank fails before it publishes its address (an interface that does not exist):
    the others waited for it until the connect timeout ("missing addr/1")."""
    outs = run_world_raw(3, error_workers.init_only, timeout=50, init=False,
                         rank_env={bad: {"RINGREDUCE_SOCKET_IFNAME": "nonexist0"}},
                         env={"RINGREDUCE_CONNECT_TIMEOUT": "30"})
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    for o in outs:
        v = o.value
        assert v["type"] == "ValueError" and "'nonexist0' does not exist" in v["msg"], v
        assert o.rank == bad or f"rank {bad} could not start" in v["msg"], v
        assert v["elapsed"] < 10, v


@pytest.mark.timeout(60)
def test_a_secret_on_rank_0_only_is_named_at_init() -> None:
    """Rank 0 publishes no secret when it was given one: the others waited for it until
    the connect timeout ("rank 0 to publish the job secret")."""
    outs = run_world_raw(3, error_workers.init_only, timeout=40, init=False,
                         rank_env={0: {"RINGREDUCE_SECRET": "s3cret"},
                                   **{r: {"RINGREDUCE_SECRET": ""} for r in (1, 2)}},
                         env={"RINGREDUCE_CONNECT_TIMEOUT": "30"})
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    for o in outs:
        v = o.value
        assert v["type"] == "ValueError", f"rank {o.rank}: {v}"
        assert "RINGREDUCE_SECRET (or init(secret=)) is set on rank 0 but not on rank" in \
            v["msg"], v["msg"]
        assert v["elapsed"] < 10, v


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_init_waits_under_the_connect_timeout_not_the_collective_one(transport: str) -> None:
    """Init's shared-memory set-up exchanges segment names with collectives; they ran under
    RINGREDUCE_TIMEOUT, so a tiny one failed init ("allgather #1 timed out"; a helper)."""
    outs = run_world(3, error_workers.init_and_destroy, timeout=40, init=False,
                     env={"RINGREDUCE_TIMEOUT": "1e-9", "RINGREDUCE_TRANSPORT": transport})
    assert outs == ["ok"] * 3, outs


@pytest.mark.timeout(60)
def test_job_wide_settings_written_differently_but_equal_agree() -> None:
    outs = run_world(2, error_workers.init_only, timeout=40, init=False,
                     rank_env={0: {"RINGREDUCE_SEGMENT_BYTES": "512K"},
                               1: {"RINGREDUCE_SEGMENT_BYTES": "524288"}})
    assert [o["sum"] for o in outs] == [[2.0] * 4] * 2, outs


@pytest.mark.timeout(60)
def test_strangers_on_the_listening_port_are_refused() -> None:
    res = run_world(2, error_workers.strangers, timeout=45, init=False,
                    env={"RINGREDUCE_CONNECT_TIMEOUT": "20"})
    for r, v in enumerate(res):
        assert v["sum"] == [3.0, 3.0, 3.0], f"rank {r}: {v}"
    seen = res[1]
    magic = 0x31485252
    assert seen["hello"][:3] == [magic, error_workers._VERSION, 0], f"rank 0's hello: {seen['hello']}"
    assert seen["bad_mac_ack"] == [magic, 5], f"wrong-secret handshake: {seen['bad_mac_ack']}"
    assert seen["garbage_ack"] == [magic, 1], f"garbage: {seen['garbage_ack']}"
    # The silent stranger may hold rank 0 up for its 5 s handshake window, not longer.
    assert seen["init_s"] < 12, f"init took {seen['init_s']:.1f} s with strangers about"


# ------------------------------------------------------------------ misc. state


def test_world_size_one_needs_no_store() -> None:
    """world_size=1 initialises without MASTER_ADDR/PORT and every collective is an
    identity; a second init raises; destroy then init works (in this process)."""
    rr.init(rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="already initialised"):
            rr.init(rank=0, world_size=1)
        x = torch.arange(5, dtype=torch.float32)
        rr.allreduce(x, op="avg")
        assert torch.equal(x, torch.arange(5, dtype=torch.float32))
        assert rr.allgather(x).shape == (1, 5)
        assert rr.allreduce(x, async_op=True).wait() is True
    finally:
        rr.destroy()
    assert not rr.is_initialized()
    rr.init(rank=0, world_size=1)
    rr.destroy()
    with pytest.raises(ValueError, match="out of range"):
        rr.init(rank=1, world_size=1)
    assert not rr.is_initialized()


@pytest.mark.parametrize("kw, err, match", [
    ({"master_port": 70000}, ValueError, r"master_port=70000\) is not a TCP port"),
    ({"master_port": -5}, ValueError, "not a TCP port"),
    ({"master_port": 0}, ValueError, "not a TCP port"),  # fell back to MASTER_PORT before
    ({"master_port": "29670"}, TypeError, "must be an int port"),
    ({"master_addr": ""}, ValueError, "non-empty string"),
    ({"world_size": 2.7}, TypeError, r"init\(world_size\) must be an int size"),
    ({"rank": 1.0}, TypeError, r"init\(rank\) must be an int rank"),
])
def test_init_refuses_bad_arguments_before_the_store(monkeypatch, kw, err, match) -> None:
    """init()'s own arguments are checked as their variables are: a port out of range or a
    string failed as a store *timeout* blaming a port in use; a float world size was
    truncated (found by a helper)."""
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    args = {"rank": 0, "world_size": 2, "master_addr": "127.0.0.1", "master_port": 29999, **kw}
    with pytest.raises(err, match=match):
        rr.init(**args)
    assert not rr.is_initialized()


def test_init_with_one_of_rank_and_world_size_needs_the_other(monkeypatch) -> None:
    """Without launcher variables, init(world_size=2) alone made this process rank 0 --
    two such processes both claimed rank 0 (torch's env:// says "rank expected")."""
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match=r"init\(world_size=...\) without rank"):
        rr.init(world_size=2, master_addr="127.0.0.1", master_port=29999)
    with pytest.raises(ValueError, match=r"init\(rank=...\) without world_size"):
        rr.init(rank=1)
    rr.init(world_size=1)  # unambiguous: rank 0
    rr.destroy()


def test_abort_refuses_later_calls_at_world_size_one() -> None:
    """A world of one (and a group of one) has no C++ communicator: after abort() its
    collectives returned as if nothing happened while larger worlds refuse them (a helper)."""
    rr.init(rank=0, world_size=1)
    try:
        solo = rr.new_group([0])
        rr.abort()
        x = np.ones(3)
        calls = {"allreduce": lambda: rr.allreduce(x), "barrier": rr.barrier,
                 "broadcast": lambda: rr.broadcast(x, src=0),
                 "allgather": lambda: rr.allgather(x),
                 "allreduce on a group of one": lambda: rr.allreduce(x, group=solo),
                 "new_group": lambda: rr.new_group([0])}
        for what, call in calls.items():
            with pytest.raises(rr.RingReduceError, match="communicator was aborted"):
                call()
                pytest.fail(f"{what} after abort() was not refused")
        assert rr.get_rank() == 0 and rr.get_world_size(solo) == 1
    finally:
        rr.destroy()
    rr.init(rank=0, world_size=1)  # a new init runs again
    rr.allreduce(np.ones(2))
    rr.destroy()


# ------------------------------------------------------------- the spawn helper


def _alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


@pytest.mark.timeout(60)
def test_spawn_helper_kills_a_hung_world_and_reports_failures() -> None:
    """The harness itself: a hung rank is killed at the hard timeout (no process left
    behind) and reported; a raising rank's exception and traceback reach the parent."""
    import time

    t0 = time.monotonic()
    outs = run_world_raw(2, error_workers.hang, 600, timeout=8, init=False)
    assert time.monotonic() - t0 < 20
    assert outs[0].ok and not outs[0].timed_out
    assert outs[1].timed_out and not outs[1].ok
    assert "TIMED OUT" in outs[1].describe()
    # The child's watchdog dumped its stack first (normally inside hang(); under heavy load
    # the import of torch may still be running at the deadline).
    assert "most recent call first" in outs[1].stderr
    assert not any(_alive(o.pid) for o in outs)
    with pytest.raises(AssertionError) as info:
        run_world(2, error_workers.fail_on, 1, timeout=30)
    text = str(info.value)
    assert "rank(s) [1] failed" in text and "deliberate failure on rank 1" in text
    assert "Traceback" in text and "fail_on" in text
    assert run_world(2, error_workers.fail_on, 5, timeout=30) == [0, 10]


# ------------------------------------------------------------------ async lifetime


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destroy_with_pending_async_work(transport: str) -> None:
    res = run_world(2, error_workers.destroy_with_pending, timeout=40, env=_env(transport))
    for r, v in enumerate(res):
        assert v["destroy_s"] < 3.0, f"rank {r}: destroy() took {v['destroy_s']:.1f} s"
        for k, w in enumerate(v["works"]):
            # Each Work either finished (both ranks got to it before the abort) or failed
            # with a RingReduceError -- this rank's abort, or the peer's closed sockets when
            # the peer destroyed first; none may hang or report success without finishing.
            if w["type"] is None:
                assert w["done"] is True, f"rank {r} work {k}: {w}"
            else:
                assert w["is_rr"], f"rank {r} work {k}: {w}"
                assert w["elapsed"] < 3.0, w
        assert any(w["type"] for w in v["works"]), f"rank {r}: all six finished before destroy?"
        assert v["after"] and "call ringreduce.init()" in v["after"], v["after"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_async_buffers_outlive_a_dropped_handle(transport: str) -> None:
    res = run_world(2, error_workers.fire_and_forget, 300_000, timeout=40, env=_env(transport))
    for r, intact in enumerate(res):
        assert all(intact), f"rank {r}: later allocations were overwritten: {intact}"


@pytest.mark.timeout(60)
def test_a_group_creation_timeout_names_the_late_world_rank() -> None:
    outs = run_world(3, "error_workers:late_to_group_creation", timeout=45)
    v = outs[0]
    assert v["error"].startswith("CollectiveTimeout: ") and "(world rank(s) 2)" in v["error"], v
    assert v["peer_rank"] == 2, v


@pytest.mark.timeout(60)
def test_an_integer_avg_without_memory_for_its_scratch_says_so() -> None:
    outs = run_world(2, error_workers.avg_scratch_refused, timeout=40)
    for o in outs:
        assert o["error"] is not None and o["intact"], o
        assert "avg of 33554432 int32 values needs 256 MiB of scratch" in o["error"], o
        assert "bad_alloc" not in o["error"] and "barrier" not in o["error"], o


@pytest.mark.timeout(60)
@pytest.mark.parametrize("given,env,named", [
    (2.0, {"RINGREDUCE_TIMEOUT": "30"}, "init(timeout=)"),
    (None, {"RINGREDUCE_TIMEOUT": "2"}, "RINGREDUCE_TIMEOUT")])
def test_a_first_message_timeout_names_the_setting_that_set_it(given, env, named) -> None:
    """A world made with init(timeout=) -- or torch's init_process_group(timeout=) -- was
    said to wait for RINGREDUCE_TIMEOUT (found by a helper)."""
    outs = run_world_raw(2, error_workers.late_first_message, given, timeout=40, init=False,
                         env=env)
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    err = outs[0].value.get("error", "")
    assert err.startswith("CollectiveTimeout") and named in err, outs[0].value


@pytest.mark.parametrize("var", ["RINGREDUCE_TRACE", "RINGREDUCE_FLIGHT_RECORDER"])
def test_an_output_path_that_cannot_be_written_is_refused_at_init(
        var: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path that cannot be written was found only when the job ended or failed: the trace
    or the flight recorder (wanted exactly then) was lost, with a warning (a helper). A
    folder that does not exist yet is made when the file is written."""
    if rr.is_initialized():
        rr.destroy()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(var, str(tmp_path / "file" / "out"))
    with pytest.raises(ValueError, match=rf"{var}=.*rank 0 cannot write .* is not a folder"):
        rr.init(rank=0, world_size=1)
    assert not rr.is_initialized()
    monkeypatch.setenv(var, str(tmp_path / "later" / "out"))
    rr.init(rank=0, world_size=1)
    rr.destroy()
    assert var != "RINGREDUCE_TRACE" or (tmp_path / "later" / "out").is_file()


def test_debug_off_quiets_the_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """RINGREDUCE_DEBUG=OFF: the core's level 0 existed, but the setting refused it."""
    import logging

    if rr.is_initialized():
        rr.destroy()
    logger = logging.getLogger("ringreduce")
    monkeypatch.setattr(logger, "level", logger.level)  # restored after the test
    monkeypatch.setenv("RINGREDUCE_DEBUG", "off")
    rr.init(rank=0, world_size=1)
    rr.destroy()
    assert logger.level == logging.ERROR
    monkeypatch.delenv("RINGREDUCE_DEBUG")  # the next init, at the default level: undone
    rr.init(rank=0, world_size=1)
    rr.destroy()
    assert logger.level == logging.NOTSET


@pytest.mark.timeout(60)
def test_ranks_running_different_algorithms_are_told_so() -> None:
    outs = run_world_raw(3, error_workers.algo_cycle, ["tree", "shm", "shm"], timeout=50,
                         env=_env("shm", RINGREDUCE_TIMEOUT="5"))
    said = [o.value for o in outs]
    assert all(v is not None and v["type"] is not None for v in said), said
    # Named by the heartbeats' algorithms within a second (it was the timeout's wait chain,
    # "likely causes: ranks running different algorithms", at 5 s).
    assert any("algorithm mismatch" in v["msg"] for v in said), said
    assert all(v["elapsed"] < 3 for v in said), said
