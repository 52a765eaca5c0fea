#!/usr/bin/env python
"""The issue-2 benchmark: 2 ranks on loopback TCP, float32 all-reduce from 8 B to 64 MiB,
torch.distributed's gloo measured in the same run (interleaved per size).

    python bench/allreduce_vs_gloo.py                 # table, bench/allreduce_vs_gloo.{json,png}
    python bench/allreduce_vs_gloo.py -i 50           # extra ringreduce-bench options win

Results are checked (--check: an iteration after the timed ones, per size and library): a
wrong result makes the run fail.

It is a thin wrapper over `ringreduce-bench`; afterwards it prints ringreduce's speedup over
gloo at the sizes the issue sets targets for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# (size, what is compared, target speedup = gloo time / ringreduce time = busbw ratio)
TARGETS = ((8, "8 B latency", 10.0), (64 << 10, "64 KiB time", 5.0),
           (64 << 20, "64 MiB busbw", 1.2))


def main(argv: list[str]) -> int:
    from ringreduce.bench import main as bench_main

    # The JSON the run writes: ours, or the caller's --json (extra options win); the summary
    # reads that one, so a run with other sizes never reports the committed results.
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--json", default=os.path.join(HERE, "allreduce_vs_gloo.json"))
    own.add_argument("--plot", default=os.path.join(HERE, "allreduce_vs_gloo.png"))
    paths, _ = own.parse_known_args(argv)
    out_json = paths.json
    args = ["-n", "2", "-o", "allreduce", "-d", "float32", "-b", "8", "-e", "64M", "-f", "2",
            "-w", "5", "-i", "20", "--transport", "tcp", "--compare", "gloo", "--check",
            "--json", out_json, "--plot", paths.plot, *argv]
    started = time.time()
    rc = bench_main(args)
    if rc != 0 or not os.path.exists(out_json) or os.path.getmtime(out_json) < started - 1:
        return rc  # nothing written by this run: no summary of an earlier one
    with open(out_json) as f:
        rows = json.load(f)["results"]
    by = {(r["library"], r["size"]): r for r in rows}
    print("# issue-2 targets (speedup = gloo time / ringreduce time "
          "= ringreduce busbw / gloo busbw)")
    for size, what, target in TARGETS:
        mine, gloo = by.get(("ringreduce", size)), by.get(("gloo", size))
        if not mine or not gloo:
            print(f"#   {what:14s}: not measured")
            continue
        x = gloo["time_us"] / mine["time_us"]
        verdict = "met" if x >= target else "NOT met"
        print(f"#   {what:14s}: ringreduce {mine['time_us']:10.1f} us  "
              f"gloo {gloo['time_us']:10.1f} us  speedup {x:6.2f}x  "
              f"(target >= {target:g}x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
