"""Processes forked after init that make a world of their own (tests/fork_workers.py); the
rest of fork's story (refused collectives, get_rank() answering, DataLoader workers) is in
tests/test_launcher.py's fork scripts."""

from __future__ import annotations

import pytest
from _spawn import free_port, run_world


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3])
def test_a_forked_child_makes_its_own_world_without_touching_the_parents(world: int) -> None:
    outs = run_world(world, "fork_workers:child_worlds", free_port(), timeout=100,
                     env={"RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_CONNECT_TIMEOUT": "20",
                          "RINGREDUCE_TIMEOUT": "30"})
    for r, v in enumerate(outs):
        assert v["ok"] and v["child"] == 0, (r, v)
        assert v["said"].startswith("this process was forked from process"), (r, v)
        assert "set its own MASTER_PORT" in v["said"], (r, v)


@pytest.mark.timeout(90)
def test_a_forked_childs_torch_subgroup_is_refused_naming_the_parent() -> None:
    outs = run_world(2, "fork_workers:torch_group_in_child", timeout=80, init=False)
    for r, v in enumerate(outs):
        assert v["ok"], (r, v)
        assert "the parent of this forked process" in v["said"], (r, v)


@pytest.mark.timeout(60)
def test_a_forked_child_waiting_for_a_future_of_the_parents_work_is_told_at_once() -> None:
    outs = run_world(2, "fork_workers:future_of_a_parents_work", timeout=45,
                     env={"RINGREDUCE_TIMEOUT": "30"})
    assert "parent of this forked process" in outs[0]["said"], outs[0]
    assert [o["x"] for o in outs] == [[3.0] * 4] * 2, outs
