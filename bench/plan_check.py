#!/usr/bin/env python
"""Does the planner pick the fastest all-reduce? (issue #14 item 5: "pick with it".) On the
emulated cluster (tests/netcluster.py: a network namespace per host, tc-limited links),
2 hosts x 2 ranks: the ring, recursive doubling (--algo tree) and hierarchical all-reduce
are each measured at 64 KiB .. 16 MiB (results checked), and compared with what the core's
planner runs for "auto" (`_C.pick_allreduce_cluster`, the planner's own function) given the
link: alpha from bench/alpha_beta.json, beta from the tc rate -- what
RINGREDUCE_TUNING_FILE would tell it. A pick's regret is its measured time over the
fastest measured one.

    python bench/plan_check.py --json bench/plan_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_check import ROOT, measure

ALGOS = {"ring": "ring", "tree": "recursive_doubling", "hier": "hier"}  # --algo -> model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1gbit", help="tc rate of every host's link")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    from ringreduce import _C

    with open(os.path.join(ROOT, "bench", "alpha_beta.json")) as f:
        alpha = json.load(f)["alpha_us"]
    beta = 8.0 / float(a.rate.lower().removesuffix("gbit"))
    hosts, per_host = 2, 2
    times: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo, model_algo in ALGOS.items():
            rows = measure(hosts, per_host, algo, a.rate, os.path.join(tmp, f"{algo}.json"),
                           a.timeout, sizes=("64K", "16M"))
            for r in rows:
                if r["algo"] != algo:
                    raise SystemExit(f"--algo {algo} ran {r['algo']}")
                times.setdefault(r["size"], {})[model_algo] = r["time_us"] * 1e-6
    points = []
    for size, t in sorted(times.items()):
        pick = _C.pick_allreduce_cluster(hosts, per_host, size, alpha, beta)
        best = min(t, key=t.get)
        points.append({"bytes": size, "measured_s": t, "pick": pick, "fastest": best,
                       "regret": t[pick] / t[best]})
        print(f"{size >> 10:>6} KiB: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items())
              + f" -> pick {pick}, fastest {best}, regret {points[-1]['regret']:.2f}x",
              file=sys.stderr, flush=True)
    res = {"command": "python bench/plan_check.py " + " ".join(sys.argv[1:]), "rate": a.rate,
           "hosts": hosts, "per_host": per_host, "alpha_us": alpha, "beta_ns_per_byte": beta,
           "points": points, "picked_fastest": sum(p["pick"] == p["fastest"] for p in points),
           "median_regret": statistics.median(p["regret"] for p in points),
           "max_regret": max(p["regret"] for p in points)}
    print(f"pick = fastest at {res['picked_fastest']} of {len(points)} sizes; regret median "
          f"{res['median_regret']:.2f}x, max {res['max_regret']:.2f}x")
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
