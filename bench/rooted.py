#!/usr/bin/env python
"""reduce / gather / scatter at 64 MiB and all_to_all at 16 MiB per rank: ringreduce
(shared memory and TCP) against torch.distributed's gloo backend, 2 and 4 ranks, same run;
ringreduce's all-reduce of 64 MiB alongside (the bar: never slower than it).

    python bench/rooted.py --floor --json bench/rooted.json --plot bench/rooted.png

Sizes follow nccl-tests: reduce moves a 64 MiB buffer per rank to the root; gather's
output and scatter's input are 64 MiB in all (64 MiB / n per rank); all_to_all sends
16 MiB per rank. Each iteration starts after a barrier; its time is the slowest rank's;
the table shows the median over --iters after 2 warm-ups, for the fastest of --repeat
interleaved launches (every launch is in the JSON). Every result is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _local  # bench/_local.py (this script's directory is on sys.path)

OPS = ["reduce", "gather", "scatter", "all_to_all", "allreduce"]
MIB = 1 << 20


def _rr_ops(rank: int, n: int):
    import numpy as np

    import ringreduce as rr

    rr.init()
    red = np.empty(64 * MIB // 4, np.float32)
    part = np.full(64 * MIB // 4 // n, float(rank), np.float32)
    full = np.repeat(np.arange(n, dtype=np.float32), 64 * MIB // 4 // n)
    a2a = np.repeat(np.arange(n, dtype=np.float32) + 10 * rank, 16 * MIB // 4 // n)
    out = np.empty_like(a2a)
    want_a2a = np.repeat(np.arange(n, dtype=np.float32) * 10 + rank, 16 * MIB // 4 // n)
    tot = float(sum(range(1, n + 1)))

    def reduce() -> bool:
        rr.reduce(red, dst=0)
        return rank != 0 or bool(red[0] == tot and red[-1] == tot)

    gout = np.zeros((n, part.size), np.float32) if rank == 0 else None  # outputs made once,
    sout = np.zeros_like(part)  # as for gloo (a fresh 64 MiB array costs its page faults)

    def gather() -> bool:
        o = rr.gather(part, dst=0, out=gout)
        return rank != 0 or bool((o[:, 0] == np.arange(n)).all() and (o[:, -1] == np.arange(n)).all())

    def scatter() -> bool:
        sout.fill(-1)
        rr.scatter(sout, src=0, x=full if rank == 0 else None)
        return bool(sout[0] == rank and sout[-1] == rank)

    def all_to_all() -> bool:
        rr.all_to_all(a2a, out=out)
        return bool(np.array_equal(out, want_a2a))

    def allreduce() -> bool:
        rr.allreduce(red)
        return bool(red[0] == tot and red[-1] == tot)

    return {"reduce": reduce, "gather": gather, "scatter": scatter, "all_to_all": all_to_all,
            "allreduce": allreduce}, lambda: red.fill(rank + 1), rr.barrier, rr.destroy


def _gloo_ops(rank: int, n: int):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    red = torch.empty(64 * MIB // 4)
    part = torch.full((64 * MIB // 4 // n,), float(rank))
    outs = [torch.empty_like(part) for _ in range(n)] if rank == 0 else None
    full = [torch.full_like(part, float(r)) for r in range(n)] if rank == 0 else None
    a2a = torch.repeat_interleave(torch.arange(n, dtype=torch.float32) + 10 * rank,
                                  16 * MIB // 4 // n)
    out = torch.empty_like(a2a)
    want_a2a = torch.repeat_interleave(torch.arange(n, dtype=torch.float32) * 10 + rank,
                                       16 * MIB // 4 // n)
    tot = float(sum(range(1, n + 1)))

    def reduce() -> bool:
        dist.reduce(red, dst=0)
        return rank != 0 or bool(red[0] == tot and red[-1] == tot)

    def gather() -> bool:
        dist.gather(part, gather_list=outs, dst=0)
        return rank != 0 or all(bool(o[0] == r) for r, o in enumerate(outs))

    sout = torch.zeros_like(part)

    def scatter() -> bool:
        sout.fill_(-1)
        dist.scatter(sout, scatter_list=full, src=0)
        return bool(sout[0] == rank and sout[-1] == rank)

    def all_to_all() -> bool:
        dist.all_to_all_single(out, a2a)
        return bool(torch.equal(out, want_a2a))

    def allreduce() -> bool:
        dist.all_reduce(red)
        return bool(red[0] == tot)

    return {"reduce": reduce, "gather": gather, "scatter": scatter, "all_to_all": all_to_all,
            "allreduce": allreduce}, lambda: red.fill_(rank + 1), dist.barrier, \
        dist.destroy_process_group


def worker(lib: str, out: str, iters: int) -> None:
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if lib == "floor":
        from _tcp_floor import floor_ops

        ops, reset, barrier, finish = floor_ops(rank, n)
    else:
        ops, reset, barrier, finish = (_gloo_ops if lib == "gloo" else _rr_ops)(rank, n)
    res = {}
    for name in [op for op in OPS if op in ops]:
        ts = []
        for i in range(iters + 2):
            reset()  # reduce/allreduce inputs (outside the timed region)
            barrier()
            t = time.perf_counter()
            ok = ops[name]()
            if i >= 2:
                ts.append(time.perf_counter() - t)
            if not ok:
                raise AssertionError(f"{lib} rank {rank}: wrong {name} result")
        res[name] = ts
    with open(out, "w") as f:
        json.dump(res, f)
    finish()


def _launch(lib: str, n: int, transport: str, iters: int) -> dict:
    per_rank = _local.launch(__file__, n, lib, iters, transport, timeout=900)
    # an iteration lasts until its slowest rank is done
    return {op: statistics.median(max(pr[op][i] for pr in per_rank)
                                  for i in range(len(per_rank[0][op]))) * 1e3
            for op in OPS if op in per_rank[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--repeat", type=int, default=3,
                    help="launches of each setup, interleaved; the fastest launch counts (a "
                         "whole launch can run in a slow mode on this VM)")
    ap.add_argument("--floor", action="store_true",
                    help="also time the same bytes over plain sockets (bench/_tcp_floor.py): "
                         "the kernel's floor for the TCP rows")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ringreduce.bench.machine import describe

    res: dict = {}
    launches: dict = {}
    for n in [int(v) for v in a.ranks.split(",")]:
        runs: dict = {}
        for _ in range(a.repeat):
            for label, lib, transport in [("ringreduce-shm", "rr", "shm"),
                                          ("ringreduce-tcp", "rr", "tcp"),
                                          ("gloo", "gloo", "auto"),
                                          ("tcp-floor", "floor", "tcp")][:None if a.floor
                                                                         else 3]:
                r = _launch(lib, n, transport, a.iters)
                runs.setdefault(label, []).append(r)
                print(f"{n} ranks {label:15s} " + "  ".join(
                    f"{op} {ms:8.2f} ms" for op, ms in r.items()), flush=True)
        res[n] = {label: {op: min(r[op] for r in rs) for op in rs[0]}
                  for label, rs in runs.items()}
        launches[n] = runs
    ratios = {n: {t: {op: r["gloo"][op] / r[t][op] for op in OPS}
                  for t in ("ringreduce-shm", "ringreduce-tcp")} for n, r in res.items()}
    # gloo / floor: the most any library on the kernel's TCP could beat gloo by here
    floor = {n: {t: {op: r[t][op] / r["tcp-floor"][op] for op in r["tcp-floor"]}
                 for t in ("gloo", "ringreduce-tcp")} for n, r in res.items() if "tcp-floor" in r}
    for n, r in ratios.items():
        for t, v in r.items():
            print(f"{n} ranks {t} speed-up over gloo: " +
                  ", ".join(f"{op} {x:.2f}x" for op, x in v.items()))
    for n, r in floor.items():
        for t, v in r.items():
            print(f"{n} ranks {t} time / TCP floor: " +
                  ", ".join(f"{op} {x:.2f}" for op, x in v.items()))
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump({"machine": describe(), "ms": res, "speedup_vs_gloo": ratios,
                       "time_over_tcp_floor": floor,
                       "launches_ms": launches, "checked": True, "iters": a.iters,
                       "repeat": a.repeat}, f, indent=1)
    if a.plot:
        fig, axes = _local.axes(len(res), (5 * len(res), 3.6), squeeze=False)
        for ax, (n, r) in zip(axes[0], res.items()):
            w = 0.8 / len(r)
            for k, label in enumerate(r):
                ks = [i for i, op in enumerate(OPS) if op in r[label]]
                ax.bar([i + (k - (len(r) - 1) / 2) * w for i in ks],
                       [r[label][OPS[i]] for i in ks], w, label=label)
            ax.set_xticks(range(len(OPS)), OPS, rotation=20)
            ax.set_yscale("log")
            ax.set_ylabel("ms (median, slowest rank)")
            ax.set_title(f"{n} ranks")
            ax.legend(fontsize=8)
        _local.save(fig, a.plot)


if __name__ == "__main__":
    _local.entry(worker, main)
