"""reduce / gather / scatter / all_to_all over real processes (tests/rooted_workers.py):
world sizes 1-5, TCP and shared memory, dtypes, ops, every root, awkward lengths, uneven
all_to_all counts, groups, async, bad input and mismatches; and through torch's API."""

from __future__ import annotations

import pytest
from _spawn import run_world

# Worlds of 4-5 ranks keep both CPUs busy (tests/_xdist_locks.py: one such at a time).
SETUPS = [(1, "tcp")] + [pytest.param(w, t, marks=pytest.mark.cpu_heavy) if w >= 4 else (w, t) for w in (2, 3, 4, 5) for t in ("tcp", "shm")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world,transport", SETUPS)
def test_rooted_matrix(world: int, transport: str) -> None:
    outs = run_world(world, "rooted_workers:matrix", timeout=270,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60",
                          "RINGREDUCE_SEGMENT_BYTES": "65536"})
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o]
    assert not fails, "\n".join(fails[:40])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world,transport", [(1, "tcp"), (2, "shm"), (3, "tcp"), (3, "shm")])
def test_complex_numbers(world: int, transport: str) -> None:
    outs = run_world(world, "rooted_workers:complex_sweep", timeout=120,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60"})
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o]
    assert not fails, "\n".join(fails[:40])


@pytest.mark.timeout(120)
def test_count_mismatch_is_named() -> None:
    outs = run_world(3, "rooted_workers:count_mismatch", timeout=90,
                     env={"RINGREDUCE_TIMEOUT": "20", "RINGREDUCE_TRANSPORT": "tcp"})
    assert outs[0].startswith("CollectiveMismatch") and "rank 1" in outs[0], outs
    for o in outs[1:]:  # told by rank 0's abort at their next collective
        assert o.startswith(("CollectiveMismatch", "PeerFailure")) and "rank 0" in o, outs


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_torch_rooted_on_ringreduce(world: int) -> None:
    outs = run_world(world, "rooted_workers:torch_rooted", timeout=120, init=False)
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o]
    assert not fails, "\n".join(fails)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world,cma", [(2, "1"), (3, "1"),
                                       pytest.param(5, "1", marks=pytest.mark.cpu_heavy),
                                       (3, "0")])
def test_shared_memory_single_copy_paths(world: int, cma: str) -> None:
    """With RINGREDUCE_CMA=1 (the default) the large all_to_all and scatter read peers'
    buffers in place (process_vm_readv, where the kernel allows it, as here), with 0 they
    stream through the slots; both checked against numpy."""
    outs = run_world(world, "rooted_workers:single_copy_paths", timeout=170,
                     env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_TIMEOUT": "60",
                          "RINGREDUCE_CMA": cma})
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o["fails"]]
    assert not fails, "\n".join(fails[:40])
    for r, o in enumerate(outs):  # (a kernel refusing process_vm_readv: the slots, 0 bytes)
        used = cma == "1" and all(x["readable"] for x in outs)
        assert (o["cma_bytes"] > 0) == used, f"rank {r} read {o['cma_bytes']} B with CMA={cma}"
        # scatter: a rank reads its block in place from each root other than itself
        n_read = len([root for root in {0, world - 1} if root != r])
        want = n_read * (300_001 + (1 << 20)) * 4 if used else 0
        assert o["scatter_read"] == want, f"rank {r}: scatter read {o['scatter_read']} B in place, not {want}"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world,transport", [(1, "tcp"), (2, "shm"), (3, "tcp"), (3, "shm"),
                                             (5, "shm")])
def test_integer_avg_is_exact(world: int, transport: str) -> None:
    outs = run_world(world, "rooted_workers:int_avg", timeout=120,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60"})
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o]
    assert not fails, "\n".join(fails[:40])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_torch_integer_avg(world: int) -> None:
    outs = run_world(world, "rooted_workers:torch_int_avg", timeout=120, init=False)
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs) for m in o]
    assert not fails, "\n".join(fails[:40])


@pytest.mark.timeout(90)
def test_groups_of_one_copy_across_numpy_and_torch() -> None:
    outs = run_world(2, "rooted_workers:mixed_containers_alone", timeout=60)
    for r, fails in enumerate(outs):
        assert not fails, f"rank {r}: {fails}"
