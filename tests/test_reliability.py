"""Failure detection beyond closed sockets, and the debugging aids: a frozen (SIGSTOPped)
peer is named on every rank within the heartbeat deadline; traces and flight-recorder
dumps are valid JSON with the expected events; the payload checksum keeps results right;
init/destroy cycles leak no fds, threads or /dev/shm entries."""

from __future__ import annotations

import json

import pytest
from _spawn import run_world, run_world_raw

TRANSPORTS = ["tcp", "shm"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world,victim", [(2, 1), (3, 0), (4, 2)])
def test_frozen_peer_is_named_on_every_rank(transport: str, world: int, victim: int) -> None:
    env = {"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_HEARTBEAT_TIMEOUT": "2"}
    outs = run_world_raw(world, "shm_workers:victim", victim, 1024, "stop", timeout=40, env=env,
                         expendable=[victim])
    for o in outs:
        if o.rank == victim:
            continue  # stopped, then killed by the spawn helper once the others are done
        assert o.value is not None, o.describe()  # (a rank that raised: its error shown)
        v = o.value
        assert v["type"] in ("PeerFailure", "CollectiveMismatch", "CollectiveTimeout"), v
        assert f"rank {victim}" in v["msg"], v["msg"]
        assert v["after"] < 8, v  # 2 s heartbeat timeout + slack for a loaded 2-core box


@pytest.mark.timeout(60)
def test_trace_file_is_chrome_json(tmp_path) -> None:
    pattern = str(tmp_path / "trace.json")
    events = run_world(2, "shm_workers:traced", 1000, env={"RINGREDUCE_TRACE": pattern})
    assert [e[0] for e in events[0]] == ["allreduce"] * 3 + ["broadcast", "barrier"]
    for r in range(2):
        data = json.loads((tmp_path / f"trace.rank{r}.json").read_text())
        spans = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        assert [s["name"].split(" #")[0] for s in spans] == \
            ["allreduce"] * 3 + ["broadcast", "barrier"]
        assert all(s["pid"] == r and s["dur"] >= 0 and s["args"]["ok"] for s in spans)
        assert spans[0]["args"]["bytes"] == 4000


@pytest.mark.timeout(60)
def test_trace_file_has_a_row_per_group(tmp_path) -> None:
    """Groups' and channels' collectives were not in the trace (only the world's)."""
    pattern = str(tmp_path / "t-{rank}.json")
    run_world(3, "shm_workers:traced_groups", env={"RINGREDUCE_TRACE": pattern})
    for r in range(3):
        data = json.loads((tmp_path / f"t-{r}.json").read_text())["traceEvents"]
        rows = {e["tid"]: e["args"]["name"] for e in data if e["name"] == "thread_name"}
        spans: dict = {}
        for e in data:
            if e.get("ph") == "X":
                assert e["pid"] == r and e["args"]["ok"], e
                spans.setdefault(rows[e["tid"]], []).append(e["name"].split(" #")[0])
        # The split's exchange of colors runs on the world.
        assert spans.pop("collectives") == ["allgather", "allreduce"], (r, spans)
        assert spans.pop("group1") == ["allreduce", "allreduce"], (r, spans)
        split = [k for k in spans if "split" in k]
        # Rank 1 is alone in its half (a group of one has no communicator).
        assert len(split) == (r != 1), (r, spans)
        assert all(spans.pop(k) == ["broadcast"] for k in split), (r, spans)
        # Ranks 0 and 1 exchanged one message on tag 5: a row for that channel.
        assert len(spans) == (r < 2) and all(v == ["broadcast"] for v in spans.values()), \
            (r, spans)


@pytest.mark.timeout(60)
def test_flight_recorder_dumped_on_failure(tmp_path) -> None:
    path = str(tmp_path / "flight")
    env = {"RINGREDUCE_FLIGHT_RECORDER": path, "RINGREDUCE_TRANSPORT": "tcp"}
    outs = run_world_raw(3, "shm_workers:victim", 2, 1024, "kill", timeout=40, env=env)
    for r in (0, 1):
        assert outs[r].value["type"] == "PeerFailure", outs[r].describe()
        dump = json.loads((tmp_path / f"flight.rank{r}.json").read_text())
        assert dump["rank"] == r and "rank 2" in dump["error"]
        states = [c["state"] for c in dump["last_collectives"]]
        assert states[-1] == "failed" and states.count("ok") >= 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 3])
def test_checksummed_results_are_right(world: int) -> None:
    env = {"RINGREDUCE_CHECKSUM": "1", "RINGREDUCE_TRANSPORT": "tcp",
           "RINGREDUCE_SEGMENT_BYTES": "4096"}
    assert run_world(world, "shm_workers:checksum_run", 100_003, env=env) == [True] * world


def test_crc32c_known_value() -> None:
    from ringreduce import _C

    assert _C.crc32c(b"123456789") == 0xE3069283
    assert _C.crc32c(b"") == 0


