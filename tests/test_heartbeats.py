"""Heartbeats shared per peer process: an idle group or point-to-point channel skips the
peers the world's heartbeat reaches (so dozens of unused groups cost no traffic), while
late members are never taken for silent and frozen ones are still named at the timeout."""

from __future__ import annotations

import os
import shutil

import pytest
from _spawn import run_world, run_world_raw

# A timeout far below the quiet groups' refresh (16 rounds of 0.5 s): only liveness shared
# with the world keeps an idle group's members from being called silent.
FAST = {"RINGREDUCE_HEARTBEAT_TIMEOUT": "1.5", "RINGREDUCE_TIMEOUT": "40"}


@pytest.mark.timeout(90)
def test_idle_groups_send_almost_nothing_beside_the_world() -> None:
    outs = run_world(3, "heartbeat_workers:idle_traffic", timeout=80)
    for rank, comms in enumerate(outs):
        world = comms.pop("world")
        assert world["sent"] >= 4 * world["targets"], (rank, world)  # ~6 rounds in 3 s
        # Rank 1 is outside [0, 2] and alone in its split (a group of one sends nothing).
        assert len(comms) == (1 if rank == 1 else 3), (rank, comms)
        for name, c in comms.items():  # groups of one have no communicator: not listed
            assert c["targets"] > 0, (rank, name, c)  # a group heartbeats its members
            # At most one refresh round in 3 s, where the world sent ~6 rounds.
            assert c["sent"] <= world["sent"] // 3 and c["skipped"] > 0, (rank, name, c, world)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,late,env,alt", [
    (3, 2, {}, False),
    # The world heartbeats only its overlay (r +- 2^k): rank 3 is not in rank 0's, so the
    # group must keep talking to it itself.
    (6, 3, {"RINGREDUCE_FULL_MESH_MAX": "2"}, False),
    (3, 1, {"RINGREDUCE_TRANSPORT": "tcp"}, False),
    # Its group on another address than its world (liveness was keyed by address + pid).
    (2, 0, {"RINGREDUCE_TRANSPORT": "tcp"}, True),
], ids=["shm", "sparse-world", "tcp", "group-on-another-address"])
def test_a_member_late_to_a_quiet_group_is_not_called_silent(world: int, late: int,
                                                             env: dict, alt: bool) -> None:
    waited = run_world(world, "heartbeat_workers:late_member", late, 4.0, alt, timeout=110,
                       env={**FAST, **env})
    assert all(w >= 3.0 for r, w in enumerate(waited) if r != late), waited


@pytest.mark.timeout(90)
def test_a_frozen_member_of_a_quiet_group_is_named_at_the_timeout() -> None:
    outs = run_world_raw(3, "heartbeat_workers:frozen_member", 2, timeout=80, env=FAST,
                         expendable=[2])
    for r in (0, 1):
        v = outs[r].value
        assert v is not None, outs[r].describe()
        assert v["peer_rank"] == 2 and v["cause"] == "silent", (r, v)
        assert "rank 2 " in v["error"] and "stopped responding" in v["error"], (r, v)
        assert v["secs"] < 6.0, (r, v)  # the timeout (1.5 s) after its last word, and slack


@pytest.mark.timeout(90)
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="PID namespaces need root and unshare(1)")
def test_ranks_with_the_same_pid_do_not_vouch_for_each_other() -> None:
    """Ranks 1 and 2 in PID namespaces of their own, both pid 2 on one address (containers
    sharing the host's network); rank 1 freezes while rank 0 waits for it on the group
    [0, 1]: rank 2's heartbeats kept rank 1 alive when liveness was keyed by address + pid
    -- a CollectiveTimeout after RINGREDUCE_TIMEOUT."""
    ns = ["unshare", "--pid", "--fork", "sh", "-c", '"$@"; exit $?', "sh"]  # python: pid 2
    outs = run_world_raw(3, "heartbeat_workers:frozen_member", 1, [0, 1], timeout=80,
                         env={**FAST, "RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_TIMEOUT": "20"},
                         rank_prefix={1: ns, 2: ns}, expendable=[1],
                         rank_env={r: {"RR_SPAWN_PARENT": "1"} for r in (1, 2)})  # sh's pid
    assert outs[2].value == {"error": "not a member"}, outs[2].describe()
    v = outs[0].value
    assert v is not None, outs[0].describe()
    assert v["peer_rank"] == 1 and v["cause"] == "silent", v
    assert v["secs"] < 6.0, v


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world,stopped", [(3, [0, 1, 2]), (2, [1])])
def test_ranks_resumed_after_a_pause_blame_nobody(world: int, stopped: list) -> None:
    """SIGSTOP for 3 s against a 1.5 s heartbeat timeout: the paused time is not counted
    against peers whose datagrams the paused process could not read."""
    outs = run_world(world, "heartbeat_workers:paused", stopped, 3.0, timeout=70, env=FAST)
    assert outs == [[]] * world, outs


@pytest.fixture(scope="module")
def drop_udp(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/cpp/drop_udp.cc built as a shared object: LD_PRELOADed, the process's UDP
    datagrams are lost (a firewall passing TCP only)."""
    from _cpp_check import build

    out = tmp_path_factory.mktemp("drop_udp")
    return str(build(out, "drop_udp", [], flags=("-O2", "-fPIC", "-shared"),
                     what="the UDP-dropping shim"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,dropped,named", [
    (2, [1], False),
    # Rank 2 shares rank 1's host (127.0.0.1) and is heard: UDP from there arrives, so
    # rank 1's silence is its own and is named as before.
    # (Two dropping ranks would not hear each other either: one machine cannot have them
    # on a host of their own, whose loopback a firewall leaves alone.)
    (3, [1], True),
], ids=["two-ranks", "host-heard-from"])
def test_a_late_rank_behind_a_udp_firewall_is_not_called_silent(
        drop_udp: str, world: int, dropped: list, named: bool) -> None:
    """Its heartbeats never arrive: a rank the others waited for longer than the heartbeat
    timeout was named silent ("never heard from") although its connection worked. Now its
    ranks are left to their connections and the deadline, with one warning per host."""
    outs = run_world_raw(world, "heartbeat_workers:late_behind_a_firewall", 1, 4.0,
                         timeout=100, env={**FAST, "RINGREDUCE_TRANSPORT": "tcp"},
                         rank_env={r: {"LD_PRELOAD": drop_udp} for r in dropped})
    v = outs[0].value
    assert v is not None, outs[0].describe()
    if named:
        assert v.get("peer_rank") == 1 and v.get("cause") == "silent", v
        return
    for r, o in enumerate(outs):
        assert o.value is not None and "waited" in o.value, (r, o.describe())
    assert v["waited"] >= 3.0, v
    warned = outs[0].stderr.count("no heartbeat from host")
    assert warned == 1 and "firewall passing TCP only" in outs[0].stderr, outs[0].stderr


@pytest.mark.timeout(90)
def test_a_frozen_rank_behind_a_udp_firewall_is_named_at_the_deadline(drop_udp: str) -> None:
    """What heartbeats cannot tell is left to RINGREDUCE_TIMEOUT, whose wait chain says why."""
    outs = run_world_raw(2, "heartbeat_workers:frozen_member", 1, timeout=80, expendable=[1],
                         env={**FAST, "RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_TIMEOUT": "6"},
                         rank_env={1: {"LD_PRELOAD": drop_udp}})
    o = outs[0]
    assert o.exc_type == "CollectiveTimeout", o.describe()
    assert "rank 1 (never heard from: heartbeats from its host do not arrive)" in o.exc_msg, \
        o.describe()
