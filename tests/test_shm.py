"""Shared-memory transport: plan selection, correctness over both paths (one-round small
and chunked pipeline with slot reuse), odd world sizes, cleanup of /dev/shm, and
oversubscription (more ranks than cores)."""

from __future__ import annotations

import glob
import os

import pytest
from _spawn import run_world, run_world_raw


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport,want", [("auto", "shm"), ("shm", "shm"), ("tcp", "tcp")])
def test_plan_follows_transport_setting(transport: str, want: str) -> None:
    plans = run_world(2, "shm_workers:plan", env={"RINGREDUCE_TRANSPORT": transport})
    assert plans == [want, want]


@pytest.mark.cpu_heavy
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3, 5])
def test_allreduce_all_dtypes_ops_sizes(world: int) -> None:
    # 1, 9 (inline in the line), 5000 (multi-line small path), 9001 (> the 16 KiB small
    # limit for 2-byte and wider dtypes), 17_001 (for 1-byte ones), 1_300_007 (several n x
    # 512 KiB chunks for 4-byte and wider dtypes: slot reuse wraps around the 4 slots). Every
    # op runs the chunked path at 9001 or 17_001; the large count, whose chunking and slot
    # reuse do not depend on the op, runs one op of each kind (an arithmetic, the averaging,
    # a comparison, a bitwise one): about half the time.
    counts = [1, 9, 5000, 9001, 17_001, 1_300_007]
    dtypes = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
              "int16", "uint16", "uint32", "uint64"]
    ops = ["sum", "avg", "prod", "min", "max", "band", "bor", "bxor"]
    digests = run_world(world, "shm_workers:allreduce_sweep", counts, dtypes, ops,
                        ["sum", "avg", "max", "bxor"], timeout=170)
    assert all(d == digests[0] for d in digests), "ranks disagree bit-for-bit"
    assert len(digests[0]) > 100


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_broadcast_every_root_small_and_chunked(world: int) -> None:
    assert run_world(world, "shm_workers:broadcast_sweep", [1, 3000, 700_001]) == [True] * world


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 3])
def test_outputs_at_odd_addresses_and_lengths(world: int) -> None:
    # Every collective that writes the caller's buffer: one line, several 512 KiB chunks,
    # and over 8 MiB of output; odd lengths at odd addresses.
    counts = [1001, 700_003, 3_000_001]
    outs = run_world(world, "shm_workers:output_sweep", counts, timeout=170)
    assert outs == [{"wrong": []}] * world, outs


@pytest.mark.exclusive  # counts every rr-* name in /dev/shm
@pytest.mark.timeout(60)
def test_no_segment_left_in_dev_shm() -> None:
    before = set(glob.glob("/dev/shm/rr-*"))
    seen = run_world(3, "shm_workers:shm_entries")
    # Names are unlinked as soon as every rank mapped them, i.e. before init returns.
    for entries in seen:
        assert not ({"/dev/shm/" + e for e in entries} - before)
    assert set(glob.glob("/dev/shm/rr-*")) <= before


@pytest.mark.exclusive  # compares every rr-* name in /dev/shm
@pytest.mark.timeout(60)
def test_killed_rank_leaves_nothing_and_peers_raise() -> None:
    before = set(glob.glob("/dev/shm/rr-*"))
    outs = run_world_raw(3, "shm_workers:victim", 1, 4096, "kill", timeout=40)
    for o in outs:
        if o.rank == 1:
            assert o.returncode == -9
            continue
        assert o.value["type"] == "PeerFailure", o.describe()
        assert "rank 1" in o.value["msg"]
        assert o.value["after"] < 10
    assert set(glob.glob("/dev/shm/rr-*")) <= before


@pytest.mark.cpu_heavy
@pytest.mark.timeout(120)
def test_oversubscribed_eight_ranks_on_two_cores_make_progress() -> None:
    # 8 ranks on 2 cores: waits must yield and sleep, not spin, or this takes minutes.
    times = run_world(8, "shm_workers:busy_loop", 300, 1000, timeout=110)
    assert max(times) < 60, times


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", ["allreduce", "barrier", "allgather", "broadcast"])
def test_a_late_rank_fails_the_collective_its_peers_timed_out_of(op: str) -> None:
    """Before, the late rank found every input published, returned success and failed only
    at its next call (found by a helper comparing with gloo)."""
    outs = run_world(3, "shm_workers:late_rank", op, timeout=40,
                     env={"RINGREDUCE_TIMEOUT": "1", "RINGREDUCE_TRANSPORT": "shm"})
    for r, o in enumerate(outs[:2]):
        assert o["type"] in ("CollectiveTimeout", "PeerFailure"), f"rank {r}: {o}"
    o = outs[2]
    assert o["type"] in ("CollectiveTimeout", "PeerFailure") and "timed out" in o["msg"] \
        and o["secs"] < 1, o


