#!/usr/bin/env python
"""Where the cost model's default constants come from: fit alpha (us per message) and beta
(ns per byte) on 2 local ranks over loopback TCP, measure gamma (ns per byte reduced), and
write them, with the machine they were measured on, to bench/alpha_beta.json.

    python bench/measure_alpha_beta.py                # writes bench/alpha_beta.json
    python bench/measure_alpha_beta.py -i 50 --out /tmp/ab.json

It runs `ringreduce-bench -n 2 --transport tcp --tune` (ringreduce/bench/tune.py: ring and
tree float32 all-reduces at a few sizes, least-squares fit of the model in
csrc/collectives/cost_model.cc) --repeat times and fits (tune.fit) each point's fastest
time -- other processes on the machine only ever slow a run down -- rounded to 3
significant digits; every run's own fit and the load average are recorded. gamma
(see _gamma_ns_per_byte) is measured apart: over TCP the fit cannot tell it from beta.

The defaults in csrc/core/params.h (alpha, beta; also tune.py's DEFAULTS) and gamma in
csrc/collectives/cost_model.cc are the values in the committed JSON; tests/test_bench.py
checks that they agree. The JSON is also a valid RINGREDUCE_TUNING_FILE.

Only TCP is measured: the cost model only chooses between the TCP ring and tree (shared
memory has its own algorithm, and an explicit ring/tree request runs over TCP even where
shared memory is enabled, so a "shm" run would measure loopback TCP again).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def _sig2(x: float) -> float:  # gamma varies by ~10% between measurements
    return float(f"{x:.2g}")


def _gamma_ns_per_byte() -> float:
    """The model's gamma, the per-byte cost of reducing: float32 a += b over 16 MiB, best of
    30, per byte of a. numpy's vectorised add stands in for the library's AVX2/AVX-512
    kernel (not reachable from Python); at this size both are bound by memory bandwidth."""
    import time

    import numpy as np

    n = 4 << 20
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    best = float("inf")
    for _ in range(30):
        t = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t)
    return best * 1e9 / (4 * n)


def _gamma_in_model() -> float:
    """gamma compiled into csrc/collectives/cost_model.cc (what the alpha/beta fit assumed):
    a 2-rank tree at alpha = beta = 0 costs bytes * gamma."""
    from ringreduce import _C

    size = 1 << 20
    return _C.predict_allreduce(2, 2, size, {"alpha_us": 0.0, "beta_ns_per_byte": 0.0}) * 1e9 / size


def _tune_once(args: argparse.Namespace) -> dict | None:
    """One `ringreduce-bench --tune` run: its fit, table and total measured time."""
    with tempfile.TemporaryDirectory() as tmp:
        fit_path = os.path.join(tmp, "fit.json")
        cmd = [sys.executable, "-m", "ringreduce.bench", "-n", "2", "--transport", "tcp",
               "--tune", "--tune-out", fit_path, "-w", str(args.warmup), "-i", str(args.iters)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        load = os.getloadavg()[0]
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        sys.stdout.write(run.stdout)
        sys.stderr.write(run.stderr)
        if run.returncode != 0 or not os.path.exists(fit_path):
            print(f"measure_alpha_beta: the tune run failed (exit {run.returncode})",
                  file=sys.stderr)
            return None
        with open(fit_path) as f:
            fit = json.load(f)
    # The table rows: " tree       8B          11.1       10.0" (algo, size, measured, model),
    # in the order of tune.TREE_SIZES then tune.RING_SIZES.
    rows = [line.split() for line in run.stdout.splitlines()
            if line.split()[:1] in (["tree"], ["ring"])]
    return {"fit": fit, "load_avg_1min_before": load,
            "measured_us": [float(r[2]) for r in rows],
            "tune_output": [line for line in run.stdout.splitlines()
                            if line.strip() and "wrote" not in line]}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-i", "--iters", type=int, default=20)
    p.add_argument("--repeat", type=int, default=5,
                   help="tune runs; each point's fastest time is fitted (default 5)")
    p.add_argument("--out", default=os.path.join(HERE, "alpha_beta.json"))
    args = p.parse_args(argv)
    runs = []
    for _ in range(args.repeat):
        run = _tune_once(args)
        if run is None:
            return 1
        runs.append(run)
    sys.path.insert(0, ROOT)
    from ringreduce.bench import tune
    from ringreduce.bench.machine import describe

    # Each point's fastest run: load from other processes only ever slows a run down.
    sizes = [("tree", s) for s in tune.TREE_SIZES] + [("ring", s) for s in tune.RING_SIZES]
    best = [min(r["measured_us"][i] for r in runs) for i in range(len(sizes))]
    fit = tune.fit([(a, s, t * 1e-6) for (a, s), t in zip(sizes, best)], 2)
    machine = describe()  # the one machine record every benchmark JSON carries
    out = {
        "alpha_us": _sig3(fit["alpha_us"]),
        "beta_ns_per_byte": _sig3(fit["beta_ns_per_byte"]),
        "gamma_ns_per_byte": _sig2(_gamma_ns_per_byte()),
        "gamma_assumed_by_fit": _sig3(_gamma_in_model()),
        "fit_unrounded": fit,
        "command": " ".join(["python bench/measure_alpha_beta.py", *argv]).strip(),
        "runs": f"ringreduce-bench -n 2 --transport tcp --tune -w {args.warmup} -i {args.iters}"
                f", {args.repeat} time(s); fitted to each point's fastest run",
        "transport": "tcp (loopback), 2 ranks on one host",
        "machine": machine,
        "ringreduce_commit": machine["ringreduce_commit"],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "points": [{"algo": a, "bytes": s, "fastest_us": t} for (a, s), t in zip(sizes, best)],
        "all_runs": runs,
    }
    from ringreduce.bench.outfile import replacing  # whole file or none
    with replacing(args.out) as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"# wrote {args.out}: alpha_us = {out['alpha_us']}, "
          f"beta_ns_per_byte = {out['beta_ns_per_byte']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
