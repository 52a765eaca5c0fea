"""The cost model at cluster scale (issue #14 item 5): `ringreduce-bench --model` and
_C.predict_allreduce_cluster, checked against the flat model the core picks with and against
what the formulas must do as hosts, ranks per host and sizes grow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ringreduce import _C

ALPHA, BETA = 8.4, 0.176  # params.h defaults (bench/alpha_beta.json)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 12, 64])
@pytest.mark.parametrize("size", [8, 4096, 1 << 20, 64 << 20])
def test_one_rank_per_host_is_the_flat_model(n: int, size: int) -> None:
    opts = {"alpha_us": ALPHA, "beta_ns_per_byte": BETA}
    for algo, code in (("ring", 1), ("recursive_doubling", 2)):
        flat = _C.predict_allreduce(code, n, size, opts)
        cluster = _C.predict_allreduce_cluster(algo, n, 1, size, ALPHA, BETA)
        assert cluster == pytest.approx(flat, rel=1e-12), (algo, n, size)


def test_shapes_of_the_predictions() -> None:
    def t(algo: str, hosts: int, local: int, size: int, beta: float = 0.08) -> float:
        return _C.predict_allreduce_cluster(algo, hosts, local, size, 5.0, beta)

    # Latency-bound: recursive doubling grows with log n, the ring with n.
    assert t("recursive_doubling", 512, 8, 8) < t("ring", 512, 8, 8) / 50
    # Hierarchical crosses hosts 2(H-1) times instead of 2(n-1): far below the flat ring at
    # medium sizes on many hosts, and both move ~2x the message through each host's link.
    assert t("hier", 64, 8, 1 << 20) < t("ring", 64, 8, 1 << 20) / 3
    big = 1 << 30
    link_bound = 2 * 63 / 64 * big * 0.08e-9  # what each host's link must carry
    # The flat ring's steps wait for their slowest hop: inside a host, loopback TCP.
    hop_bound = 2 * 511 / 512 * big * 0.176e-9
    assert hop_bound < t("ring", 64, 8, big) < 1.2 * hop_bound
    assert link_bound < t("hier", 64, 8, big) < t("ring", 64, 8, big)
    # Bandwidth-bound: recursive doubling ships the whole message log n times.
    assert t("recursive_doubling", 64, 8, big) > 4 * t("ring", 64, 8, big)
    # A faster link never makes anything slower; more bytes never make anything faster.
    for algo in ("ring", "recursive_doubling", "binomial_tree", "hier"):
        assert t(algo, 8, 8, 1 << 24, beta=0.01) <= t(algo, 8, 8, 1 << 24, beta=0.08)
        assert t(algo, 8, 8, 1 << 10) <= t(algo, 8, 8, 1 << 20)
    with pytest.raises(ValueError, match="recursive_doubling"):
        _C.predict_allreduce_cluster("mesh", 2, 2, 8, 5.0, 0.08)


def test_model_cli_prints_a_table_and_writes_json(tmp_path) -> None:
    out = tmp_path / "model.json"
    p = subprocess.run([sys.executable, "-m", "ringreduce.bench", "--model", "--hosts", "1,64,512",
                        "--ranks-per-host", "8", "--link-gbit", "100", "--json", str(out)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    assert "n=4096" in p.stdout and "1G" in p.stdout, p.stdout
    res = json.loads(out.read_text())
    rows = {(r["n"], r["bytes"]): r for r in res["rows"]}
    assert len(rows) == 3 * 10
    assert rows[(4096, 8)]["pick"] == "recursive_doubling"
    assert rows[(4096, 1 << 30)]["pick"] in ("ring", "hier")
    assert "hier" not in rows[(8, 8)]["predicted_s"]  # one host: nothing to be hierarchical over
    bad = subprocess.run([sys.executable, "-m", "ringreduce.bench", "--model", "--hosts", "0"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "whole numbers >= 1" in bad.stderr


def test_the_pick_is_the_fastest_runnable_prediction() -> None:
    """pick_allreduce_cluster (what the core's planner runs for "auto" across hosts) is the
    fastest of ring / recursive doubling / hierarchical, except that hierarchical is kept
    within 15% of the ring; hierarchical never on one host or with one rank per host."""
    runnable = ("ring", "recursive_doubling", "hier")
    seen = set()
    for hosts, local in ((1, 8), (2, 1), (2, 2), (4, 2), (8, 8), (64, 8), (512, 8)):
        for size in (8 << (3 * i) for i in range(10)):
            for beta in (0.02, 0.08, BETA, 8.0):
                t = {a: _C.predict_allreduce_cluster(a, hosts, local, size, ALPHA, beta)
                     for a in runnable}
                if hosts == 1 or local == 1:
                    del t["hier"]
                want = min(t, key=t.get)
                if want == "ring" and "hier" in t and t["hier"] <= 1.15 * t["ring"]:
                    want = "hier"
                got = _C.pick_allreduce_cluster(hosts, local, size, ALPHA, beta)
                assert got == want, (hosts, local, size, beta, t)
                seen.add(got)
    assert seen == set(runnable)  # every algorithm is the pick somewhere
    # 2 hosts x 2 ranks, this machine's defaults: latency-bound -> recursive doubling,
    # bandwidth-bound -> hierarchical.
    assert _C.pick_allreduce_cluster(2, 2, 8, ALPHA, BETA) == "recursive_doubling"
    assert _C.pick_allreduce_cluster(2, 2, 64 << 20, ALPHA, BETA) == "hier"


def test_flat_ring_across_hosts_waits_for_its_slowest_hop() -> None:
    """With several ranks per host the flat ring's hops inside a host run over loopback TCP
    (beta 0.176 ns/B): a faster link between hosts cannot make a step faster than that."""
    fast = _C.predict_allreduce_cluster("ring", 2, 4, 64 << 20, ALPHA, 0.01)
    one_per_host = _C.predict_allreduce_cluster("ring", 8, 1, 64 << 20, ALPHA, BETA)
    assert fast == pytest.approx(one_per_host, rel=0.02)
