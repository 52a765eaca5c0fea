#!/usr/bin/env python
"""Groups on the shared links against groups on their own connections, across hosts.

    python tests/netcluster.py run 4 1gbit --timeout 1500 -- python bench/groups_net.py \
        --rate 1gbit --rounds 30 --json bench/groups_net_1gbit.json \
        --plot bench/groups_net_1gbit.png
    python bench/groups_net.py -n 4 --rounds 12 --repeat 5 \
        --json bench/groups_net_loopback.json --plot bench/groups_net_loopback.png  # loopback

One job (each rank on its own emulated host under tests/netcluster.py, which needs root; or
N local ranks over loopback TCP without it) makes three communicators over all its ranks:
the world (its own connections: the anchor), a group with RINGREDUCE_GROUP_LINKS=0 (`own`:
its own connections among its members) and one with the default (`links`: streams on the
one connection per pair of processes that every group shares). Then for each size
(float32, 8 B .. 16 MiB) the three take turns, in a rotating order, for --rounds rounds of a
few all-reduces each; every result is checked against numpy's sum of the ranks' inputs.
Rank 0's per-call times give each setup's median (and minimum); the ratios compare those
medians within the same job. Creation time and the TCP sockets each group added are
recorded too (the first `links` group makes the links; a second one only streams on them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _local  # bench/_local.py (this script's directory is on sys.path)

SIZES = [8, 64 * 1024, 1 << 20, 16 << 20]
SETUPS = ("world", "own", "links")


def _calls(size: int) -> int:
    """All-reduces per setup per round: enough to time, few at 16 MiB over 1 Gbit/s."""
    return 20 if size <= 64 * 1024 else 8 if size <= 1 << 20 else 2


def _make_group(links: bool) -> tuple:
    import ringreduce as rr
    from ringreduce._fds import tcp_sockets

    os.environ["RINGREDUCE_GROUP_LINKS"] = "1" if links else "0"  # read per new_group
    before = tcp_sockets()
    rr.barrier()
    t = time.perf_counter()
    g = rr.new_group()
    ms = (time.perf_counter() - t) * 1e3
    rr.allreduce(__import__("numpy").ones(4), group=g)  # connections a first call makes too
    return g, {"create_ms": ms, "tcp_sockets_added": tcp_sockets() - before}


def _time_sizes(groups: dict, rank: int, world: int, rounds: int) -> dict:
    import numpy as np

    import ringreduce as rr

    out: dict = {}
    for size in SIZES:
        n = max(1, size // 4)
        base = (np.arange(n) % 251).astype(np.float32)
        want = base * world + world * (world - 1) / 2  # sum over ranks of base + rank
        x = np.empty(n, np.float32)
        times: dict = {s: [] for s in SETUPS}
        # Round 0 warms up, ten times longer below 16 MiB: a new group's first few hundred
        # small calls run slower (8 B, ad hoc: up to 25% over links, 9% on own connections).
        for r in range(rounds + 1):
            order = SETUPS[r % 3:] + SETUPS[:r % 3]
            for setup in order:
                for _ in range(_calls(size) * (10 if r == 0 and size <= 1 << 20 else 1)):
                    np.add(base, rank, out=x)
                    t = time.perf_counter()
                    rr.allreduce(x, group=groups[setup])
                    dt = time.perf_counter() - t
                    if not np.array_equal(x, want):
                        raise AssertionError(f"rank {rank}: wrong all-reduce at {size} B "
                                             f"({setup})")
                    if r:
                        times[setup].append(dt)
        out[size] = {s: {"median_us": statistics.median(v) * 1e6, "min_us": min(v) * 1e6,
                         "calls": len(v)} for s, v in times.items()}
        if rank == 0:
            m = {s: out[size][s]["median_us"] for s in SETUPS}
            print(f"{size:>9} B: world {m['world']:9.1f} us, own {m['own']:9.1f} us, links "
                  f"{m['links']:9.1f} us; links/own {m['links'] / m['own']:.2f}", flush=True)
    return out


def run_rank(rounds: int) -> dict:
    import ringreduce as rr

    rr.init()
    rank, world = rr.get_rank(), rr.get_world_size()
    own, c_own = _make_group(links=False)
    links, c_links = _make_group(links=True)
    second, c_second = _make_group(links=True)
    second.destroy()
    from ringreduce import _state

    w = _state.current("groups_net")
    res = {"world": world, "hosts": len(set(w.hosts)) if w.hosts else 1,
           "shm": bool(getattr(w.comm, "uses_shm", False)),
           "create": {"own": c_own, "links_first": c_links, "links_second": c_second},
           "allreduce": _time_sizes({"world": None, "own": own, "links": links}, rank,
                                    world, rounds)}
    links.destroy()
    own.destroy()
    rr.destroy()
    return res


def worker(mode: str, out: str, rounds: int) -> None:  # a local rank (_local.launch)
    res = run_rank(rounds)
    with open(out, "w") as f:
        json.dump(res, f)


def report(res: dict, a: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ringreduce.bench.machine import describe

    for size, row in res["allreduce"].items():
        m = {s: row[s]["median_us"] for s in SETUPS}
        row["ratio"] = {"own/world": m["own"] / m["world"],
                        "links/world": m["links"] / m["world"], "links/own": m["links"] / m["own"]}
        if "launches" in res:
            print(f"{size:>9} B (median of {len(res['launches'])} launches): world "
                  f"{m['world']:9.1f} us, own {m['own']:9.1f} us, links {m['links']:9.1f} us; "
                  f"links/own {row['ratio']['links/own']:.2f} (median of the launches' "
                  f"ratios {row['links/own_median_of_launches']:.2f})", flush=True)
    machine = describe()
    res.update({"machine": machine, "rate": a.rate, "rounds": a.rounds, "checked": True,
                "commit": machine.get("ringreduce_commit", ""), "command": " ".join(sys.argv)})
    print("creation:", json.dumps(res["create"]), flush=True)
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump(res, f, indent=1)
    if a.plot:
        fig, ax = _local.axes()
        xs = [int(k) for k in res["allreduce"]]
        for key in ("own/world", "links/world"):
            ax.plot(xs, [res["allreduce"][k]["ratio"][key] for k in res["allreduce"]],
                    marker="o", label=key)
        ax.axhline(1.0, color="gray", ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("group / world (medians)")
        ax.set_title(f"all-reduce, group of all {res['world']} ranks, {a.rate}")
        ax.legend()
        _local.save(fig, a.plot)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=4, help="local ranks when not started as a job")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1,
                    help="local launches (not as a job), each setup's median taken over them")
    ap.add_argument("--rate", default="loopback", help="the link rate, for the record")
    ap.add_argument("--json", help="write the results here (rank 0)")
    ap.add_argument("--plot", help="draw the group/world ratios here (PNG, rank 0)")
    a = ap.parse_args()
    if "RANK" in os.environ:  # one rank of a job (tests/netcluster.py run, torchrun)
        res = run_rank(a.rounds)
        if int(os.environ["RANK"]) == 0:
            report(res, a)
        return
    runs = [_local.launch(__file__, a.n, "ab", a.rounds, "tcp", timeout=1800)[0]
            for _ in range(a.repeat)]
    report(_merge(runs) if len(runs) > 1 else runs[0], a)


def _merge(runs: list) -> dict:
    """Several local launches as one result: each setup's median is the median of the
    launches' medians (a whole launch can run in a slow mode on a small VM); every launch
    is kept."""
    res = {**runs[0], "launches": runs}
    res["allreduce"] = {size: {s: {"median_us": statistics.median(r["allreduce"][size][s][
        "median_us"] for r in runs), "min_us": min(r["allreduce"][size][s]["min_us"]
                                                   for r in runs)} for s in SETUPS}
        for size in runs[0]["allreduce"]}
    for size, row in res["allreduce"].items():  # and each launch's own ratio, paired
        row["links/own_per_launch"] = [r["allreduce"][size]["links"]["median_us"] /
                                       r["allreduce"][size]["own"]["median_us"] for r in runs]
        row["links/own_median_of_launches"] = statistics.median(row["links/own_per_launch"])
    return res


if __name__ == "__main__":
    _local.entry(worker, main)