@pytest.mark.timeout(60)
def test_mismatched_counts_detected_over_shm() -> None:
    outs = run_world(3, "shm_workers:count_mismatch", timeout=40)
    for o in outs:
        assert o["type"] in ("CollectiveMismatch", "PeerFailure"), o
        assert "count" in o["msg"]


def _dev_shm_namespace(tmp_path, size: str):
    """A mount namespace whose /dev/shm is a tmpfs of `size`; yields the command prefix that
    runs a process in it (every rank of a world must share it, like one host)."""
    import shutil
    import subprocess

    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        pytest.skip(f"needs root, unshare and nsenter to give the ranks a {size} /dev/shm")
    d = tmp_path / "ns"
    d.mkdir()
    ns = d / "mnt"
    ns.touch()
    run = lambda *a: subprocess.run(list(a), capture_output=True, text=True, timeout=20, check=False)
    steps = [run("mount", "--bind", str(d), str(d)), run("mount", "--make-private", str(d)),
             run("unshare", f"--mount={ns}", "--propagation", "private", "mount", "-t",
                 "tmpfs", "-o", f"size={size}", "tmpfs", "/dev/shm")]
    bad = next((r for r in steps if r.returncode != 0), None)
    if bad is not None:
        run("umount", str(ns))
        run("umount", str(d))
        pytest.skip(f"cannot build a mount namespace: {bad.args}: {bad.stderr.strip()}")
    try:
        yield ["nsenter", f"--mount={ns}"]
        left = run("nsenter", f"--mount={ns}", "ls", "-A", "/dev/shm")
        assert left.returncode == 0 and left.stdout.strip() == "", \
            f"left behind in /dev/shm: {left.stdout!r}"
    finally:
        run("umount", str(ns))
        run("umount", str(d))


@pytest.fixture
def tiny_dev_shm(tmp_path):
    """/dev/shm of 64 KiB: too small for any segment."""
    yield from _dev_shm_namespace(tmp_path, "64k")


@pytest.fixture
def docker_dev_shm(tmp_path):
    """/dev/shm of 64 MiB, docker's default."""
    yield from _dev_shm_namespace(tmp_path, "64m")


@pytest.mark.timeout(60)
def test_full_dev_shm_is_a_clear_error_on_every_rank(tiny_dev_shm: list) -> None:
    outs = run_world_raw(2, "fault_workers:init_outcome", {}, timeout=40, init=False,
                         env={"RINGREDUCE_TRANSPORT": "shm"},
                         rank_prefix={0: tiny_dev_shm, 1: tiny_dev_shm})
    story = "\n".join(o.describe() for o in outs)
    msgs = [o.value["msg"] for o in outs if o.ok and o.value["type"]]
    assert len(msgs) == 2, story
    assert any("/dev/shm is full or too small" in m and "RINGREDUCE_TRANSPORT=tcp" in m
               for m in msgs), story
    assert all("shared memory" in m for m in msgs), story
    assert all(o.value["elapsed"] < 10 for o in outs), story


@pytest.fixture
def small_dev_shm(tmp_path):
    """/dev/shm of 8 MiB: a 2-rank world's segments (about 2 MiB each) and one more fit."""
    yield from _dev_shm_namespace(tmp_path, "8m")


@pytest.mark.timeout(90)
def test_a_group_that_does_not_fit_dev_shm_fails_on_every_rank_at_once(small_dev_shm) -> None:
    outs = run_world(2, "shm_workers:group_in_full_dev_shm", timeout=70,
                     env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_CONNECT_TIMEOUT": "40"},
                     rank_prefix=dict.fromkeys(range(2), small_dev_shm))
    assert all(o["error"] for o in outs), outs
    assert any("/dev/shm is full or too small" in o["error"] for o in outs), outs
    for r, o in enumerate(outs):
        assert o["secs"] < 10, f"rank {r} took {o['secs']:.1f} s (connect timeout 40 s): {o}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stage", ["make", "slots"])
