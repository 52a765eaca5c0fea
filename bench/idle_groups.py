#!/usr/bin/env python
"""What live but unused groups cost: CPU time and heartbeat datagrams while nothing runs.

    python bench/idle_groups.py --json bench/idle_groups.json --plot bench/idle_groups.png \
        --before bench/idle_groups_c50b851.json

On a world of N = 4 and 8 ranks (one host, shared memory: the default), each rank creates
G = 0, 8 and 32 groups over all ranks, runs one all-reduce on each (result checked), then
sleeps --idle seconds. Reported per setup: the CPU time a rank's process used while idle
(user + system, % of one core; median and maximum over ranks) and the heartbeat datagrams it
sent per second (every communicator's link_stats, summed). A final all-reduce on every
group after the idle stretch (checked) shows none of them failed meanwhile. Each setup is
launched --repeat times; the launch with the median CPU time is kept. --before draws an
earlier run's JSON beside (dashed); --replot JSON draws a run again without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import _local  # bench/_local.py (this script's directory is on sys.path)

WORLDS = (4, 8)
GROUPS = (0, 8, 32)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sent(comms: list) -> int:
    return sum(c.link_stats()["heartbeat_sent"] for c in comms)


def _check_all(groups: list, rank: int, n: int) -> None:
    import numpy as np

    import ringreduce as rr

    for g in [None, *groups]:
        x = np.full(5, rank + 1, np.float64)
        rr.allreduce(x, group=g)
        if not (x == n * (n + 1) / 2).all():
            raise AssertionError(f"rank {rank}: wrong all-reduce result on {g}")


def worker(mode: str, out: str, idle: int) -> None:
    import ringreduce as rr

    rr.init()
    rank, n = rr.get_rank(), rr.get_world_size()
    groups = [rr.new_group() for _ in range(int(mode))]
    _check_all(groups, rank, n)
    rr.barrier()
    time.sleep(1.0)  # set-up's helpers and the first heartbeat rounds are over
    comms = [rr.world_group().comm] + [g.comm for g in groups]
    c0, s0, t0 = _cpu(), _sent(comms), time.perf_counter()
    time.sleep(idle)
    c1, s1, t1 = _cpu(), _sent(comms), time.perf_counter()
    _check_all(groups, rank, n)
    with open(out, "w") as f:
        json.dump({"cpu_pct": 100 * (c1 - c0) / (t1 - t0),
                   "datagrams_per_s": (s1 - s0) / (t1 - t0), "threads": len(os.listdir(
                       "/proc/self/task"))}, f)
    for g in groups:
        g.destroy()
    rr.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="draw CPU per rank against the number of groups (PNG)")
    ap.add_argument("--idle", type=int, default=10, help="seconds idle per launch")
    ap.add_argument("--repeat", type=int, default=3, help="launches of each setup")
    ap.add_argument("--before", help="an earlier run's JSON, drawn dashed beside this one")
    ap.add_argument("--replot", help="draw this JSON (no measuring)")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            _plot(json.load(f)["rows"], a)
        return
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ringreduce.bench.machine import describe

    rows: dict = {}
    for n in WORLDS:
        for g in GROUPS:
            runs = []
            for _ in range(a.repeat):
                outs = _local.launch(__file__, n, str(g), a.idle)
                cpus = [o["cpu_pct"] for o in outs]
                runs.append({"cpu_pct_median": statistics.median(cpus), "cpu_pct_max": max(cpus),
                             "datagrams_per_s": statistics.median(
                                 o["datagrams_per_s"] for o in outs),
                             "threads": max(o["threads"] for o in outs)})
            runs.sort(key=lambda r: r["cpu_pct_median"])
            rows[f"{n}x{g}"] = {**runs[len(runs) // 2], "world": n, "groups": g, "runs": runs}
            r = rows[f"{n}x{g}"]
            print(f"{n} ranks, {g:>2} idle groups: CPU per rank {r['cpu_pct_median']:.2f}% "
                  f"(max {r['cpu_pct_max']:.2f}%), {r['datagrams_per_s']:.0f} heartbeat "
                  f"datagrams/s per rank, {r['threads']} threads", flush=True)
    res = {"machine": describe(), "rows": rows, "idle_s": a.idle, "repeat": a.repeat,
           "checked": True}
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump(res, f, indent=1)
    _plot(rows, a)


def _plot(rows: dict, a: argparse.Namespace) -> None:
    if not a.plot:
        return
    before = None
    if a.before:
        with open(a.before) as f:
            before = json.load(f)["rows"]
    fig, ax = _local.axes()
    for n in WORLDS:
        line, = ax.plot(GROUPS, [rows[f"{n}x{g}"]["cpu_pct_median"] for g in GROUPS],
                        marker="o", label=f"{n} ranks")
        if before:
            ax.plot(GROUPS, [before[f"{n}x{g}"]["cpu_pct_median"] for g in GROUPS], ls="--",
                    marker="x", color=line.get_color(), label=f"{n} ranks, before")
    ax.set_xlabel("idle groups over all ranks")
    ax.set_ylabel("CPU per rank while idle (% of a core)")
    ax.set_title("what unused groups cost")
    ax.legend()
    _local.save(fig, a.plot)

if __name__ == "__main__":
    _local.entry(worker, main)
