"""DDP under faults (issue #7 item 5): uneven inputs with join() (final models identical and
equal to a single-process replay of the schedule), throw_on_early_termination, ranks that
disagree inside join(), ranks whose models differ, uneven inputs without join(), and a rank
SIGKILLed in the middle of backward (every survivor raises PeerFailure naming it within 5 s,
from backward()). Every multi-process run has a hard timeout (tests/_spawn.py) below its
pytest timeout, so a hang is a failed test.

The clean scenarios run in one launch per world size (ddp_fault_workers.join_suite); the
fault scenarios poison the communicator and get a launch each.
"""

from __future__ import annotations

import re
from pathlib import Path

import ddp_fault_workers as W
import pytest
import torch
import torch.nn.functional as F
from _spawn import run_world, run_world_raw
from test_ddp import _get  # one helper to unpack scenario results, shared with test_ddp

EXACT = 1e-5  # fp32 reductions in a different order than the single-process replay
DETECT_S = 5.0


# ----------------------------------------------------------------------------- reference


def replay(world: int, kind: str = "mlp", variant: str = "uneven",
           divide_by_initial_world_size: bool = True, micro: int = 1) -> list:
    """Single-process replay of join() training: each step, the summed gradients of the
    ranks that still have batches (zero from the joined ones), divided by the initial world
    size (or by the number of active ranks), plain SGD. Parameters as nested lists."""
    model = W.init_model(kind)
    counts = [W.num_batches(r, world, variant) for r in range(world)]
    params = list(model.parameters())
    for s in range(max(counts)):
        active = [r for r in range(world) if counts[r] > s]
        total = [torch.zeros_like(p) for p in params]
        for r in active:
            for m in range(micro):
                model.zero_grad(set_to_none=True)
                x, y = W.batch(r, s, m)
                kw = {"use_c": W.uses_c(r, s)} if kind == "mixed" else {}
                F.mse_loss(model(x, **kw), y).backward()
                for t, p in zip(total, params):
                    if p.grad is not None:
                        t += p.grad
        div = world if divide_by_initial_world_size else len(active)
        with torch.no_grad():
            for t, p in zip(total, params):
                p -= W.LR * (t / div)
    return W.params_list(model)


def _maxdiff(a: list, b: list) -> float:
    return max(float((torch.tensor(x) - torch.tensor(y)).abs().max()) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- join()


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def suite(request):
    world = request.param
    return world, run_world(world, W.join_suite, timeout=60)


JOIN_CASES = {  # scenario: replay arguments (micro-batches per step, forwards per step)
    "initial": ({}, 1),
    "active": ({"divide_by_initial_world_size": False}, 1),
    "zero": ({"variant": "zero"}, 1),
    "hook_view": ({}, 1),
    "mixed": ({"kind": "mixed", "micro": 2}, 3),
    "static": ({"variant": "zero"}, 1),
    "between": ({}, 1),  # a no_grad() forward between forward and backward: no collective
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(JOIN_CASES))
def test_join_uneven_inputs_match_replay(suite, name):
    world, res = _get(suite, name)
    kw, forwards = JOIN_CASES[name]
    expect = replay(world, **kw)
    counts = [W.num_batches(r, world, kw.get("variant", "uneven")) for r in range(world)]
    for rank, r in enumerate(res):
        assert r["params"] == res[0]["params"], f"rank {rank}'s final model differs from rank 0's"
        assert r["buffers"] == res[0]["buffers"], f"rank {rank}'s final buffers differ"
        diff = _maxdiff(r["params"], expect)
        assert diff < EXACT, f"rank {rank}: max |param - replay| = {diff}"
        assert r["iterations"] == counts[rank] * forwards
        assert r["shadowed"] == (max(counts) - counts[rank]) * forwards
        assert r["buckets"] >= 3 and r["comm_ok"]


@pytest.mark.timeout(120)
def test_join_divisor_matters(suite):
    """divide_by_initial_world_size=False really divides by the active count (the two
    replays differ, and each run matched its own)."""
    world, _ = suite
    assert _maxdiff(replay(world), replay(world, divide_by_initial_world_size=False)) > 1e-4


@pytest.mark.timeout(120)
def test_join_throw_on_early_termination(suite):
    _, res = _get(suite, "throw")
    for rank, r in enumerate(res):
        assert r["type"] == "UnevenInputsError" and r["msg"], f"rank {rank}: {r}"
        assert re.search(r"rank\(s\) \[0\] exhausted their inputs", r["msg"]), r["msg"]
        assert r["done"] == 3, f"rank {rank} raised after {r['done']} steps, expected 3"
        assert r["comm_ok"]


@pytest.mark.timeout(120)
def test_join_ranks_that_disagree_raise_everywhere(suite):
    _, res = _get(suite, "disagree")
    for rank, r in enumerate(res):
        assert r["msg"] and "disagree" in r["msg"], f"rank {rank}: {r['msg']}"
        assert "no_sync()" in r["msg"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,where,shapes", [
    ("shape", "parameter 2 ('1.weight'", ["(4, 8) float32", "(5, 8) float32"]),
    ("count", "parameter 4", ["none (it has 4 parameters)", "(4, 4) float32"]),
    ("dtype", "parameter 0 ('0.weight'", ["(8, 8) float32", "(8, 8) float64"]),
    ("buffer", "buffer 0 ('stats'", ["(3,) float32", "(6,) float32"]),
    ("extra_buffer", "at buffer 0 (", ["none (it has 4 parameters and 0 buffers)",
                                       "(2,) float32"]),
])
def test_models_differ_raise_at_construction(suite, kind, where, shapes):
    """Every rank names the same entry in the same words (an extra buffer on one rank was
    "parameter 4" on the ranks without it, found by a helper)."""
    world, res = _get(suite, "differ")
    odd = world - 1
    for rank, r in enumerate(res):
        assert r["comm_ok"]
        e = r[kind]
        assert e["type"] == "ValueError", f"rank {rank}, {kind}: {e}"
        msg = e["msg"]
        assert where in msg, msg
        assert f"rank(s) [{odd}] differ from rank 0" in msg, msg
        assert f"rank 0: {shapes[0]}" in msg and f"rank {odd}: {shapes[1]}" in msg, msg


