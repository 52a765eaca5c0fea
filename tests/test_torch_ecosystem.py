"""torch's own distributed features on the "ringreduce" backend give what they give on
gloo (issue #12): 2-D DeviceMesh subgroups, functional collectives, FSDP2 (fully_shard)
training, ZeroRedundancyOptimizer, object collectives, torch.distributed.checkpoint,
batch_isend_irecv -- each run once per backend, same seeds, results compared. Plus a device
map with ringreduce on CPU beside another backend."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _spawn import run_world
from torch_eco_workers import CHECKS

pytestmark = pytest.mark.timeout(400)  # the first test also runs both worlds (~1 min)
_ENV = {k: os.environ[k] for k in ("RINGREDUCE_TRANSPORT",) if k in os.environ}


@pytest.fixture(scope="module", params=[4, 2], ids=["world4", "world2"])
def runs(request, tmp_path_factory):
    world = request.param
    tmp = str(tmp_path_factory.mktemp(f"eco{world}"))
    out = {}
    for backend in ("gloo", "ringreduce"):
        out[backend] = run_world(world, "torch_eco_workers:run_checks", backend, tmp,
                                 timeout=150, env=_ENV, init=False)
    return world, out


def test_ringreduce_is_the_c10d_backend(runs):
    _, out = runs
    for r in out["ringreduce"]:
        assert r["backend"] == "ringreduce" and r["cpu_backend"] == "RingReduceBackend", r


def _close(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if a and all(isinstance(x, (int, float)) for x in a):
            return len(a) == len(b) and np.allclose(a, b, rtol=1e-5, atol=1e-6)
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_same_as_gloo(runs, check):
    _, out = runs
    for rank, (g, r) in enumerate(zip(out["gloo"], out["ringreduce"])):
        assert "error" not in (g[check] if isinstance(g[check], dict) else {}), g[check]
        assert not (isinstance(r[check], dict) and "error" in r[check]), \
            f"rank {rank}: {r[check]['error']}"
        assert _close(g[check], r[check]), f"rank {rank}: gloo {g[check]} != rr {r[check]}"
        if check in ("fsdp2", "hsdp"):
            assert r[check]["moved"] > 1e-4  # training changed the parameters


def test_known_values(runs):
    """Spot checks against numpy, so that gloo and ringreduce cannot agree on a wrong answer."""
    world, out = runs
    for rank, r in enumerate(out["ringreduce"]):
        assert r["p2p_batch"] == [float((rank - 1) % world)] * 4
        assert r["objects"][0] == [{"rank": q, "name": "r" * q} for q in range(world)]
        assert r["objects"][2] == [f"to {rank}"]
        ar, ag, rs = r["funcol"]
        assert np.allclose(ar, np.arange(6) * sum(range(1, world + 1)))
        assert np.allclose(ag, np.concatenate([np.arange(6) * (q + 1) for q in range(world)]))
        full = sum(np.arange(2.0 * world) + q for q in range(world))
        assert np.allclose(rs, full[2 * rank:2 * rank + 2])
        assert r["checkpoint"] == [list(np.arange(7.0) * 3), 5]
        assert r["fp8_p2p"] == [0.5 * ((rank - 1) % world + 1)] * 5  # exact in e4m3
        part = full[2 * rank:2 * rank + 2]  # sums of small integers: exact in float16
        assert r["complex32"] == [part[0], -part[0], part[1], -part[1]]


@pytest.mark.timeout(120)
def test_device_map_keeps_both_backends():
    res = run_world(2, "torch_eco_workers:device_map", timeout=90, env=_ENV, init=False)
    for r in res:
        assert r == {"cpu": "RingReduceBackend", "cuda": "ProcessGroupGloo",
                     "sum": [3.0, 3.0, 3.0]}, r


@pytest.mark.timeout(120)
def test_rank_0_stays_until_late_ranks_are_done_with_its_store():
    res = run_world(4, "torch_eco_workers:late_p2p", timeout=90, env=_ENV, init=False)
    for rank, r in enumerate(res):
        assert r == [float((rank - 1) % 4)] * 4, (rank, r)


@pytest.mark.timeout(120)
def test_a_local_sync_group_outlives_a_non_member_that_left():
    res = run_world(3, "torch_eco_workers:local_sync_group_after_a_leaver", timeout=90,
                    env=_ENV, init=False)
    assert res == [[0.0, 3.0, 6.0], [0.0, 3.0, 6.0], None], res
