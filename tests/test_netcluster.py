"""Emulated multi-host runs: each "host" is a network namespace with its own address
(tests/netcluster.py builds them), so ranks in different namespaces count as different
hosts (their host identity includes the network namespace). Checks results, the transport
plan (hierarchical with several ranks per host, TCP with one), and that cutting a host's
link makes every rank raise within the heartbeat deadline. Needs root, `ip` and (for the
slow link only) `tc`; skipped with the reason where namespaces cannot be made."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from _spawn import free_port, run_world, run_world_raw
from netcluster import SUBNET, Cluster, cleanup_stale, tc_unavailable, unavailable

_REASON = unavailable()
pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """Builds clusters and removes them after the test, whatever the test did. Clusters a
    crashed earlier run left behind (its process is gone) are removed first."""
    cleanup_stale()
    made: list[Cluster] = []

    def make(hosts: int, rate: str = "none") -> Cluster:
        c = Cluster(hosts, rate)
        made.append(c)
        return c

    try:
        yield make
    finally:
        errors = []
        for c in made:  # every cluster, even if removing an earlier one failed
            try:
                c.down()
            except Exception as e:  # noqa: BLE001 - reported below, after the others
                errors.append(e)
        if errors:
            raise errors[0]


ENV = {"RINGREDUCE_CONNECT_TIMEOUT": "30", "RINGREDUCE_HEARTBEAT_TIMEOUT": "3"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("hosts,per_host,plan", [(2, 2, "hier"), (3, 1, "tcp"), (2, 1, "tcp"),
                                                  (4, 1, "tcp")])
def test_results_and_plan_across_hosts(cluster_factory, hosts: int, per_host: int,
                                       plan: str) -> None:
    c = cluster_factory(hosts)
    world = hosts * per_host
    res = run_world(world, "shm_workers:hier_sweep", [1, 7, 1001, 300_007], timeout=120,
                    env=ENV, master_addr=c.addr(0), rank_prefix=c.prefix(per_host))
    assert [r["plan"] for r in res] == [plan] * world


@pytest.mark.timeout(150)
def test_each_group_chooses_its_own_transports(cluster_factory) -> None:
    """2 hosts x 2 ranks (0, 1 | 2, 3): the core chooses shared memory per communicator from
    its members' hosts (transport/select.cc) -- a group inside one host uses shared memory,
    one spanning hosts with one rank each or unequal counts uses TCP, the whole job the
    hierarchical plan -- and each computes right."""
    c = cluster_factory(2)
    groups = [[0, 1], [2, 3], [0, 2], [1, 2, 3], [0, 1, 2, 3]]
    want = {"0,1": "shm", "2,3": "shm", "0,2": "tcp", "1,2,3": "tcp", "0,1,2,3": "hier"}
    res = run_world(4, "shm_workers:group_plans", groups, timeout=120, env=ENV,
                    master_addr=c.addr(0), rank_prefix=c.prefix(2))
    for rank, plans in enumerate(res):
        assert plans == {k: v for k, v in want.items() if rank in map(int, k.split(","))}, \
            (rank, plans)


@pytest.mark.timeout(150)
def test_auto_runs_the_cluster_models_pick(cluster_factory) -> None:
    """2 hosts x 2 ranks: "auto" runs what the planner's cluster model picks per size
    (recursive doubling when latency-bound, hierarchical when bandwidth-bound; 64 KiB is
    where it differs from the flat model's tree), read from the DEBUG log of every rank."""
    from ringreduce import _C

    c = cluster_factory(2)
    counts = [2, 16384, 262144]  # float32: 8 B, 64 KiB, 1 MiB
    outs = run_world_raw(4, "shm_workers:planned_sweep", counts, timeout=120,
                         env={**ENV, "RINGREDUCE_DEBUG": "DEBUG"}, master_addr=c.addr(0),
                         rank_prefix=c.prefix(2))
    assert all(o.ok for o in outs), "\n".join(map(str, outs))
    name = {"ring": "ring", "recursive_doubling": "tree", "hier": "hier"}
    want = [name[_C.pick_allreduce_cluster(2, 2, 4 * n, 8.4, 0.176)] for n in counts]
    assert want == ["tree", "hier", "hier"]
    for o in outs:
        planned = re.findall(r"plan: allreduce #\d+ on world, (\d+) bytes, 4 ranks on 2 hosts -> "
                             r"(\w+) \(cluster model: ring \d+ us", o.stderr)
        ran = re.findall(r"allreduce #\d+ on world: (\d+) bytes float32 sum -> (\w+) \(auto\)",
                         o.stderr)
        assert planned == ran == [(str(4 * n), a) for n, a in zip(counts, want)], o.stderr[-3000:]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("half_wire", [16, 32])
def test_hier_16bit_sends_16bit_slices_across_hosts(cluster_factory, half_wire: int) -> None:
    """float16/bfloat16 over the hierarchical plan (2 hosts x 2 ranks): local rank l's
    cross-host ring carries slice l as 16-bit partials (float32 ones with
    RINGREDUCE_HALF_WIRE=32); results within 2 roundings (local, then the 2-host ring) and
    bit-identical on every rank; a float16 avg whose sums overflow float16 is still exact."""
    from test_wire import U, chunk_len, expected_ring

    hosts, per_host, n = 2, 2, 20011
    c = cluster_factory(hosts)
    cases = [[d, op, "auto", n, k] for k, (d, op) in
             enumerate((d, op) for d in ("float16", "bfloat16") for op in ("sum", "avg"))]
    env = {**ENV, "RINGREDUCE_HALF_WIRE": str(half_wire), "RINGREDUCE_SEGMENT_BYTES": "4096",
           "RINGREDUCE_TREE_THRESHOLD_BYTES": "0"}  # always the ring, i.e. hier
    res = run_world(hosts * per_host, "wire_workers:wire_cases", cases, [], timeout=120,
                    env=env, master_addr="10.77.0.1", rank_prefix=c.prefix(per_host))
    for k, (dtype, op, *_) in enumerate(cases):
        for r, out in enumerate(res):
            host, local = divmod(r, per_host)
            want = expected_ring(hosts, host, chunk_len(n, per_host, local), dtype, half_wire)
            got = out["cases"][k]
            assert got["sent"] == want, f"{dtype}/{op} rank {r}: sent {got['sent']}, want {want}"
            assert got["err_ratio"] <= 2 * (1 + 2 * U[dtype]) + 1e-3, (dtype, op, r, got)
        assert len({out["cases"][k]["digest"] for out in res}) == 1, f"{dtype}/{op}: ranks differ"
    # float16 avg of values whose sums overflow float16 (each host's sum and the cross-host
    # partials): the exact average, rounded once, not inf (test_wire.py has the flat plans).
    res = run_world(hosts * per_host, "wire_workers:large_half_avg", 4 * 3001, ["auto"],
                    timeout=120, env=env, master_addr="10.77.0.1", rank_prefix=c.prefix(per_host))
    assert not [e for es in res for e in es], res
    # float16 avg of tiny (subnormal) values: each host's sum of 2 is scaled by 2^-1 as it is
    # rounded (a step of 2^-23), the 2-host ring rounds only its finished sum: at most
    # (2 hosts * 1 unit) / 4 ranks + 1/2 units of 2^-24. Scaling the inputs by 2^-2 first,
    # as before, rounded each to steps of 2^-22.
    res = run_world(hosts * per_host, "wire_workers:small_half_avg", 20011, "auto",
                    timeout=120, env=env, master_addr="10.77.0.1", rank_prefix=c.prefix(per_host))
    assert len({r["digest"] for r in res}) == 1, res
    for r in res:
        assert not r["guard"] and r["err_units"] <= 1.0 + 1e-9, r


@pytest.mark.timeout(120)
@pytest.mark.parametrize("per_host", [1, 2])
def test_cut_link_raises_on_every_rank(cluster_factory, per_host: int) -> None:
    c = cluster_factory(2)
    world = 2 * per_host
    port = free_port()
    env = dict(ENV, MASTER_PORT=str(port))
    ready = [Path(f"/tmp/rr_linkcut_ready_{port}_{r}") for r in range(world)]
    cut = Path(f"/tmp/rr_linkcut_cut_{port}")

    def cutter() -> None:
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        cut.touch()
        c.link(1, "down")  # host 1 (its ranks) loses its link

    th = threading.Thread(target=cutter, daemon=True)
    th.start()
    try:
        outs = run_world_raw(world, "shm_workers:link_cut", 4096, timeout=90, env=env,
                             master_addr=c.addr(0), rank_prefix=c.prefix(per_host))
    finally:
        th.join(timeout=5)
        for p in ready + [cut]:
            p.unlink(missing_ok=True)
    for o in outs:
        assert o.has_result, o.describe()
        v = o.value
        assert v["type"] in ("PeerFailure", "CollectiveTimeout"), o.describe()
        # Heartbeats (3 s here) catch the partition; allow for the 2-core machine.
        assert v["after"] < 10, v
        assert "stopped responding" in v["msg"] or "failed" in v["msg"], v["msg"]


def _run_with_link_event(c: Cluster, world: int, per_host: int, n: int, seconds: float,
                         env: dict, event) -> tuple[list, float]:
    """Run fault_workers:net_loop; once every rank is ready, call event() and note when."""
    ready = f"/tmp/rr_net_ready_{free_port()}"
    paths = [Path(f"{ready}.{r}") for r in range(world)]
    when: list[float] = []

    def trigger() -> None:
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        t = time.time()
        event()
        when.append(t)
        Path(f"{ready}.event").touch()

    th = threading.Thread(target=trigger, daemon=True)
    th.start()
    try:
        outs = run_world_raw(world, "fault_workers:net_loop", n, seconds, ready, timeout=90,
                             env=env, master_addr=c.addr(0), rank_prefix=c.prefix(per_host))
    finally:
        th.join(timeout=5)
        for p in paths + [Path(f"{ready}.event")]:
            p.unlink(missing_ok=True)
    assert when, "the link event never happened:\n" + "\n".join(o.describe() for o in outs)
    return outs, when[0]


@pytest.mark.timeout(150)
def test_partitioned_host_is_named_everywhere_within_5s(cluster_factory) -> None:
    """Three hosts, default heartbeat settings; host 2 loses its link. Ranks on hosts 0 and
    1 must name rank 2, and rank 2 must name one of them, each within 5 s of the cut."""
    c = cluster_factory(3)
    env = {"RINGREDUCE_CONNECT_TIMEOUT": "30"}
    outs, t_cut = _run_with_link_event(c, 3, 1, 4096, 60, env, lambda: c.link(2, "down"))
    for o in outs:
        assert o.has_result, o.describe()
        v = o.value
        assert v["type"] == "PeerFailure", o.describe()
        assert v["wrong"] == 0, v
        other = r"rank 2\b" if o.rank != 2 else r"rank [01]\b"
        assert re.search(other, v["msg"]), f"rank {o.rank}: {v['msg']}"
        assert v["t_err"] - t_cut < 5.0, f"rank {o.rank}: {v['t_err'] - t_cut:.2f} s: {v['msg']}"


@pytest.mark.timeout(150)
def test_a_one_way_partition_fails_both_ranks_before_the_timeout(cluster_factory) -> None:
    """Host 0 can no longer send to host 1 (a blackhole route; host 1 still reaches host 0).
    Rank 1 hears no heartbeat, names rank 0 and leaves; its goodbye by heartbeat arrives but
    its connection stalls (rank 0's acknowledgements are lost), so rank 0 waited for
    RINGREDUCE_TIMEOUT and then blamed a wait chain (a helper's network-fault hunt). Now it
    names rank 1 (its connection silent and its goodbye heartbeat older than the heartbeat
    timeout) well before."""
    c = cluster_factory(2)
    env = dict(ENV, RINGREDUCE_TIMEOUT="40")
    outs, t_cut = _run_with_link_event(
        c, 2, 1, 262144, 60, env,
        lambda: c.on(0, "ip", "route", "add", "blackhole", f"{c.addr(1)}/32"))
    v0, v1 = (o.value for o in outs)
    assert all(o.has_result for o in outs), [o.describe() for o in outs]
    assert v1["type"] == "PeerFailure" and re.search(r"rank 0\b", v1["msg"]), v1
    assert v0["type"] == "PeerFailure" and "rank 1 (" in v0["msg"], v0
    assert "said goodbye by heartbeat" in v0["msg"] and "stalls its traffic" in v0["msg"], v0
    assert v0["wrong"] == v1["wrong"] == 0, (v0, v1)
    assert v0["t_err"] - t_cut < 15.0, f"{v0['t_err'] - t_cut:.1f} s: {v0['msg']}"


@pytest.mark.timeout(150)
def test_an_mtu_black_hole_is_named_as_the_network_before_the_timeout(cluster_factory) -> None:
    """Host 1's link takes frames of 1000 bytes at most (its host still sends 1500-byte
    ones; no ICMP comes back): small packets -- heartbeats, acknowledgements -- pass and
    full-size data segments are lost both ways. Every rank waited for the other's data,
    each heard alive, until RINGREDUCE_TIMEOUT blamed a wait chain (a helper's network-fault
    hunt). Now a rank whose data TCP has retransmitted unacknowledged for twice the
    heartbeat timeout names the network and leaves; its abort is stuck behind that data, so
    the peer names it by its goodbye heartbeat and silent connection (or its own TCP gives
    up first: ETIMEDOUT, also explained)."""
    c = cluster_factory(2)
    for h in (0, 1):  # one segment per packet: a GSO packet passes veth's size check
        c.on(h, "ip", "link", "set", "eth0", "gso_max_segs", "1")
    env = dict(ENV, RINGREDUCE_TIMEOUT="40")
    outs, t_cut = _run_with_link_event(
        c, 2, 1, 262144, 60, env, lambda: c.link(1, "mtu", "1000"))
    assert all(o.has_result for o in outs), [o.describe() for o in outs]
    for o in outs:
        v = o.value
        assert v["type"] == "PeerFailure" and v["wrong"] == 0, (o.rank, v)
        assert v["t_err"] - t_cut < 15.0, f"rank {o.rank}: {v['t_err'] - t_cut:.1f} s: {v['msg']}"
    # The rank whose retransmissions are seen first names the MTU (or its TCP gives up: ETIMEDOUT).
    assert any("MTU" in o.value["msg"] for o in outs), [o.value for o in outs]


@pytest.mark.timeout(150)
@pytest.mark.skipif(tc_unavailable() is not None, reason=tc_unavailable() or "")
def test_slow_link_is_slow_not_failed(cluster_factory) -> None:
    """One host's link throttled to 8 Mbit/s while 1 MiB all-reduces saturate it: the job
    must go on (heartbeats share the congested link) with every result right."""
    c = cluster_factory(2)
    env = {"RINGREDUCE_CONNECT_TIMEOUT": "30", "RINGREDUCE_HEARTBEAT_TIMEOUT": "2"}

    def throttle() -> None:  # host 1's outgoing traffic only
        c.shape(1, "8mbit", burst="32kb", latency="50ms", inbound=False)

    outs, _ = _run_with_link_event(c, 2, 1, 1 << 18, 8, env, throttle)
    for o in outs:
        assert o.has_result, o.describe()
        v = o.value
        assert v["type"] is None, f"rank {o.rank}: {v['type']}: {v['msg']}"
        # 8 s at 1 MB/s moves about 8-16 of these all-reduces; unthrottled it would be
        # hundreds: the link really was slow, and the job went on.
        assert v["wrong"] == 0 and 3 <= v["after_event"] < 40, v


@pytest.mark.timeout(150)
@pytest.mark.skipif(tc_unavailable() is not None, reason=tc_unavailable() or "")
@pytest.mark.parametrize("mbit", [8, 4])
def test_a_slow_link_moving_data_is_no_stall(cluster_factory, mbit: int) -> None:
    """4 MiB all-reduces over a link throttled to 8 or 4 Mbit/s take seconds each, longer
    than RINGREDUCE_STALL_WARN, but their data keeps moving: no stall is reported (before,
    every one of them logged "stall: ... has waited 1 s"). Stalls count from the last data
    moved -- by this rank, or by the one it waits for, counted as it arrives: at 4 Mbit/s a
    piece took over a second, and a rank waiting for one still receiving reported a stall."""
    c = cluster_factory(2)
    env = {"RINGREDUCE_CONNECT_TIMEOUT": "30", "RINGREDUCE_STALL_WARN": "1"}

    def throttle() -> None:
        c.shape(1, f"{mbit}mbit", burst="32kb", latency="50ms", inbound=False)

    outs, _ = _run_with_link_event(c, 2, 1, 1 << 20, 6, env, throttle)
    for o in outs:
        assert o.has_result and o.value["type"] is None, o.describe()
        # 6 s at 1 MB/s: each all-reduce (2 MiB out of host 1) took about a second or more
        # (the CI once ran 6 in the 6 s and the few before the next 5-call stop check).
        assert o.value["wrong"] == 0 and 1 <= o.value["after_event"] <= 64 // mbit, o.value
        stall = [ln for ln in o.stderr.splitlines() if "stall:" in ln]
        assert not stall, f"rank {o.rank}: {stall[:2]}"


@pytest.mark.timeout(150)
@pytest.mark.skipif(tc_unavailable() is not None, reason=tc_unavailable() or "")
def test_a_stall_after_data_moved_says_for_how_long_nothing_has(cluster_factory) -> None:
    """The same slow link, then cut: the all-reduce in flight had moved data, so its stall
    report says how long nothing has moved, not only how long the collective has waited
    (which counts the seconds its data was moving)."""
    c = cluster_factory(2)
    env = {"RINGREDUCE_CONNECT_TIMEOUT": "30", "RINGREDUCE_STALL_WARN": "1",
           "RINGREDUCE_HEARTBEAT_TIMEOUT": "4"}

    def throttle_then_cut() -> None:
        c.shape(1, "8mbit", burst="32kb", latency="50ms", inbound=False)
        time.sleep(2.5)
        c.link(1, "down")

    outs, _ = _run_with_link_event(c, 2, 1, 1 << 20, 30, env, throttle_then_cut)
    moved = 0
    for o in outs:
        assert o.has_result and o.value["type"] == "PeerFailure", o.describe()
        stall = [ln for ln in o.stderr.splitlines() if "stall:" in ln]
        assert len(stall) == 1, f"rank {o.rank}: {stall}"
        m = re.search(r"has waited ([\d.]+) s in allreduce #\d+ \(\w+, ([\d.]+) MiB received",
                      stall[0])
        assert m, stall[0]
        waited, got = float(m.group(1)), float(m.group(2))
        idle = re.search(r"; no data moved for ([\d.]+) s", stall[0])
        if got == 0:  # rank 1 (its inbound link is not throttled): in the next collective
            assert idle is None, stall[0]
            continue
        moved += 1  # rank 0, receiving over the throttled link when it was cut
        assert idle and 1 <= float(idle.group(1)) < waited, stall[0]
    assert moved, "no rank's stall report came from a collective that had moved data"


@pytest.mark.timeout(120)
@pytest.mark.skipif(tc_unavailable() is not None, reason=tc_unavailable() or "")
def test_a_rank_aborting_mid_frame_is_named_with_its_reason(cluster_factory) -> None:
    """Rank 1 aborts (a watchdog's rr.abort()) while a broadcast frame to rank 0 is half
    sent over a 50 Mbit/s link: its abort frame could not be sent mid-frame, so rank 0 saw
    only the close -- "closed the connection ... (the peer process probably exited or
    crashed)" about a live rank (found by a helper). The frame is now finished with zeros
    and rank 0 is told why."""
    c = cluster_factory(2, "50mbit")
    outs = run_world_raw(2, "fault_workers:abort_mid_frame", 16 << 20, 0.5, timeout=90,
                         env=ENV, master_addr=c.addr(0), rank_prefix=c.prefix(1))
    v0, v1 = outs[0].value, outs[1].value
    assert v1 and "aborted" in v1["msg"], outs[1].describe()
    assert v0 and v0["type"] is not None, outs[0].describe()
    assert "rank 1" in v0["msg"] and "failed" in v0["msg"], v0["msg"]
    assert "closed the connection" not in v0["msg"], v0["msg"]


def _setup_outcomes(c: Cluster, rank_env: dict) -> list:
    return run_world_raw(2, "fault_workers:init_outcome", {}, timeout=60, init=False,
                         env=dict(ENV, MASTER_PORT=str(free_port())), rank_env=rank_env,
                         master_addr=c.addr(0), rank_prefix=c.prefix(1))


@pytest.mark.timeout(120)
def test_a_rank_listening_on_loopback_is_refused_on_every_rank_at_once(cluster_factory) -> None:
    """Rank 0's MASTER_ADDR is a loopback address on its own host (as Debian's '127.0.1.1
    <hostname>' line makes a host name): it listens there, where rank 1 (another host)
    cannot reach it. Before, rank 1 was refused on its own host and said rank 0 had exited,
    and rank 0 waited for it until RINGREDUCE_CONNECT_TIMEOUT (found by a helper)."""
    c = cluster_factory(2)
    outs = _setup_outcomes(c, {0: {"MASTER_ADDR": "127.0.0.1"}})
    for o in outs:
        assert o.has_result, o.describe()
        v = o.value
        assert v["type"] == "ValueError", v
        assert "listens on 127.0.0.1:" in v["msg"] and "loopback" in v["msg"], v["msg"]
        assert "rank(s) 1 run on other hosts" in v["msg"], v["msg"]
        assert v["elapsed"] < 15, v  # imports and the rendezvous, not the 30 s timeout


@pytest.mark.timeout(150)
@pytest.mark.parametrize("route", ["none", "dead-gateway"])
def test_no_route_to_a_published_address_stops_every_rank(cluster_factory, route: str) -> None:
    """Rank 0 listens (RINGREDUCE_SOCKET_IFNAME) on an interface of an address host 1 cannot
    reach. With no route at all, rank 1's connect fails at once (ENETUNREACH) and says why;
    with a route through a gateway that never answers (EHOSTUNREACH from address resolution,
    which a link coming back would mend) it retries for 15 s, then says no host answered.
    Rank 0, waiting for rank 1's connection, stops at its next check of the store. Before,
    both waited until RINGREDUCE_CONNECT_TIMEOUT (found by a helper)."""
    c = cluster_factory(2)
    dev = "rrx0"  # a veth pair inside host 0's namespace (removed with it): no dummy module
    for cmd in (["link", "add", dev, "type", "veth", "peer", "name", "rrx1"],
                ["addr", "add", "10.99.0.1/24", "dev", dev], ["link", "set", dev, "up"],
                ["link", "set", "rrx1", "up"]):
        c.on(0, "ip", *cmd)
    if route == "dead-gateway":  # on host 1's subnet, no host: its ARP goes unanswered
        c.on(1, "ip", "route", "add", "10.99.0.0/24", "via", f"{SUBNET}.200")
    outs = _setup_outcomes(c, {0: {"RINGREDUCE_SOCKET_IFNAME": dev}})
    v0, v1 = (o.value for o in outs)
    assert outs[1].has_result and v1["type"] == "RingReduceError", outs[1].describe()
    if route == "none":
        assert "Network is unreachable" in v1["msg"] and "no route" in v1["msg"], v1["msg"]
        took = (0, 15)
    else:
        assert "No route to host" in v1["msg"] and "no host answered" in v1["msg"], v1["msg"]
        took = (14, 29)  # the 15 s grace, not the 30 s RINGREDUCE_CONNECT_TIMEOUT
    assert "RINGREDUCE_SOCKET_IFNAME" in v1["msg"], v1["msg"]
    assert outs[0].has_result and v0["type"] is not None, outs[0].describe()
    assert "another rank failed" in v0["msg"] and "10.99.0.1" in v0["msg"], v0["msg"]
    assert took[0] < v1["elapsed"] < took[1] and v0["elapsed"] < took[1] + 5, (v0, v1)


@pytest.mark.timeout(120)
def test_transport_shm_across_hosts_is_refused_on_every_rank(cluster_factory) -> None:
    """RINGREDUCE_TRANSPORT=shm with ranks on two hosts: every rank refuses it when the
    core chooses the transports (transport/select.cc), naming the setting and what to use,
    before any connection -- not after the connect timeout."""
    c = cluster_factory(2)
    outs = _setup_outcomes(c, {r: {"RINGREDUCE_TRANSPORT": "shm"} for r in (0, 1)})
    for o in outs:
        assert o.has_result, o.describe()
        v = o.value
        assert v["type"] == "ValueError", v
        assert "RINGREDUCE_TRANSPORT=shm needs every rank on one host" in v["msg"], v["msg"]
        assert "ranks run on 2 hosts" in v["msg"] and "use auto" in v["msg"], v["msg"]
        assert v["elapsed"] < 15, v
