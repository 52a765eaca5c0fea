"""Point-to-point over real processes (tests/p2p_workers.py): ring exchanges of big
messages (isend first everywhere), dtypes, tags out of order, a 1F1B pipeline schedule,
bad input and size mismatches, at world sizes 2-5 over TCP and shared memory."""

from __future__ import annotations

import re
import sys
import time

import pytest
from _spawn import run_world, run_world_raw

SETUPS = [(w, t) for w in (2, 3, 5) for t in ("tcp", "shm")] + [(4, "tcp")]


def _assert_no_fails(outs: list) -> None:
    """Each rank returned the list of checks it failed: all must be empty."""
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o]
    assert not fails, "\n".join(fails)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world,transport", SETUPS)
def test_p2p_matrix(world: int, transport: str) -> None:
    outs = run_world(world, "p2p_workers:matrix", timeout=170,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60"})
    _assert_no_fails(outs)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 4])
def test_pipeline_1f1b(world: int) -> None:
    outs = run_world(world, "p2p_workers:pipeline", 6, timeout=170,
                     env={"RINGREDUCE_TIMEOUT": "60"})
    _assert_no_fails(outs)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world,transport,cma", [(2, "shm", "1"), (3, "shm", "1"),
                                               (2, "shm", "0"), (2, "tcp", "1"), (3, "tcp", "1"),
                                               (5, "shm", "1")])
def test_blocking_sends_before_receives(world: int, transport: str, cma: str) -> None:
    """Before, shared memory's blocking send waited for the receiver: this timed out; and
    the ring's first messages waited for the channel, which needs the receiver to post.
    Also a message larger than the slots, read in place (CMA) or through the slots."""
    outs = run_world(world, "p2p_workers:send_first", timeout=120,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "20",
                          "RINGREDUCE_CMA": cma})
    _assert_no_fails(outs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport,n,good_first", [
    ("shm", 10, False), ("shm", 10, True), ("shm", 300_000, False), ("tcp", 10, False),
    ("tcp", 10, True), ("tcp", 300_000, False)])
