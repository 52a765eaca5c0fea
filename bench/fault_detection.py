#!/usr/bin/env python
"""How long until the surviving ranks learn that a peer died (SIGKILL) or froze (SIGSTOP),
and does the error name it? ringreduce (TCP and shared memory, default settings) against
torch.distributed's gloo backend, same machine, same run.

    python bench/fault_detection.py                    # 3 ranks, 3 repetitions
    python bench/fault_detection.py --json bench/fault_detection.json --plot bench/fault_detection.png

Each run starts 3 ranks that loop over 64 KiB all-reduces; after 20 iterations rank 1 stamps
the wall-clock time and kills or stops itself. Every survivor records when its all-reduce
raised and the message. Latency = raise time - stamp. gloo runs with a 30 s process-group
timeout (its default is 30 min); a survivor still waiting after --limit seconds counts as
"no error" at the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

LIBS = ["ringreduce-tcp", "ringreduce-shm", "gloo"]
FAULTS = ["kill", "stop"]
VICTIM = 1


def _worker(lib: str, fault: str, out: str, stamp: str) -> None:
    import numpy as np

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    n = 16 * 1024
    expect = world * (world + 1) / 2  # every rank contributes rank + 1
    wrong = [0]  # iterations whose result was not the expected sum (checked every time)
    if lib == "gloo":
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
        x = torch.ones(n)

        def step() -> None:
            x.fill_(rank + 1)
            dist.all_reduce(x)
            wrong[0] += int(not bool((x == expect).all()))
    else:
        import ringreduce as rr

        rr.init()
        x = np.ones(n, np.float32)

        def step() -> None:
            x.fill(rank + 1)
            rr.allreduce(x)
            wrong[0] += int(not (x == expect).all())
    for _ in range(20):
        step()
    if rank == VICTIM:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    try:
        while True:
            step()
    except Exception as e:  # noqa: BLE001 - whatever the library raises is the result
        res = {"t": time.time(), "type": type(e).__name__, "msg": str(e)[:400],
               "wrong": wrong[0]}
    with open(out, "w") as f:
        json.dump(res, f)
    os._exit(0)  # do not wait in teardown for the dead peer


def _read_time(path: str) -> float:
    with open(path) as f:
        return float(f.read() or 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(lib: str, fault: str, world: int, limit: float) -> list[dict]:
    tmp = tempfile.mkdtemp(prefix="rr_faultbench_")
    stamp = os.path.join(tmp, "stamp")
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        if lib.startswith("ringreduce"):
            env["RINGREDUCE_TRANSPORT"] = lib.split("-")[1]
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", lib, fault, os.path.join(tmp, f"out{r}"),
             stamp], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
    t_end = time.monotonic() + limit + 30
    survivors = [r for r in range(world) if r != VICTIM]
    try:
        while time.monotonic() < t_end:
            if all(procs[r].poll() is not None for r in survivors):
                break
            if os.path.exists(stamp) and time.time() - _read_time(stamp) > limit:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    t_fault = _read_time(stamp) if os.path.exists(stamp) else None
    rows = []
    for r in survivors:
        path = os.path.join(tmp, f"out{r}")
        if t_fault is None or not os.path.exists(path):
            rows.append({"rank": r, "latency": limit, "named": False, "type": None, "msg": "",
                         "wrong": 0})
            continue
        with open(path) as f:
            res = json.load(f)
        rows.append({"rank": r, "latency": res["t"] - t_fault, "type": res["type"],
                     "wrong": res["wrong"],
                     "msg": res["msg"], "named": bool(re.search(rf"\brank {VICTIM}\b", res["msg"]))})
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _plot(results: dict, world: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    keys = list(results)
    med = [max(results[k]["median_s"], 1e-3) for k in keys]
    ax.barh(keys, med, color=["C0" if k.startswith("ringreduce") else "C3" for k in keys])
    ax.set_xscale("log")
    ax.set_xlim(right=max(med) * 30)
    ax.set_xlabel("seconds from fault to error on the survivors (median, log scale)")
    ax.set_title(f"Dead (kill) / frozen (stop) rank 1 of {world}; ringreduce defaults, "
                 f"gloo with a 30 s timeout", fontsize=10)
    for i, k in enumerate(keys):
        r = results[k]
        ax.text(med[i] * 1.15, i, f"{r['median_s']:.3g} s; error names rank {VICTIM}: "
                f"{r['named_victim']}/{r['survivors']}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("-n", "--nproc", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--limit", type=float, default=40.0, help="give up on a survivor after this")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="only draw --plot from an earlier --json file")
    a = p.parse_args(argv)
    if a.worker:
        _worker(*a.worker)
        return 0
    from ringreduce.bench.machine import describe

    if a.replot:
        with open(a.replot) as f:
            _plot(json.load(f)["results"], a.nproc, a.plot)
        return 0
    results = {}
    for lib in LIBS:
        for fault in FAULTS:
            reps = 1 if (lib == "gloo" and fault == "stop") else a.reps  # 30 s each
            rows = [row for _ in range(reps) for row in run_once(lib, fault, a.nproc, a.limit)]
            lat = [r["latency"] for r in rows]
            results[f"{lib}/{fault}"] = {
                "median_s": statistics.median(lat), "max_s": max(lat),
                "named_victim": sum(r["named"] for r in rows), "survivors": len(rows),
                "wrong_results": sum(r["wrong"] for r in rows),
                "example": next((r["msg"] for r in rows if r["msg"]), "")}
            s = results[f"{lib}/{fault}"]
            print(f"{lib:15s} {fault:5s} median {s['median_s']:7.3f} s  max {s['max_s']:7.3f} s  "
                  f"named rank {VICTIM}: {s['named_victim']}/{s['survivors']}  "
                  f"wrong results: {s['wrong_results']}", flush=True)
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump({"command": "python bench/fault_detection.py " + " ".join(argv or sys.argv[1:]),
                       "machine": describe(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "check": "every all-reduce result checked (wrong_results)",
                       "world": a.nproc, "victim": VICTIM, "results": results}, f, indent=1)
    if a.plot:
        _plot(results, a.nproc, a.plot)
    return 1 if any(s["wrong_results"] for s in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