def test_a_failed_early_send_fails_the_senders_other_calls_to_that_peer(
        small_dev_shm, stage: str) -> None:
    outs = run_world(2, "shm_workers:eager_send_without_room", stage, timeout=70,
                     env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_TIMEOUT": "30"},
                     rank_prefix=dict.fromkeys(range(2), small_dev_shm))
    for r, o in enumerate(outs):
        assert o["error"] and "/dev/shm is full or too small" in o["error"], (r, o)
        assert o["secs"] < 5, f"rank {r} took {o['secs']:.1f} s (timeout 30 s): {o}"
    assert "channel" in outs[0]["error"] and "rank 1" in outs[0]["error"], outs[0]
    # Its own failure (a RingReduceError), or rank 1's, whose channel failed too ("make":
    # both ranks ran out) and told it first -- never a PeerFailure naming itself (a review).
    assert outs[0]["error"].startswith(("RingReduceError", "PeerFailure: rank 1 ")), outs[0]


@pytest.mark.timeout(120)
def test_world_and_groups_fit_dockers_default_dev_shm(docker_dev_shm: list) -> None:
    # Every group has its own slots; at up to 32 MiB per communicator the world and one
    # group of 4 ranks filled docker's 64 MiB and the second new_group failed. Slots now
    # take at most 1/16 of /dev/shm beyond the 512 KiB floor: the world, three groups and a
    # split all run multi-chunk collectives here, results checked.
    outs = run_world(4, "shm_workers:groups_in_small_dev_shm", timeout=100,
                     env={"RINGREDUCE_TRANSPORT": "shm"},
                     rank_prefix=dict.fromkeys(range(4), docker_dev_shm))
    assert outs == [{"capacity": 64 << 20, "chunk": 512 << 10, "wrong": []}] * 4, outs


@pytest.mark.timeout(120)
def test_all_pairs_point_to_point_fits_dockers_default_dev_shm(docker_dev_shm: list) -> None:
    # A channel per direction and pair; each held ~2 MiB of slots on both of its ranks from
    # the start (4 segments of ~2 MiB per pair): at 5 ranks all-pairs isend/irecv of 4 KiB
    # failed with "/dev/shm is full". Now a channel's slots are allocated by its sender with
    # its first message above a line (16 KiB), and a receiver holds none.
    outs = run_world(5, "shm_workers:all_pairs_in_small_dev_shm", timeout=100,
                     env={"RINGREDUCE_TRANSPORT": "shm"},
                     rank_prefix=dict.fromkeys(range(5), docker_dev_shm))
    assert all(o["wrong"] == [] for o in outs), outs
    o = outs[0]
    assert o["small"] < 20 * 100 * 1024, o  # 20 channels of two ~40 KiB control + lines
    # 20 senders' slots: 2 MiB each (4 x 512 KiB in flight), none on the receiving side
    assert 20 * (2 << 20) <= o["large"] < 20 * (2 << 20) + (4 << 20), o


@pytest.mark.timeout(90)
@pytest.mark.parametrize("worker,any_source", [("p2p_slots_into_full_dev_shm", False),
                                               ("p2p_slots_into_full_dev_shm", True),
                                               ("group_slots_into_full_dev_shm", False)])
def test_slots_that_do_not_fit_fail_on_every_member_at_once(small_dev_shm, worker,
                                                            any_source) -> None:
    # A channel's sender, or every member of a group, allocates slots with the first message
    # or collective that needs them: with /dev/shm full by then, all get the error at once
    # (an any-source receiver too), and the world goes on.
    outs = run_world(2, f"shm_workers:{worker}", timeout=70,
                     env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_TIMEOUT": "40",
                          "RR_TEST_ANY_SOURCE": "1" if any_source else ""},
                     rank_prefix=dict.fromkeys(range(2), small_dev_shm))
    for r, o in enumerate(outs):
        assert "/dev/shm is full or too small" in o["error"], (r, outs)
        assert o["secs"] < 10, f"rank {r} took {o['secs']:.1f} s (timeout 40 s): {outs}"
        if worker.startswith("group"):  # every member names the ranks short of room
            assert "group" in o["error"] and "on rank(s) 0, 1" in o["error"], outs
            assert o["world_ok"], outs


@pytest.mark.timeout(90)
def test_a_channel_that_could_not_be_made_says_why_on_every_later_try(small_dev_shm) -> None:
    outs = run_world(2, "shm_workers:p2p_channel_into_full_dev_shm", timeout=70,
                     env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_TIMEOUT": "20"},
                     rank_prefix=dict.fromkeys(range(2), small_dev_shm))
    for r, errors in enumerate(outs):
        assert all("/dev/shm is full or too small" in e for e in errors), (r, outs)
        assert all("could not be made earlier" in e and "tag 3" in e for e in errors[1:]), outs