def test_size_mismatch_is_an_error_on_both_sides(transport: str, n: int,
                                                 good_first: bool) -> None:
    """The receiver fails at once; the sender's send returns (eager) or fails, and its
    next send on the channel, after the receiver failed, fails. Before, over shared memory,
    a mismatch on a channel's second message left the sender's third send succeeding (its
    line was free: it never looked)."""
    t0 = time.monotonic()
    outs = run_world(2, "p2p_workers:size_mismatch", n, good_first, timeout=90,
                     env={"RINGREDUCE_TIMEOUT": "30", "RINGREDUCE_TRANSPORT": transport})
    assert time.monotonic() - t0 < 25, outs
    first, again = outs[1].split(" | ")
    # Named as a message, not as the broadcast that carries it (as before).
    assert first.startswith("CollectiveMismatch: ") and re.search(
        rf"count mismatch in point-to-point message #{2 if good_first else 1}: rank 0 has \d+ elements, rank 1 \d+ "
        r"\(a recv's buffer must have the sent message's size and dtype\)", first), first
    if transport == "shm":  # over TCP it may hold the message's start (README: as MPI's)
        assert first.endswith("[buffer untouched]") and again.endswith("[buffer untouched]"), outs
    assert "this point-to-point channel (p2p 0->1 tag 0) is unusable" in again, again
    assert "destroy the world" in again, again
    said = outs[0].split(" | ")  # the receiver's abort, with its reason, at the next send
    assert len(said) <= 2 and said[-1].startswith("CollectiveMismatch") and \
        "count mismatch" in said[-1], outs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_messages_on_a_new_channel_keep_their_order(transport: str) -> None:
    """Several posts on a channel still being made used to race on their helper threads:
    about one tag in 15 delivered two messages swapped (wrong data, silently)."""
    outs = run_world(2, "p2p_workers:fresh_tag_order", 40, timeout=120,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60"})
    _assert_no_fails(outs)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_any_source_receive_waits_on_when_one_sender_left(transport: str) -> None:
    outs = run_world(3, "fault_workers:any_source_after_a_sender_left", timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    assert outs[0] == [1, 7.0, True], outs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receive_from_any_rank_names_a_killed_sender_at_once(transport: str) -> None:
    outs = run_world_raw(3, "p2p_leave_workers:any_source_sender_killed", timeout=60,
                         init=False, expendable=[1], env={"RINGREDUCE_TRANSPORT": transport,
                                              "RINGREDUCE_HEARTBEAT_TIMEOUT": "0",
                                              "RINGREDUCE_TIMEOUT": "30"})
    v = outs[0].value
    assert v is not None and v["got"] == [1, 1], outs[0].describe()
    assert v["peer_rank"] == 1 and "rank 1" in v["error"], v
    assert v["secs"] < 3, v  # at once (heartbeats off: before, RINGREDUCE_TIMEOUT)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receiver_on_a_new_tag_whose_sender_left_is_told_at_once(transport: str) -> None:
    outs = run_world(2, "p2p_leave_workers:sender_left_before_a_new_tag", timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30",
                          "RINGREDUCE_CONNECT_TIMEOUT": "40"})
    err = outs[1]
    assert err.startswith("PeerFailure after ") and "rank 0 (" in err and "left the job" in err, outs
    assert float(err.split()[2]) < 10, outs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receiver_whose_sender_left_names_the_recv(transport: str) -> None:
    outs = run_world(2, "p2p_leave_workers:sender_leaves", timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    err = outs[1]
    assert err.startswith("PeerFailure") and "left the job" in err, outs
    assert "recv #2 on p2p 0->1 tag 0" in err and "broadcast" not in err, outs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_after_a_failure_survivors_talk_and_the_lost_rank_is_refused(transport: str) -> None:
    outs = run_world_raw(3, "p2p_leave_workers:survivors_after_death", timeout=60,
                         expendable=[2], env={"RINGREDUCE_TRANSPORT": transport,
                                              "RINGREDUCE_TIMEOUT": "20"})
    for r in (0, 1):
        v = outs[r].value
        assert v is not None, outs[r].describe()
        assert v["world"] == 2 and v["group"] is True and v.get("p2p", True) is True, (r, v)
        for what in ("send", "new_group"):  # at once, naming rank 2
            assert v[what][0] == 2 and v[what][1] < 2, (r, what, v)



@pytest.mark.timeout(90)
@pytest.mark.parametrize("then", ["late", "exits"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_survivor_that_says_the_same_loss_is_still_waited_for(transport: str, then: str) -> None:
    outs = run_world_raw(3, "p2p_leave_workers:survivor_told_back", then, timeout=60,
                         expendable=[1, 2] if then == "exits" else [2],
                         env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "20"})
    v = outs[0].value
    assert v is not None and v["world"] == 2, "\n".join(o.describe() for o in outs)
    if then == "late":
        assert outs[1].value == {"world": 2, "group": [3.0] * 3}, outs[1].describe()
        assert v["group"] == [3.0] * 3, v
    else:  # named at once: rank 1 itself, not the loss it told of
        assert v["group"][0] == 1 and v["group"][1] < 10, v

@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_ring_names_the_dead_rank_on_every_survivor(transport: str) -> None:
    """Before, ranks 3 and 0 were told only that their neighbour "left the job (destroy(),
    or its program ended ...)": rank 2 left after rank 1's death failed its recv, and its
    goodbye said nothing of why. Now a goodbye carries the process's first failure."""
    outs = run_world_raw(4, "p2p_leave_workers:ring_death", timeout=60, expendable=[1],
                         env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "20"})
    for r in (0, 2, 3):
        v = outs[r].value
        assert v is not None, outs[r].describe()
        # "rank 1 (<host>) ...", not only a heartbeat note ("rank 1 (pid N) was last heard")
        assert v["error"].startswith("PeerFailure") and re.search(r"rank 1 \([^p]", v["error"]), \
            (r, v)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_receive_from_any_rank_fails_once_every_sender_left(transport: str) -> None:
    out = run_world(3, "p2p_leave_workers:every_sender_left", timeout=60,
                    env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})[0]
    assert (out["first"], out["got"]) == (1, 7.0), out  # what a leaver sent still arrives
    assert out["error"].startswith("PeerFailure"), out
    assert "every rank it could receive from (1, 2) left the job" in out["error"], out
    assert out["cause"] == "left", out
    assert out["secs"] < 5, out  # not the 30 s timeout


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("world,victim", [(4, 2), (5, 3)])
def test_a_pipeline_stage_is_told_of_a_death_stages_away(transport: str, world: int,
                                                         victim: int) -> None:
    """Two stages away the news is relayed once; three stages away twice: a stage told of
    the loss tells its other channels' peers in turn (before, a told stage passed nothing
    on, and stage 0 waited for RINGREDUCE_TIMEOUT: found by a helper at 16 ranks)."""
    outs = run_world_raw(world, "p2p_leave_workers:pipeline_death", victim, timeout=60,
                         expendable=[victim],
                         env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    for r in set(range(world)) - {victim}:
        v = outs[r].value
        assert v is not None and v["error"].startswith("PeerFailure"), outs[r].describe()
        assert v["peer_rank"] == victim and v["secs"] < 5, (r, v)  # not the 30 s timeout
    v = outs[0].value  # relayed by stage 1, which is alive and idle
    # Stage 1 has a channel each way with stage 2 (activations 1->2 on tag 1, gradients
    # 2->1 on tag 2): either may see the loss (or the news) first (CI saw both).
    told = (r"rank 1 lost rank 2 \(closed\)" if victim == 2 else
            rf"rank 1 was told that rank {victim} was lost \(closed\)")
    assert v["relayed_by"] == 1 and re.search(told + r" on p2p (2->1 tag 2|1->2 tag 1)",
                                              v["error"]), v


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_call_stopped_by_destroy_after_a_failure_says_why(transport: str) -> None:
    """The ring test's window, made certain: rank 0 destroys with an irecv from rank 2 in
    flight after its send to the dead rank 1 failed; rank 2's next send on that channel is
    told of rank 1 too (csrc/comm/communicator.cc: poison(); before f551188 it failed every
    time, with only "communicator was destroyed")."""
    outs = run_world_raw(3, "p2p_leave_workers:left_with_a_call_in_flight", timeout=60,
                         expendable=[1], env={"RINGREDUCE_TRANSPORT": transport,
                                              "RINGREDUCE_TIMEOUT": "20"})
    for r in (0, 2):
        v = outs[r].value
        assert v is not None, outs[r].describe()
        assert v["error"].startswith("PeerFailure") and re.search(r"rank 1 \([^p]", v["error"]), \
            (r, v)
    # a send/recv, not a collective (the abort's text said "the collective" before) -- or
    # told sooner: rank 0's failed send failed its other channels of the world, naming rank 1
    err = outs[2].value["error"]
    assert "the send/recv did not complete on rank 0" in err or \
        "rank 0 lost rank 1 (closed) on p2p 0->1" in err, outs[2]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("linger", [6.0, 0.0])
def test_destroy_waits_for_an_early_returned_send_and_says_so(linger: float) -> None:
    outs = run_world(2, "p2p_leave_workers:unreceived_send", linger, timeout=60,
                     env={"RINGREDUCE_TIMEOUT": "4"})
    sender = outs[0]
    assert sender["returned"] < 1.0, outs
    if not linger and sender["refused"] is not None:  # rank 1 had left before the send
        assert sender["refused"] == [1, "left"], outs
        return
    assert sender["refused"] is None, outs
    logs = "\n".join(sender["logs"])
    assert "a send to rank 1 on tag 9, which returned before rank 1 posted" in logs, logs
    if linger:  # the receiver may still post: wait for it, as long as any wait
        assert 3.5 < sender["destroyed"] < 15, outs
        assert "destroy() waits" in logs and "to rank(s) 1 (tag 9)" in logs, logs
    else:  # it left the job: it never will
        assert sender["destroyed"] < 2.5 and "left the job" in logs, outs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("nelem", [5, (3 << 20) // 4 + 1])  # early-returning size, and not
def test_destroy_completes_an_isend_never_waited_for(transport: str, nelem: int) -> None:
    outs = run_world(2, "p2p_workers:unwaited_isend", nelem, timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "20",
                          "RINGREDUCE_CONNECT_TIMEOUT": "30"})
    assert outs == ["sent", "ok"], outs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("leaver", [0, 1])  # the one rank 1 dials; the one rank 0 awaits
def test_a_sender_whose_receiver_left_while_connecting_is_told_at_once(leaver: int) -> None:
    outs = run_world(2, "p2p_leave_workers:left_while_connecting", leaver, timeout=60,
                     env={"RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_TIMEOUT": "40",
                          "RINGREDUCE_CONNECT_TIMEOUT": "40"})
    err = outs[1 - leaver]
    assert err.startswith("PeerFailure after ") and f"rank {leaver} (" in err, outs
    assert ("cannot be reached" if leaver == 0 else "left the job") in err, outs
    assert float(err.split()[2]) < 10, outs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_torch_p2p_on_ringreduce(world: int) -> None:
    outs = run_world(world, "p2p_workers:torch_p2p", timeout=120, init=False)
    _assert_no_fails(outs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,transport", [(2, "tcp"), (3, "shm")])
def test_groups_are_separate_message_spaces(world: int, transport: str) -> None:
    outs = run_world(world, "p2p_workers:groups_apart", timeout=90,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    _assert_no_fails(outs)


@pytest.mark.exclusive  # its ranks' order of events holds on an idle machine only (see README)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport,who,src", [("shm", 0, "peer"), ("tcp", 0, "peer"),
                                               ("tcp", 1, "peer"), ("shm", 1, None),
                                               ("tcp", 0, None)])
def test_destroy_stops_a_pending_first_irecv_and_init_works_again(
        transport: str, who: int, src: str | None) -> None:
    outs = run_world(2, "p2p_workers:irecv_at_destroy", who, src, timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30",
                          "RINGREDUCE_CONNECT_TIMEOUT": "20"})
    o = outs[who]
    assert o["wait"].startswith("RingReduceError: rank ") and \
        "ringreduce.destroy() was called while this rank waited for" in o["wait"], o
    assert o["wait_secs"] < 1.0, o
    for r, v in enumerate(outs):
        assert v["connect_threads"] == 0 and v["reinit_sum"] == 3.0, (r, v)
        assert v["connect_threads_at_destroy"] == 0, (r, v)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport,src", [("shm", "peer"), ("tcp", "peer"), ("tcp", None)])
def test_group_destroy_stops_a_pending_first_irecv(transport: str, src: str | None) -> None:
    outs = run_world(3, "p2p_workers:irecv_at_group_destroy", src, timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport})
    o = outs[0]
    assert o["wait"].startswith("RingReduceError: rank 0: group1 was destroyed while this rank "
                                "waited for"), o
    assert o["wait_secs"] < 2.0, o
    for r, v in enumerate(outs):
        assert v["connect_threads"] == 0 and v["sum"] == 6.0, (r, v)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world,transport", SETUPS)
def test_recv_from_any_source(world: int, transport: str) -> None:
    outs = run_world(world, "p2p_workers:any_source", timeout=170,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60"})
    _assert_no_fails(outs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_receives_from_any_rank_take_a_senders_messages_in_posting_order(world: int) -> None:
    outs = run_world(world, "p2p_wait_workers:any_source_posts_in_order", 15, timeout=100,
                     env={"RINGREDUCE_TIMEOUT": "30"})
    assert outs[0]["bad"] == [], outs[0]


@pytest.mark.timeout(120)
def test_recv_from_any_source_times_out() -> None:
    outs = run_world(2, "p2p_workers:any_source_timeout", timeout=90,
                     env={"RINGREDUCE_TIMEOUT": "3"})
    assert outs[1] == "sent"
    assert outs[0].startswith("CollectiveTimeout") and "tag=3" in outs[0], outs


@pytest.mark.timeout(90)
def test_first_message_on_a_tag_waits_like_any_peer() -> None:
    outs = run_world(2, "p2p_workers:first_message_waits", timeout=60,
                     env={"RINGREDUCE_TIMEOUT": "3", "RINGREDUCE_CONNECT_TIMEOUT": "1"})
    assert outs[1]["late"] is True, outs
    assert outs[1]["crossed_small"] is True, outs
    for o in outs:
        kind, took, named = o["crossed"]
        assert kind == "CollectiveTimeout" and named and 2.8 <= took < 8, outs


@pytest.mark.timeout(90)
def test_a_first_message_wait_reports_its_stall_with_what_the_peer_does() -> None:
    """A rank waiting for a peer's first message on a tag (through the store) logs after
    RINGREDUCE_STALL_WARN, as a collective's stall report does, whom it waits for and what
    that rank was doing: here an all-reduce waiting for it (the calls do not meet). Before,
    nothing until the timeout."""
    outs = run_world_raw(3, "p2p_wait_workers:busy_peer", timeout=60,
                         env={"RINGREDUCE_TIMEOUT": "4", "RINGREDUCE_STALL_WARN": "1"})
    for o in outs:
        assert o.ok and o.value in ("CollectiveTimeout", "PeerFailure", "RingReduceError"), \
            o.describe()
    err = outs[0].stderr
    assert err.count("stall: rank 0 has waited") == 1, err[-2000:]
    line = err[err.index("stall: rank 0 has waited"):].split("\n", 1)[0]
    assert "rank 1 to post a send, recv" in line and "on tag 1" in line, line
    assert "not there yet: world rank(s) 1;" in line and "at allreduce #" in line, line
    assert "p2p_wait_workers.py:" in line and "it gives up in" in line, line


@pytest.mark.timeout(60)
def test_a_timeout_names_a_peers_receive_on_a_channel() -> None:
    outs = run_world(2, "p2p_wait_workers:world_wait_beside_a_receive", timeout=45,
                     env={"RINGREDUCE_TIMEOUT": "20"}, rank_env={0: {"RINGREDUCE_TIMEOUT": "3"}})
    assert outs[1] == "ok", outs
    assert re.search(r"rank 1 .*meanwhile in recv #2 on p2p 0->1 tag 5", outs[0]), outs[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_a_collectives_future_does_not_wait_behind_a_prefetched_receive(world: int) -> None:
    outs = run_world(world, "p2p_wait_workers:prefetched_receive_beside_a_collective",
                     timeout=45, env={"RINGREDUCE_TIMEOUT": "15"})
    n = world * (world + 1) / 2
    assert [o["x"] for o in outs] == [[n] * 4] * world, outs
    assert outs[0]["y"] == [8.0] * 3 and outs[1]["y"] == [7.0] * 3, outs


@pytest.mark.timeout(90)
def test_a_stall_report_never_waits_for_a_collective_in_flight() -> None:
    outs = run_world_raw(2, "p2p_wait_workers:stall_beside_a_collective", timeout=60,
                         env={"RINGREDUCE_TIMEOUT": "15", "RINGREDUCE_STALL_WARN": "0.5"})
    for o in outs:
        assert o.ok and o.value["ok"] and o.value["secs"] < 8, o.describe()
    assert "stall: rank 0 has waited" in outs[0].stderr, outs[0].stderr[-2000:]


@pytest.mark.timeout(90)
def test_destroyed_channels_leave_the_process_wide_family_table() -> None:
    outs = run_world(3, "p2p_wait_workers:channels_leave_their_family", timeout=80)
    for o in outs:
        assert o["before"] == [0, 0] and o["during"] == [1, 4] and o["after"] == [0, 0], outs


@pytest.mark.timeout(120)
def test_many_tags_work_and_warn_about_their_cost() -> None:
    """Every (peer, tag) gets its own channels, kept until destroy(): right results on 64
    tags, and one warning per rank when the 64th pair of channels is made, saying to use
    fewer tags."""
    outs = run_world_raw(2, "p2p_workers:many_tags", 64, timeout=100,
                         env={"RINGREDUCE_TRANSPORT": "tcp"})
    for o in outs:
        assert o.ok and o.value == [], o.describe()
        assert o.stderr.count("point-to-point channels") == 1, o.stderr[-2000:]
        assert "128 point-to-point channels (64 distinct tags)" in o.stderr, o.stderr[-2000:]


@pytest.mark.timeout(120)
def test_torch_errors_name_the_users_line() -> None:
    outs = run_world(2, "p2p_workers:torch_call_sites", timeout=90, init=False,
                     env={"RINGREDUCE_TIMEOUT": "20"})
    for r, o in enumerate(outs):
        assert re.search(r"during allgather #\d+ .*called from p2p_workers\.py:\d+", o["gather"]), \
            (r, o)
    assert re.search(r"during recv #1 on p2p 0->1 tag 0 .*called from p2p_workers\.py:\d+",
                     outs[1]["p2p"]), outs[1]


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_ctrl_c_in_a_receive_from_any_rank_says_what_it_interrupted() -> None:
    out = run_world(2, "p2p_workers:interrupted_any_source", timeout=40)[0]
    assert out["error"] == "KeyboardInterrupt" and out["secs"] < 3, out
    assert any("interrupted: rank 0 during recv(src=None, tag=3)" in n for n in out["notes"]), out


@pytest.mark.timeout(60)
@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_ctrl_c_in_a_first_receive_says_what_it_interrupted() -> None:
    out = run_world(2, "p2p_workers:interrupted_any_source", 1, timeout=40)[0]
    assert out["error"] == "KeyboardInterrupt" and out["secs"] < 3, out
    assert any("interrupted: rank 0 while making the channel 1 -> 0 for tag 3" in n
               and "waiting for rank 1" in n for n in out["notes"]), out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["isend", "send"])
def test_a_helper_thread_that_cannot_start_fails_its_post_only(how: str) -> None:
    outs = run_world(2, "p2p_workers:helper_thread_refused", how, timeout=40)
    assert "thread limit" in outs[0]["first"] and "pids.max" in outs[0]["first"], outs[0]
    assert outs[0]["second_done"] is True and outs[1]["got"] == [7.0] * 4, outs
    assert [o["destroy"] for o in outs] == ["ok", "ok"], outs
