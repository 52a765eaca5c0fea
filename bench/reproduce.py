#!/usr/bin/env python
"""Re-run the benchmarks behind every number in README.md and bench/README.md.

    python bench/reproduce.py                 # all tables, one after another (~40 min)
    python bench/reproduce.py shm_2ranks ddp  # only these (names below)
    python bench/reproduce.py --list          # the commands, without running them

Each table has exactly one command; each writes its JSON (with result checking on, and the
machine recorded) beside this file, where the READMEs cite it. Run on an otherwise idle
machine: the ratios are measured in the same run as their anchors, but a busy machine
still moves them. The emulated-cluster tables need root and iproute2 (tests/netcluster.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable
BENCH = [PY, "-m", "ringreduce.bench"]


def _out(name: str) -> str:
    return os.path.join("bench", name)


def _groups_net(rate: str) -> list[str]:
    return [PY, "tests/netcluster.py", "run", "4", rate, "--timeout", "1500", "--", PY,
            "bench/groups_net.py", "--rate", rate, "--rounds", "30", "--json",
            _out(f"groups_net_{rate}.json"), "--plot", _out(f"groups_net_{rate}.png")]


def _cluster(rate: str) -> list[str]:
    return [PY, "tests/netcluster.py", "run", "4", rate, "--timeout", "900", "--", PY, "-m",
            "ringreduce.bench", "-b", "1M", "-e", "64M", "-f", "4", "-w", "1", "-i", "3",
            "--compare", "gloo", "--check", "--json", _out(f"netcluster_{rate}.json"),
            "--plot", _out(f"netcluster_{rate}.png")]


def _torch_suite(backend: str, world: int, *extra: str) -> list[str]:
    tag = f"{backend}_ws{world}" + ("_lifted" if extra else "")
    return [PY, "bench/torch_suite.py", "--backend", backend, "--world-size", str(world),
            *extra, "--json", _out(f"torch_suite_results/{tag}.json")]


# name -> command (run from the repository root). Order: cheapest and most cited first.
TABLES: dict[str, list[str]] = {
    "allreduce_vs_gloo": [PY, "bench/allreduce_vs_gloo.py"],
    "shm_2ranks": [*BENCH, "-n", "2", "-b", "8", "-e", "64M", "-f", "2", "-w", "10", "-i", "30",
                   "--compare", "gloo,mpi", "--check", "--json", _out("shm_2ranks.json"),
                   "--plot", _out("shm_2ranks.png")],
    "shm_4ranks": [*BENCH, "-n", "4", "-b", "1M", "-e", "64M", "-f", "2", "-w", "5", "-i", "20",
                   "--compare", "gloo,mpi", "--check", "--json", _out("shm_4ranks.json"),
                   "--plot", _out("shm_4ranks.png")],
    "ddp_mlp": [PY, "bench/ddp_step.py", "--torch-rr", "--check", "--json",
                _out("ddp_step_mlp.json"), "--plot", _out("ddp_step_mlp.png")],
    "ddp_transformer": [PY, "bench/ddp_step.py", "--model", "transformer", "--torch-rr",
                        "--check", "--json", _out("ddp_step_transformer.json"), "--plot",
                        _out("ddp_step_transformer.png")],
    "fault_detection": [PY, "bench/fault_detection.py", "--json", _out("fault_detection.json"),
                        "--plot", _out("fault_detection.png")],
    "alpha_beta": [PY, "bench/measure_alpha_beta.py"],
    "gatherall_2ranks": [*BENCH, "-n", "2", "-o", "allgather,reduce_scatter", "-b", "64K",
                         "-e", "64M", "-f", "4", "-w", "5", "-i", "20", "--compare", "gloo",
                         "--check", "--json", _out("gatherall_2ranks.json"), "--plot",
                         _out("gatherall_2ranks.png")],
    "gatherall_2ranks_tcp": [*BENCH, "-n", "2", "-o", "allgather,reduce_scatter", "-b", "64K",
                             "-e", "64M", "-f", "4", "-w", "5", "-i", "20", "--transport", "tcp",
                             "--compare", "gloo", "--check", "--json",
                             _out("gatherall_2ranks_tcp.json")],
    "rooted": [PY, "bench/rooted.py", "--floor", "--json", _out("rooted.json"), "--plot",
               _out("rooted.png")],
    "p2p": [PY, "bench/p2p.py", "--json", _out("p2p.json"), "--plot", _out("p2p.png")],
    "latency": [PY, "bench/latency.py", "--json", _out("latency.json"), "--plot",
                _out("latency.png")],
    "groups": [PY, "bench/groups.py", "--json", _out("groups.json"), "--plot",
               _out("groups.png")],
    "groups_links": [PY, "bench/groups.py", "--setups", "tcp-own,tcp", "--json",
                     _out("groups_links.json"), "--plot", _out("groups_links.png")],
    "groups_net_loopback": [PY, "bench/groups_net.py", "-n", "4", "--rounds", "12", "--repeat",
                            "5", "--json", _out("groups_net_loopback.json"), "--plot",
                            _out("groups_net_loopback.png")],
    "groups_net_1gbit": _groups_net("1gbit"),
    "groups_net_10gbit": _groups_net("10gbit"),
    "scaling": [PY, "bench/scaling.py", "--json", _out("scaling.json"), "--plot",
                _out("scaling.png")],
    "torch_backend": [PY, "bench/torch_backend.py", "--json", _out("torch_backend.json"),
                      "--plot", _out("torch_backend.png")],
    "ddp_torch_rr": [PY, "bench/ddp_step.py", "--torch-rr", "--json",
                     _out("ddp_step_torch_rr.json")],
    "model_cluster": [*BENCH, "--model", "--json", _out("model_cluster.json")],
    "model_check": [PY, "bench/model_check.py", "--json", _out("model_check.json"), "--plot",
                    _out("model_check.png")],
    "plan_check": [PY, "bench/plan_check.py", "--json", _out("plan_check.json")],
    "netcluster_1gbit": _cluster("1gbit"),
    "netcluster_10gbit": _cluster("10gbit"),
    "idle_groups": [PY, "bench/idle_groups.py", "--json", _out("idle_groups.json"), "--plot",
                    _out("idle_groups.png"), "--before", _out("idle_groups_c50b851.json")],
    # torch's own suite: one run per backend and world size (the README's one table).
    **{f"torch_suite_{b}_ws{n}": _torch_suite(b, n) for b in ("gloo", "ringreduce")
       for n in (2, 3)},
    "torch_suite_ringreduce_ws2_lifted": _torch_suite("ringreduce", 2, "--lift-gloo-gates"),
}


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for name, cmd in TABLES.items():
            print(f"{name:34s} {' '.join(cmd)}")
        return 0
    unknown = [a for a in argv if a not in TABLES]
    if unknown:
        print(f"unknown table(s) {unknown}; choose from {', '.join(TABLES)}", file=sys.stderr)
        return 2
    failed = []
    for name in argv or list(TABLES):
        print(f"== {name}: {' '.join(TABLES[name])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(TABLES[name], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
        print(f"== {name}: exit {rc} after {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
