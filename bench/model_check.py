#!/usr/bin/env python
"""Validate the cost model (issue #14 item 5) where it can be: predicted vs measured
all-reduce time on the emulated cluster (tests/netcluster.py: one network namespace per
host, links rate-limited with tc): 2, 4, 8 hosts x 1 rank with the ring and recursive
doubling, and 2, 4 hosts x 2 ranks with the hierarchical all-reduce (shared memory inside a
host, --algo hier).

    python bench/model_check.py --json bench/model_check.json --plot bench/model_check.png

Each (hosts, algo) is one `netcluster.py run H RATE -- python -m ringreduce.bench --algo A
--check` job (results checked). The prediction is _C.predict_allreduce_cluster with the
link's rate as beta (8 / Gbit/s ns per byte) and alpha from bench/alpha_beta.json (this
machine's TCP). Sizes start at 1 MiB: tc's token bucket lets a 256 KiB burst through at the
veth's own speed, so smaller messages do not see the rate the model is given. The error is
|predicted - measured| / measured; the issue's bar is a median <= 25%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (ranks per host, --algo, model algorithm)
SETUPS = [(1, "ring", "ring"), (1, "tree", "recursive_doubling"), (2, "hier", "hier")]
BAR = 0.25


def measure(hosts: int, per_host: int, algo: str, rate: str, out: str,
            timeout: float, sizes: tuple = ("1M", "16M"), env: dict | None = None) -> list[dict]:
    """One `ringreduce-bench --algo ALGO --check` job on the emulated cluster (sizes: -b, -e);
    its ringreduce rows (results checked)."""
    cmd = [sys.executable, os.path.join(ROOT, "tests", "netcluster.py"), "run", str(hosts), rate,
           "--per-host", str(per_host), "--timeout", str(timeout), "--", sys.executable, "-m",
           "ringreduce.bench", "-b", sizes[0], "-e", sizes[1], "-f", "4", "-w", "1", "-i", "3",
           "--algo", algo, "--check", "--json", out]
    subprocess.run(cmd, check=True, timeout=timeout + 60, stdout=subprocess.DEVNULL,
                   env=None if env is None else {**os.environ, **env})
    with open(out) as f:
        rows = [r for r in json.load(f)["results"] if r["library"] == "ringreduce"]
    bad = [r for r in rows if r.get("wrong")]
    if bad:
        raise SystemExit(f"wrong results at {hosts} hosts, {algo}: {bad}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="2,4,8")
    ap.add_argument("--hier-hosts", default="2,4", help="host counts for the 2-rank hosts")
    ap.add_argument("--rate", default="1gbit", help="tc rate of every host's link")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    from ringreduce import _C

    with open(os.path.join(ROOT, "bench", "alpha_beta.json")) as f:
        alpha = json.load(f)["alpha_us"]
    gbit = float(a.rate.lower().removesuffix("gbit"))
    beta = 8.0 / gbit
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for per_host, algo, model_algo in SETUPS:
            for hosts in [int(h) for h in (a.hier_hosts if per_host > 1 else a.hosts).split(",")]:
                rows = measure(hosts, per_host, algo, a.rate,
                               os.path.join(tmp, f"{hosts}x{per_host}{algo}.json"), a.timeout)
                for r in rows:
                    if r["algo"] != algo:
                        raise SystemExit(f"{hosts}x{per_host} ran {r['algo']}, not {model_algo}")
                    pred = _C.predict_allreduce_cluster(model_algo, hosts, per_host, r["size"],
                                                        alpha, beta)
                    meas = r["time_us"] * 1e-6
                    points.append({"hosts": hosts, "per_host": per_host, "algo": model_algo,
                                   "bytes": r["size"],
                                   "measured_s": meas, "predicted_s": pred,
                                   "error": abs(pred - meas) / meas})
                    print(f"{hosts}x{per_host} {model_algo:>18} {r['size'] >> 20:>3} MiB: measured "
                          f"{meas * 1e3:8.2f} ms, model {pred * 1e3:8.2f} ms, error "
                          f"{points[-1]['error']:.0%}", file=sys.stderr, flush=True)
    med = statistics.median(p["error"] for p in points)
    res = {"command": "python bench/model_check.py " + " ".join(sys.argv[1:]),
           "rate": a.rate, "alpha_us": alpha, "beta_ns_per_byte": beta, "points": points,
           "median_abs_error": med, "max_abs_error": max(p["error"] for p in points),
           "bar": BAR, "within_bar": med <= BAR}
    print(f"median |error| {med:.1%} over {len(points)} points (bar {BAR:.0%}), "
          f"max {res['max_abs_error']:.1%}")
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump(res, f, indent=1)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 5))
        for algo, mark in (("ring", "o"), ("recursive_doubling", "s"), ("hier", "^")):
            for hosts in sorted({p["hosts"] for p in points}):
                pts = [p for p in points if p["algo"] == algo and p["hosts"] == hosts]
                if not pts:
                    continue
                ax.scatter([p["measured_s"] * 1e3 for p in pts],
                           [p["predicted_s"] * 1e3 for p in pts], marker=mark,
                           label=f"{algo}, {hosts} hosts")
        lim = [min(p["measured_s"] for p in points) * 800, max(p["measured_s"] for p in points) * 1200]
        ax.plot(lim, lim, "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlabel="measured, ms", ylabel="model, ms",
               title=f"cost model vs emulated cluster ({a.rate}); median error {med:.0%}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
    return 0 if res["within_bar"] else 1


if __name__ == "__main__":
    sys.exit(main())