@pytest.mark.timeout(120)
def test_many_idle_groups_fit_dockers_default_dev_shm(docker_dev_shm: list) -> None:
    # A DeviceMesh-style job makes many groups and uses some of them for small messages only.
    # 24 groups over 4 ranks held 24 x 8 MiB of slots from their creation (the 8th failed in
    # 64 MiB); now a group's slots come with its first collective that needs them. Every
    # group runs a small all-reduce, the last ones large collectives (results checked).
    outs = run_world(4, "shm_workers:many_idle_groups", 24, timeout=100,
                     env={"RINGREDUCE_TRANSPORT": "shm"},
                     rank_prefix=dict.fromkeys(range(4), docker_dev_shm))
    assert all(o["wrong"] == [] for o in outs), outs
    assert outs[0]["idle_used"] < 8 << 20, outs  # 24 groups' control blocks and lines


@pytest.fixture
def dev_shm_256m(tmp_path):
    """/dev/shm of 256 MiB: 1 MiB chunks at 2 ranks (its 1/16 is 16 MiB)."""
    yield from _dev_shm_namespace(tmp_path, "256m")


@pytest.mark.timeout(120)
def test_slots_that_cannot_grow_keep_small_chunks_and_right_results(dev_shm_256m: list) -> None:
    # A communicator starts with each slot's first 512 KiB; its first large all-reduce
    # allocates the rest. With /dev/shm full by then, every rank keeps 512 KiB chunks
    # (and says so once) instead of failing or dying of SIGBUS.
    outs = run_world_raw(2, "shm_workers:grow_into_full_dev_shm", timeout=100,
                         env={"RINGREDUCE_TRANSPORT": "shm"},
                         rank_prefix=dict.fromkeys(range(2), dev_shm_256m))
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok for o in outs), story
    assert [o.value for o in outs] == [{"capacity": 256 << 20, "wrong": []}] * 2, story
    warned = [o.rank for o in outs if "/dev/shm had no room for 1024 KiB slots" in o.stderr]
    assert warned == [0, 1], story


@pytest.mark.timeout(120)
def test_a_group_holds_only_the_slots_it_uses() -> None:
    # 4 ranks: 2 MiB chunks, 8 MiB of slots per rank and 32 MiB mapped from the host's four
    # segments once a large all-reduce ran; until its first collective that needs slots, a
    # group holds none (it held each slot's first 512 KiB, 8 MiB mapped, from its creation).
    outs = run_world(4, "shm_workers:group_resident_kib", 3_000_001, timeout=100,
                     env={"RINGREDUCE_TRANSPORT": "shm"})
    assert all(ok for _, _, ok in outs), outs
    for made, used, _ in outs:
        assert made < 2 << 10, outs  # control blocks, lines, a thread: not 8 MiB of slots
        assert used > 24 << 10, outs  # the slots grew to full size


@pytest.mark.exclusive  # compares every rr-* name in /dev/shm
@pytest.mark.timeout(240)
def test_two_jobs_with_one_secret_share_the_host(tmp_path) -> None:
    # The README recommends a fixed RINGREDUCE_SECRET on untrusted networks, so two jobs on a
    # host may share one. Their segments must still be distinct (names were derived from the
    # secret and a per-process init counter: job B's create unlinked job A's live segment and
    # A's peers mapped B's), and each creator removes only its own names.
    import threading

    before = set(glob.glob("/dev/shm/rr-*"))
    env = {"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_SECRET": "one-secret-for-two-jobs",
           "RINGREDUCE_TIMEOUT": "30"}
    results: dict = {}

    def job(j: int) -> None:
        try:
            results[j] = run_world(2, "shm_workers:init_loop", 40, j, str(tmp_path), 2,
                                   init=False, env=env, timeout=200)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            results[j] = e

    threads = [threading.Thread(target=job, args=(j,)) for j in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [f"job {j}: {results[j]}" for j in (0, 1) if isinstance(results[j], BaseException)]
    assert not failed, "\n".join(failed)
    for j in (0, 1):
        for r, out in enumerate(results[j]):
            assert out["wrong"] == [], f"job {j} rank {r}: {out['wrong'][:3]}"
    pids = [out["pid"] for j in (0, 1) for out in results[j]]
    left = set(glob.glob("/dev/shm/rr-*")) - before
    assert not left, f"left in /dev/shm: {sorted(left)}"
    assert not [p for p in glob.glob("/dev/shm/rr-*") if any(f"-{pid}-" in p for pid in pids)]
