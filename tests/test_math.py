"""Pure math exposed by the extension (no processes, no sockets): chunking and the
all-reduce cost model. Chunking is tested exhaustively for 1..17 parts and awkward counts
(house style item 5); the cost model against the formula documented in
csrc/collectives/cost_model.cc and for the properties "auto" relies on."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from ringreduce import _C

PARTS = range(1, 18)
PRIMES = [2, 3, 5, 7, 11, 13, 17, 1009, 65537, 1_000_003]
BIG = [2**31 - 1, 2**31, 2**32 + 1, 2**40 + 3, 2**62 + 5, 2**64 - 1]
RING, TREE = 1, 2
# Defaults of rr::Options (csrc/core/params.h) and the fixed gamma of cost_model.cc: what
# bench/measure_alpha_beta.py measured into bench/alpha_beta.json.
_AB = json.loads((Path(__file__).resolve().parent.parent / "bench" / "alpha_beta.json").read_text())
ALPHA_S, BETA_S_PER_B, GAMMA_S_PER_B = (_AB["alpha_us"] * 1e-6, _AB["beta_ns_per_byte"] * 1e-9,
                                        _AB["gamma_ns_per_byte"] * 1e-9)


def _counts(parts: int) -> list[int]:
    near = [parts - 1, parts, parts + 1, 2 * parts - 1, 2 * parts + 1, parts * parts]
    seg = [4096, 4095, 4097, 131072 * parts + 1]
    return sorted({c for c in [0, 1, 2, 3] + near + PRIMES + BIG + seg if c >= 0})


@pytest.mark.parametrize("parts", PARTS)
def test_chunks_tile_the_range(parts: int) -> None:
    for count in _counts(parts):
        lens = [_C.chunk_len(count, parts, i) for i in range(parts)]
        offs = [_C.chunk_offset(count, parts, i) for i in range(parts)]
        assert offs[0] == 0, (count, parts)
        for i in range(parts - 1):
            assert offs[i + 1] == offs[i] + lens[i], f"gap/overlap at chunk {i}: {count=} {parts=}"
        assert offs[-1] + lens[-1] == count, f"chunks do not end at {count=} ({parts=})"
        assert sum(lens) == count
        assert max(lens) - min(lens) <= 1, f"unbalanced chunks {lens} for {count=}"
        # Documented layout: the first count % parts chunks carry the extra element.
        q, rem = divmod(count, parts)
        assert lens == [q + 1] * rem + [q] * (parts - rem), (count, parts)


def test_chunks_when_fewer_elements_than_parts() -> None:
    for parts in PARTS:
        for count in range(parts):
            lens = [_C.chunk_len(count, parts, i) for i in range(parts)]
            assert lens == [1] * count + [0] * (parts - count)
            # Empty chunks sit at the end of the range, not past it.
            assert all(_C.chunk_offset(count, parts, i) == count for i in range(count, parts))


def test_chunk_arguments_are_checked_by_type() -> None:
    with pytest.raises(TypeError):
        _C.chunk_len(-1, 2, 0)  # size_t: a negative count is refused, not wrapped
    with pytest.raises(TypeError):
        _C.chunk_offset(2**64, 2, 0)


@pytest.mark.parametrize("local", [1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 1000])
def test_shm_slots_hold_512k_slices_within_the_host_budget(local: int) -> None:
    chunk, copy = _C.shm_slot_bytes(local, 4)
    assert chunk % 4096 == 0 and copy == 512 << 10 <= chunk
    if local * 4 * local * (512 << 10) <= 32 << 20:  # n slices of 512 KiB fit the budget
        assert chunk == local * (512 << 10)
    else:  # the host's slots stay within 32 MiB unless that is below 512 KiB per slot
        assert local * 4 * chunk <= 32 << 20 or chunk == 512 << 10
        assert chunk >= 512 << 10


def test_shm_slot_sizes_at_common_rank_counts() -> None:
    assert _C.shm_slot_bytes(2, 4) == (1 << 20, 512 << 10)
    assert _C.shm_slot_bytes(4, 4) == (2 << 20, 512 << 10)
    assert _C.shm_slot_bytes(8, 4) == (1 << 20, 512 << 10)
    # A large /dev/shm changes nothing; 0 means its size is unknown.
    assert _C.shm_slot_bytes(4, 4, 24 << 30) == _C.shm_slot_bytes(4, 4, 0) == (2 << 20, 512 << 10)


@pytest.mark.parametrize("capacity_mib", [1, 64, 128, 256, 511, 512])
@pytest.mark.parametrize("local", [1, 2, 3, 4, 5, 8, 17])
def test_shm_slots_take_a_sixteenth_of_a_small_dev_shm(local: int, capacity_mib: int) -> None:
    # docker's default /dev/shm is 64 MiB, and every group is a communicator with its own
    # slots: beyond the 512 KiB floor they take at most 1/16 of /dev/shm.
    cap = capacity_mib << 20
    chunk, copy = _C.shm_slot_bytes(local, 4, cap)
    budget = min(32 << 20, cap // 16)
    assert chunk % 4096 == 0 and copy == 512 << 10 <= chunk <= max(local, 1) * (512 << 10)
    assert local * 4 * chunk <= budget or chunk == 512 << 10
    if local * 4 * local * (512 << 10) <= budget:
        assert chunk == local * (512 << 10)
    assert chunk <= _C.shm_slot_bytes(local, 4)[0]  # never more than without the limit
    if capacity_mib == 64:
        assert chunk == 512 << 10  # the slots of commits before 16ff525


def test_shm_capacity_is_the_size_of_dev_shm() -> None:
    st = os.statvfs("/dev/shm")
    assert _C.shm_capacity() == st.f_blocks * st.f_frsize > 0


@pytest.mark.parametrize("world", range(2, 18))
def test_choose_tree_for_tiny_ring_for_huge(world: int) -> None:
    for tiny in (0, 1, 4, 64, 1024):
        assert _C.choose_allreduce(world, tiny, {}) == TREE, (world, tiny)
    for huge in (1 << 30, 1 << 34):
        assert _C.choose_allreduce(world, huge, {}) == RING, (world, huge)


@pytest.mark.parametrize("world", range(2, 18))
def test_choice_is_monotone_and_matches_prediction(world: int) -> None:
    sizes = sorted({int(1.25 ** k) for k in range(140)} | {0})
    choices = [_C.choose_allreduce(world, b, {}) for b in sizes]
    first_ring = choices.index(RING)
    assert all(c == TREE for c in choices[:first_ring])
    assert all(c == RING for c in choices[first_ring:]), (
        f"world {world}: ring at {sizes[first_ring]} B but tree again later")
    for b, c in zip(sizes, choices):
        t = _C.predict_allreduce(TREE, world, b, {})
        r = _C.predict_allreduce(RING, world, b, {})
        assert c == (TREE if t <= r else RING), (world, b, t, r)


def _model(algo: int, world: int, b: int, alpha: float = ALPHA_S,
           beta: float = BETA_S_PER_B) -> float:
    """The alpha-beta-gamma model as documented at the top of cost_model.cc."""
    n = world
    if algo == TREE:
        p = 1 << (n.bit_length() - 1)
        lg = math.log2(p)
        rounds = lg + (0 if p == n else 2)
        return rounds * (alpha + b * beta) + lg * b * GAMMA_S_PER_B
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * b * beta + (n - 1) / n * b * GAMMA_S_PER_B


@pytest.mark.parametrize("world", range(1, 18))
def test_predict_matches_documented_model(world: int) -> None:
    for b in (0, 1, 1000, 65536, 1 << 20, 123_456_789):
        for algo in (RING, TREE):
            got = _C.predict_allreduce(algo, world, b, {})
            want = 0.0 if world == 1 else _model(algo, world, b)
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (algo, world, b)


def test_predict_grows_with_bytes_and_world() -> None:
    for algo in (RING, TREE):
        for world in range(2, 18):
            ts = [_C.predict_allreduce(algo, world, b, {}) for b in (0, 10, 10**4, 10**8)]
            assert ts == sorted(ts) and ts[0] < ts[-1]
    # Ring latency grows linearly with the world (2(n-1) messages).
    lat = [_C.predict_allreduce(RING, w, 0, {}) for w in range(2, 18)]
    assert all(b > a for a, b in zip(lat, lat[1:]))


def test_options_change_the_model() -> None:
    opts = {"alpha_us": 50.0, "beta_ns_per_byte": 0.9}
    for world in (2, 3, 8, 13):
        for algo in (RING, TREE):
            got = _C.predict_allreduce(algo, world, 10**6, opts)
            assert got == pytest.approx(_model(algo, world, 10**6, 50e-6, 0.9e-9), rel=1e-12)
    # A forced threshold overrides the model, inclusive of the threshold itself.
    for world in (2, 5, 16):
        thr = {"tree_threshold_bytes": 4096}
        assert _C.choose_allreduce(world, 4096, thr) == TREE
        assert _C.choose_allreduce(world, 4097, thr) == RING
        assert _C.choose_allreduce(world, 1 << 30, {"tree_threshold_bytes": 1 << 40}) == TREE
        assert _C.choose_allreduce(world, 1, {"tree_threshold_bytes": 0}) == RING


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        _C.choose_allreduce(2, 8, {"bogus": 1})
    with pytest.raises(ValueError, match=r"timeout=0 is out of range: accepted is 0 < seconds"):
        _C.predict_allreduce(RING, 2, 8, {"timeout": 0.0})
    with pytest.raises(ValueError, match=r"timeout=1e\+300 is out of range"):
        _C.predict_allreduce(RING, 2, 8, {"timeout": 1e300})
    with pytest.raises(ValueError, match="segment_bytes must be >= 64"):
        _C.choose_allreduce(2, 8, {"segment_bytes": 8})


def _layout_reference(hosts: list[str], rank: int) -> tuple[list[int], list[int]]:
    """Shared memory between the ranks of a host; across hosts only when every host has the
    same number (>= 2) of ranks, with the hierarchical ring through each host's rank of the
    same local index, hosts ordered by their lowest rank."""
    by_host: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        by_host.setdefault(h, []).append(r)
    groups = sorted(by_host.values())
    mine = by_host[hosts[rank]]
    if len(groups) == 1:
        return mine, []
    if len(mine) < 2 or any(len(g) != len(mine) for g in groups):
        return [], []
    return mine, [g[mine.index(rank)] for g in groups]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 8])
def test_shared_memory_layout_follows_the_hosts(world: int) -> None:
    rng = np.random.default_rng(world)
    layouts = [["h"] * world, [f"h{r}" for r in range(world)]]
    layouts += [[f"h{rng.integers(0, 3)}" for _ in range(world)] for _ in range(20)]
    if world % 2 == 0:  # two hosts of world/2, interleaved and in blocks
        layouts += [[f"h{r % 2}" for r in range(world)], [f"h{r // (world // 2)}" for r in range(world)]]
    for hosts in layouts:
        for rank in range(world):
            members, peers, why = _C.select_shm(hosts, rank)
            assert (members, peers) == _layout_reference(hosts, rank), (hosts, rank, why)
            assert _C.select_shm(hosts, rank, "tcp")[:2] == ([], [])
            if len(set(hosts)) == 1:
                assert _C.select_shm(hosts, rank, "shm")[:2] == (list(range(world)), [])


def test_shared_memory_layout_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match=r"TRANSPORT=shm needs every rank on one host, but "
                                         r"ranks run on 2 hosts \(a, b\); use auto"):
        _C.select_shm(["a/1", "b/2", "a/1"], 0, "shm")
    with pytest.raises(ValueError, match="transport must be auto, tcp or shm"):
        _C.select_shm(["a"], 0, "nvlink")
    with pytest.raises(ValueError, match="one host identity per rank"):
        _C.select_shm(["a", "a"], 2)


def test_a_communicator_needs_one_host_identity_per_rank() -> None:
    """Checked before anything is made (a list too short chose a layout from part of the
    ranks; too long failed later in the segment-name exchange, an IndexError)."""
    listener = _C.Listener("127.0.0.1")
    try:
        for hosts in (["a", "a"], []):
            opts = {"heartbeat_timeout": 0.0, "shm_prefix": "/rr-test", "shm_hosts": hosts}
            if not hosts:  # no identities: TCP only, which a 1-rank world does not need
                _C.Communicator(0, 1, listener, ["127.0.0.1:9"], "s" * 32, opts, []).destroy()
                continue
            with pytest.raises(ValueError, match=r"one host identity per rank \(2 given, "
                                                 r"world size 1\)"):
                _C.Communicator(0, 1, listener, ["127.0.0.1:9"], "s" * 32, opts, [])
    finally:
        listener.close()
