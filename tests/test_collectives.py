"""Collectives over real processes: world sizes 1-5 x every collective x op x dtype x size,
torch tensors and numpy arrays, sync and async, checked against answers computed from
rank-dependent inputs (tests/workers.py) and for bit-identical results on every rank.

One process launch per world size runs the whole matrix (tests/workers.py:matrix); the
parametrised tests below each check one family of that launch's findings, so a failure
names the family and the cases. The launch happens on the first test of a world size that
needs it and is cached for the rest of the module.
"""

from __future__ import annotations

import pytest
import workers
from _spawn import run_world

WORLDS = [1, 2, 3, 4, 5]
# world 1 never touches a transport; otherwise both: TCP sockets, and shared memory (which
# the library uses for all ranks on one host unless RINGREDUCE_TRANSPORT=tcp).
# Worlds of 4-5 ranks keep both CPUs busy (tests/_xdist_locks.py: one such at a time).
SETUPS = [(1, "tcp")] + [pytest.param(w, t, marks=pytest.mark.cpu_heavy) if w >= 4 else (w, t) for w in WORLDS[1:] for t in ("tcp", "shm")]
FAMILIES = list(workers.FAMILIES)
# Families whose results must be bit-identical on every rank.
IDENTICAL = {"allreduce_ring", "allreduce_tree", "allreduce_auto", "broadcast", "allgather",
             "coalesced", "async", "large"}
# 4 KiB segments: every size above a few hundred elements runs through many segments.
MATRIX_ENV = {"RINGREDUCE_SEGMENT_BYTES": "4096", "RINGREDUCE_TIMEOUT": "60"}
MATRIX_TIMEOUT_S = 200

_cache: dict[tuple[int, str], object] = {}


def _matrix(world: int, transport: str) -> list[dict]:
    """The matrix results of `world` ranks over `transport` (launched once per module)."""
    key = (world, transport)
    if key not in _cache:
        try:
            _cache[key] = run_world(world, workers.matrix, FAMILIES, timeout=MATRIX_TIMEOUT_S,
                                    env={**MATRIX_ENV, "RINGREDUCE_TRANSPORT": transport})
        except AssertionError as e:  # keep the failure: do not relaunch for every family
            _cache[key] = e
    res = _cache[key]
    if isinstance(res, AssertionError):
        raise AssertionError(  # noqa: TRY004 - a test failure, not a type error
            f"the matrix launch for {world} rank(s) over {transport} failed:\n{res}")
    return res  # type: ignore[return-value]


@pytest.mark.timeout(MATRIX_TIMEOUT_S + 30)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("world,transport", SETUPS)
def test_matrix(world: int, transport: str, family: str) -> None:
    check_family(_matrix(world, transport), family, f"{family} on {world} rank(s)")


def check_family(results: list, family: str, what: str) -> None:
    """One family's verdict from every rank's workers.matrix results: no failure, the same
    number of cases on every rank (more than none), bitwise-equal results where every rank
    must agree (the raw-bits cases record only digests), barriers that release no rank
    before the last arrives (the barrier cases record only times)."""
    fails = {r: res["fails"].get(family, []) for r, res in enumerate(results)}
    fatal = [res["fatal"] for res in results if res["fatal"]]
    msgs = [f"rank {r}: {m}" for r, ms in fails.items() for m in ms]
    assert not msgs, f"{what}:\n" + "\n".join(msgs[:60]) + (
        f"\n(first fatal error: {fatal[0]})" if fatal else "")
    counts = {res["counts"].get(family, 0) for res in results}
    assert len(counts) == 1 and counts.pop() > 0, f"{what}: ranks ran different case counts"
    if family in IDENTICAL:
        d0 = results[0]["digests"][family]
        assert d0, f"{what}: no digests recorded"
        for r, res in enumerate(results[1:], start=1):
            d = res["digests"][family]
            assert d.keys() == d0.keys(), f"{what}: rank {r} recorded different cases"
            differ = [k for k in d0 if d[k] != d0[k]]
            assert not differ, (f"{what}: rank {r}'s results differ bitwise from rank 0's in "
                                f"{len(differ)} cases, e.g. {differ[:5]}")
    if family == "barrier":
        stamps = [res["extra"]["barrier_stamps"] for res in results]
        for k in range(3):
            last_in = max(s[k][0] for s in stamps)
            first_out = min(s[k][1] for s in stamps)
            assert first_out >= last_in, (
                f"{what}: barrier {k}: a rank left at {first_out:.3f} before the last one "
                f"arrived at {last_in:.3f}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,container,transport,algo", [
    (2, "numpy", "tcp", "ring"), (3, "torch", "tcp", "ring"), (3, "numpy", "shm", "auto")])
def test_allreduce_16mib(world: int, container: str, transport: str, algo: str) -> None:
    """16 MiB float32 with the default 512 KiB segments (TCP ring) or shared-memory chunks."""
    res = run_world(world, workers.big_allreduce, container, algo, timeout=90,
                    env={"RINGREDUCE_TRANSPORT": transport})
    for r, v in enumerate(res):
        assert v["errs"] == [], f"rank {r}: {v['errs']}"
    assert len({v["digest"] for v in res}) == 1, "ranks disagree bitwise"