# ----------------------------------------------------------------------------- faults

# Overlap on: the victim dies with buckets in flight; off (RINGREDUCE_DDP_OVERLAP): before
# any bucket is launched, while the survivors already wait at the end of their backward.
_KILL = [(w, v, t, "on") for w in (2, 3) for v in (0, w - 1) for t in ("tcp", "shm")]
_KILL += [(3, v, t, "off") for v in (0, 2) for t in ("tcp", "shm")]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world,victim,transport,overlap", _KILL,
                         ids=[f"world{w}-victim{v}-{t}-overlap-{o}" for w, v, t, o in _KILL])
def test_rank_killed_in_backward(world, victim, transport, overlap, tmp_path: Path):
    stamp = tmp_path / "killed_at"
    outs = run_world_raw(world, W.kill_in_backward, victim, str(stamp), timeout=40,
                         env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30",
                              "RINGREDUCE_DDP_OVERLAP": overlap})
    story = "\n".join(o.describe() for o in outs)
    assert outs[victim].returncode == -9 and not outs[victim].has_result, story
    t_kill, launched = stamp.read_text().split()
    if overlap == "on":
        assert int(launched) >= 1, "the victim died before any bucket was launched"
    else:
        assert int(launched) == 0, f"overlap off, yet {launched} buckets launched in backward"
    for o in outs:
        if o.rank == victim:
            continue
        assert o.ok, story
        v = o.value
        assert v["type"] == "PeerFailure" and v["is_rr"], f"rank {o.rank}: {v}"
        assert v["where"] == "backward" and v["step"] == 3, f"rank {o.rank}: {v}"
        assert re.search(rf"\brank {victim}\b", v["msg"]), f"rank {o.rank}: {v['msg']}"
        # peer_rank is the rank this one heard it from (with 3 ranks possibly a survivor
        # relaying the abort); the message names the dead rank either way.
        assert isinstance(v["peer_rank"], int) and 0 <= v["peer_rank"] < world, v
        latency = v["t_err"] - float(t_kill)
        assert latency < DETECT_S, f"rank {o.rank} noticed the kill after {latency:.1f} s"
        assert any("optimizer.step()" in n for n in v["notes"]), v["notes"]
        assert v["after"] and "init" in v["after"], v["after"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_uneven_inputs_without_join_name_the_rank(world, tmp_path: Path):
    stamp = tmp_path / "done_at"
    outs = run_world_raw(world, W.uneven_without_join, str(stamp), timeout=40,
                         env={"RINGREDUCE_TIMEOUT": "30"})
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    assert outs[0].value["done"] == 3 and outs[0].value["error"] is None, story
    t_done = float(stamp.read_text())
    for o in outs[1:]:
        v = o.value
        assert v["type"] == "PeerFailure", f"rank {o.rank}: {v}"
        assert re.search(r"\brank 0\b", v["msg"]), v
        assert v["step"] == 3, v  # the first step rank 0 did not take
        assert v["t_err"] - t_done < DETECT_S, f"rank {o.rank}: {v['t_err'] - t_done:.1f} s"
        assert any("model.join()" in n for n in v["notes"]), v["notes"]


# ----------------------------------------------------------------------------- world size 1


def test_join_is_a_no_op_with_world_size_one():
    import ringreduce as rr
    from ringreduce.ddp import DistributedDataParallel as DDP

    created = not rr.is_initialized()
    if created:
        rr.init(rank=0, world_size=1)
    try:
        if rr.get_world_size() != 1:
            pytest.skip("ringreduce is initialised with world size > 1 in this process")
        ddp = DDP(W.init_model("mlp"))
        with ddp.join(throw_on_early_termination=True) as j:
            x, y = W.batch(0, 0)
            F.mse_loss(ddp(x), y).backward()
        assert j.iterations == 0 and j.shadowed == 0
    finally:
        if created:
            rr.destroy()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world,transport", [(2, "shm"), (3, "tcp")])
def test_torch_ddp_on_the_backend_names_a_killed_rank(world, transport):
    """Before, every survivor segfaulted in torch's reducer (the failed Future's value was
    the exception object)."""
    victim = world - 1
    outs = run_world_raw(world, W.torch_ddp_peer_killed, victim, timeout=60, init=False,
                         env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    story = "\n".join(o.describe() for o in outs)
    for o in outs:
        if o.rank == victim:
            assert o.returncode == -9, story
            continue
        assert o.ok, story
        v = o.value
        assert v["error"] and "PeerFailure" in v["error"], f"rank {o.rank}: {v}"
        assert re.search(rf"\brank {victim}\b", v["error"]), f"rank {o.rank}: {v}"
        assert v["step"] == 3 and v["secs"] < DETECT_S, f"rank {o.rank}: {v}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_ctrl_c_in_torch_ddp_backward_is_a_keyboard_interrupt(world):
    outs = run_world(world, W.torch_ddp_ctrl_c_in_backward, timeout=60, init=False,
                     env={"RINGREDUCE_TIMEOUT": "30"})
    assert outs[0]["error"] == "KeyboardInterrupt: ", outs[0]
    assert all(o["error"] is None for o in outs[1:]), outs
    # The step's all-reduce completed: d(sum)/d(bias) = 4 on every rank, averaged.
    assert all(o["grad"] == [4.0] * 16 for o in outs), outs