@pytest.mark.exclusive  # counts every rr-* name in /dev/shm
@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_init_destroy_cycles_leak_nothing(transport: str) -> None:
    n = 100  # the number; about 2 s per transport
    res = run_world(2, "shm_workers:cycles", n, timeout=220, init=False,
                    env={"RINGREDUCE_TRANSPORT": transport})
    for r in res:
        assert r["fds"] <= 0 and r["threads"] <= 0 and r["shm"] <= 0, r
        assert r["rss_kib"] < 10 * 1024, r


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_strangers_cannot_disturb_a_running_job(tmp_path, transport: str) -> None:
    """10,000 garbage heartbeat datagrams and 1,000 connection attempts per rank during a
    running all-reduce loop: no wrong result, no failure (listeners are closed after init,
    heartbeats without the job's HMAC are dropped)."""
    import random
    import socket
    import threading
    import time

    world = 2
    stats = {"udp": 0, "tcp_refused": 0, "tcp_accepted": 0}

    def attacker() -> None:
        deadline = time.monotonic() + 30
        files = [tmp_path / f"addr_{r}.json" for r in range(world)]
        while not all(f.exists() for f in files) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        rng = random.Random(7)
        for f in files:
            info = json.loads(f.read_text())
            host, port = info["udp"].rsplit(":", 1)
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for i in range(10_000):
                size = rng.choice([1, 16, 44, 84, 85, 200, 1400])
                data = bytes(rng.getrandbits(8) for _ in range(min(size, 64))) * (size // 64 + 1)
                u.sendto(data[:size], (host, int(port)))
                stats["udp"] += 1
            u.close()
            host, port = info["tcp"].rsplit(":", 1)
            for i in range(1000):
                s = socket.socket()
                s.settimeout(1)
                try:
                    s.connect((host, int(port)))
                    s.sendall(b"\x00garbage" * 8)
                    stats["tcp_accepted"] += 1
                except OSError:
                    stats["tcp_refused"] += 1
                finally:
                    s.close()

    th = threading.Thread(target=attacker, daemon=True)
    th.start()
    res = run_world(world, "shm_workers:flood_target", str(tmp_path), 6.0, timeout=60,
                    env={"RINGREDUCE_TRANSPORT": transport})
    th.join(timeout=30)
    assert stats["udp"] == 10_000 * world and stats["tcp_refused"] == 1000 * world, stats
    for r in res:
        assert r["wrong"] == 0 and r["iters"] > 50, r
        assert r["rss_growth_kib"] < 10 * 1024, f"memory grew during the flood: {r}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_rank_that_left_is_not_blamed_for_a_frozen_one(transport: str) -> None:
    """A rank that called destroy() sends a last heartbeat saying so: its silence after that
    is not a failure, so the frozen rank is the one named."""
    outs = run_world_raw(3, "shm_workers:frozen_after_one_left", timeout=60,
                         expendable=[1, 2], env={"RINGREDUCE_TRANSPORT": transport,
                                                 "RINGREDUCE_TIMEOUT": "30"})
    v = outs[0].value
    assert v is not None, outs[0].describe()
    assert v["error"].startswith("PeerFailure") and v["peer_rank"] == 1, v
    assert "rank 1 " in v["error"] and v["secs"] < 10, v


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["sync", "async", "custom", "dataloader"])
def test_ctrl_c_stops_a_waiting_collective(transport: str, mode: str) -> None:
    """Python's signal handlers run while a collective (or a Work's wait()) waits: Ctrl-C
    raises KeyboardInterrupt within a fraction of a second, not when the peer arrives --
    unless the program installed a handler of its own (then as before: after the call);
    torch's DataLoader SIGCHLD handler is not one of those."""
    outs = run_world(2, "fault_workers:interrupted", mode, timeout=60,
                     env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    v0, v1 = outs
    if mode == "custom":
        assert v0["error"] == "KeyboardInterrupt" and v0["secs"] > 4 and not v0["notes"], v0
        assert v0["x"] == 6.0 and v1 == {"error": "no error", "x": 12.0}, (v0, v1)
        return
    assert v0["error"] == "KeyboardInterrupt" and v0["secs"] < 4, v0  # signal at 1 s; peer at 7
    note = "".join(v0["notes"])
    assert "ringreduce: interrupted: this rank's Python signal handler raised " \
           "KeyboardInterrupt" in note, note
    if mode in ("sync", "dataloader"):
        assert "during allreduce #" in note, note
        # rank 1 is told why rank 0 gave up, at its first or second call
        assert v1["error"].startswith("PeerFailure") and v1["peer_rank"] == 0, v1
        assert "rank 0 " in v1["error"] and "KeyboardInterrupt" in v1["error"], v1
    else:
        assert "while waiting for allreduce" in note and "goes on" in note, note
        assert v0["x"] == 6.0 and v0["x2"] == 12.0 and v1 == {"error": "no error", "x": 12.0}, \
            (v0, v1)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destroy_after_a_death_does_not_wait_for_the_dead(transport: str) -> None:
    outs = run_world_raw(3, "shm_workers:destroy_after_a_death", timeout=60, init=True,
                         env={"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "30"})
    for r in (0, 1):
        v = outs[r].value
        assert v is not None, outs[r].describe()
        assert v["error"].startswith("PeerFailure") and "rank 2 " in v["error"], (r, v)
        assert v["destroy_secs"] < 0.9, (r, v)  # was 1.0: the farewell cap after a failure
