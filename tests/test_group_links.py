"""Groups and point-to-point channels over TCP: streams on one connection per pair of
processes (RINGREDUCE_GROUP_LINKS=1, the default; csrc/transport/tcp/link_table.h) and
connections of their own (RINGREDUCE_GROUP_LINKS=0). The default runs in test_groups.py and
test_p2p.py; here, the groups and p2p matrices against numpy at world sizes 2-5 and failures
named over the other way, two groups at once from two threads on the shared links, and what
a new group costs either way (no TCP connection where the processes share a link)."""

from __future__ import annotations

import pytest
from _spawn import run_world, run_world_raw

LINKS = {"RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_GROUP_LINKS": "1", "RINGREDUCE_TIMEOUT": "60"}
OWN = {**LINKS, "RINGREDUCE_GROUP_LINKS": "0"}  # what the default does not run


def _run_checked(world: int, worker: str, timeout: float, env: dict) -> None:
    """Run `worker`; each rank returns the checks it failed (a list, or a dict holding it
    under "fails"): all must be empty."""
    outs = run_world(world, worker, timeout=timeout, env=env)
    fails = [f"rank {r}: {m}" for r, o in enumerate(outs)
             for m in (o["fails"] if isinstance(o, dict) else o)]
    assert not fails, "\n".join(fails[:40])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_groups_matrix_over_own_connections(world: int) -> None:
    _run_checked(world, "group_workers:matrix", 200, OWN)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world", [2, 3])
def test_p2p_matrix_over_own_connections(world: int) -> None:
    _run_checked(world, "p2p_workers:matrix", 170, OWN)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_two_groups_at_once_share_the_links(world: int) -> None:
    _run_checked(world, "link_workers:two_threads", 120, LINKS)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_channels_set_up_at_once_agree_on_their_links(world: int) -> None:
    """isend/irecv on several new tags at once: their channels are made concurrently on
    helper threads, and both processes of a pair must agree on which link they use."""
    outs = run_world(world, "link_workers:concurrent_channels", timeout=100,
                     env={**LINKS, "RINGREDUCE_CONNECT_TIMEOUT": "30"})
    for r, o in enumerate(outs):
        assert not o["fails"], (r, o)
        assert o["secs"] < 20, (r, o)  # not a connect timeout
        assert o["links"] == min(2, world - 1), (r, o)  # links to both ring neighbours


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 4])
def test_torch_subgroups_over_the_same_ranks_get_streams_of_their_own(world: int) -> None:
    outs = run_world(world, "link_workers:torch_subgroups_alike", timeout=120, env=LINKS,
                     init=False)
    assert not any(outs), outs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("links", ["1", "0"])
def test_a_new_group_opens_no_connection_where_a_link_exists(links: str) -> None:
    """With links, the first group makes world-1 links and later groups none; without, every
    group connects its own members (world-1 more sockets each) -- the difference shows the
    count can tell."""
    world = 3
    outs = run_world(world, "link_workers:sockets_per_group", timeout=100,
                     env={**LINKS, "RINGREDUCE_GROUP_LINKS": links})
    for r, o in enumerate(outs):
        assert not o["fails"], (r, o)
        c = o["counts"]
        if links == "1":
            assert o["links"] == world - 1, (r, o)
            assert c[1] == c[0] + world - 1 and c[4] == c[1], (r, o)
        else:
            assert o["links"] == -1 and c[4] == c[0] + 4 * (world - 1), (r, o)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what,victim", [("group", 1), ("group", 0), ("any", 1)])
def test_a_member_lost_is_named_over_own_connections(what: str, victim: int) -> None:
    outs = run_world_raw(3, "group_workers:dies_before_waits", what, victim, timeout=80,
                         expendable=[victim], env={**OWN, "RINGREDUCE_TIMEOUT": "40",
                                                   "RINGREDUCE_CONNECT_TIMEOUT": "40"})
    for r in {0, 1, 2} - {victim}:
        v = outs[r].value
        assert v is not None, outs[r].describe()
        assert v["error"].startswith("PeerFailure") and f"rank {victim} " in v["error"], (r, v)
        assert v["peer_rank"] == victim and v["secs"] < 5.0, (r, v)
