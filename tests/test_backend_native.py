"""The torch backend's synchronous path: dist.all_reduce / broadcast / barrier without
async_op run on the core straight from the C++ adapter (no Python in between). Results
against numpy for every dtype x op x awkward length, world sizes 2-5 and an odd subgroup;
the Work it returns; a dead peer named through it; a destroyed communicator refused; the
user's call site still recorded.
"""

from __future__ import annotations

import re

import pytest
from _spawn import run_world, run_world_raw
from _stall import FAST_HB, late_rank_reports


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world,transport", [(2, "shm"), (3, "tcp"), (4, "shm"), (5, "auto")])
def test_sync_calls_match_numpy(world: int, transport: str) -> None:
    results = run_world(world, "backend_native_workers:sync_calls", timeout=200, init=False,
                        env={"RINGREDUCE_TRANSPORT": transport})
    for rank, r in enumerate(results):
        assert r["bad"] == [], f"rank {rank}:\n" + "\n".join(r["bad"][:20])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_dead_peer_named_by_dist_all_reduce(transport: str) -> None:
    world, victim = 3, 1
    outs = run_world_raw(world, "backend_native_workers:peer_dies", victim, timeout=60,
                         init=False, env={"RINGREDUCE_TRANSPORT": transport, **FAST_HB})
    story = "\n".join(o.describe() for o in outs)
    assert outs[victim].returncode == 3, story
    for o in outs:
        if o.rank == victim:
            continue
        assert o.ok, story
        first = o.value["first"]
        assert first is not None and first["is_peer"], f"rank {o.rank}: {first}\n{story}"
        assert re.search(rf"\brank {victim}\b", first["msg"]), first
        # saw it itself (the victim's connection closed), or heard it from a survivor (whose
        # abort frame names the victim: relayed_by is that survivor)
        assert first["cause"] == "closed" and first["peer_rank"] == victim, first
        assert first["relayed_by"] not in (victim, o.rank), first
        # The victim took part in collectives #1-#3: a heartbeat from before them says so
        # (it read "idle after collective #0" as if current; found by a helper).
        for m in re.finditer(r"(?:idle after collective|at \w+) #(\d+)", first["msg"]):
            if int(m.group(1)) < 3:
                # ("rank N has finished" where it came relayed from the rank N that found it)
                assert re.search(r"\(as of its last report; (this rank|rank \d+) has finished #",
                                 first["msg"]), first
        assert o.value["t_err"] < 2.5, o.value
        assert o.value["second"] is not None, "the next call must be refused"
        assert o.value["t_destroy"] < 5, o.value
    causes = [o.value["first"]["cause"] for o in outs if o.rank != victim]
    assert "closed" in causes, f"no survivor saw the victim's connection close: {causes}"


@pytest.mark.timeout(90)
def test_destroyed_communicator_is_refused() -> None:
    for r in run_world(2, "backend_native_workers:after_destroy", timeout=60, init=False):
        assert r["ok_before"], r
        after = r["after"]
        assert after is not None and after["type"] == "RingReduceError", after
        assert "destroyed" in after["msg"] and "ringreduce.init()" in after["msg"], after


@pytest.mark.timeout(90)
def test_stall_report_names_the_dist_call_site() -> None:
    late_rank_reports("backend_native_workers:late_rank", init=False,
                      ok=lambda v: v["wrong"] == 0)


@pytest.mark.timeout(90)
def test_failed_async_work_reports_its_error() -> None:
    for r in run_world(2, "backend_native_workers:async_mismatch", timeout=60, init=False):
        assert r["ok_exc"] == "None", r
        assert r["wait"].startswith("CollectiveMismatch: ") and "count mismatch" in r["wait"], r
        assert r["success"] is False, r
        assert r["exc"] == r["wait"], r  # the same error object's text
        assert "CollectiveMismatch" in r["future"] and "count mismatch" in r["future"], r


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_polled_async_work_matches_wait(transport: str) -> None:
    for r in run_world(3, "backend_native_workers:async_polling", timeout=90, init=False,
                       env={"RINGREDUCE_TRANSPORT": transport}):
        assert r["bad"] == [], r
        assert r["polled"] == [True, False, "CollectiveMismatch"], r


@pytest.mark.timeout(90)
def test_store_host_killed_during_a_p2p_setup_is_named() -> None:
    outs = run_world_raw(3, "backend_native_workers:store_host_dies_in_p2p_setup", timeout=60,
                         init=False, env=FAST_HB)
    story = "\n".join(o.describe() for o in outs)
    assert outs[1].ok, story
    got = outs[1].value
    assert got["is_peer"] and got["peer_rank"] == 0 and got["cause"] == "closed", got
    assert got["secs"] < 10, got
