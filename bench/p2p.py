#!/usr/bin/env python
"""Point-to-point on 2 ranks: 8-byte ping-pong round trip and 64 MiB one-way transfer.
ringreduce (shared memory and TCP) against Open MPI (mpi4py Send/Recv, its own mpirun job
just before) and torch.distributed's gloo backend (dist.send/recv), same run.

    python bench/p2p.py --json bench/p2p.json --plot bench/p2p.png

Ping-pong: rank 0 sends 8 B, rank 1 receives and sends them back; the round trip's median
over --iters after as many warm-up rounds (every library warmed up the same way). One-way:
rank 0 sends 64 MiB, rank 1 receives it and answers with 8 B; median over 10 after 2
warm-ups, reported as GB/s. Every received message is checked.
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

BIG = 64 << 20


def _lib(name: str):  # -> (rank, send(buf, peer), recv(buf, peer), finish())
    import numpy as np

    if name == "mpi":
        from mpi4py import MPI

        c = MPI.COMM_WORLD
        return c.Get_rank(), (lambda b, p: c.Send(b, p)), (lambda b, p: c.Recv(b, p)), \
            (lambda: None), np
    if name == "gloo":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        wrap = {}

        def t(b: np.ndarray) -> torch.Tensor:
            key = id(b)
            if key not in wrap:
                wrap[key] = torch.from_numpy(b)
            return wrap[key]
        return dist.get_rank(), (lambda b, p: dist.send(t(b), p)), \
            (lambda b, p: dist.recv(t(b), p)), dist.destroy_process_group, np
    import ringreduce as rr

    rr.init()
    return rr.get_rank(), rr.send, rr.recv, rr.destroy, np


def worker(name: str, out: str, iters: int) -> None:
    rank, send, recv, finish, np = _lib(name)
    peer = 1 - rank
    small, back = np.full(1, 7.0), np.zeros(1)
    rtts = []
    for i in range(2 * iters):
        back[0] = 0
        t = time.perf_counter()
        if rank == 0:
            send(small, peer)
            recv(back, peer)
        else:
            recv(back, peer)
            send(back, peer)
        if i >= iters:
            rtts.append(time.perf_counter() - t)
        if back[0] != 7.0:
            raise AssertionError(f"{name}: ping-pong payload {back[0]}")
    big = np.arange(BIG // 4, dtype=np.float32) if rank == 0 else np.zeros(BIG // 4, np.float32)
    ack = np.zeros(1)
    ones = []
    for i in range(12):
        if rank == 1:
            big[-1] = 0
        t = time.perf_counter()
        if rank == 0:
            send(big, peer)
            recv(ack, peer)
        else:
            recv(big, peer)
            send(ack, peer)
            if big[-1] != BIG // 4 - 1 or big[12345] != 12345:
                raise AssertionError(f"{name}: 64 MiB payload wrong")
        if i >= 2:
            ones.append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rtt_us": statistics.median(rtts) * 1e6,
                       "oneway_gbps": BIG / statistics.median(ones) / 1e9}, f)
    finish()


def _run(name: str, iters: int, transport: str = "auto") -> dict:
    if name != "mpi":
        return _local.launch(__file__, 2, name, iters, transport)[0]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="rr-p2p-") as tmp:
        out = os.path.join(tmp, "r0.json")
        subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "2",
                        sys.executable, os.path.abspath(__file__), "--worker", name, out,
                        str(iters)], check=True, timeout=600)
        with open(out) as f:
            return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="launches of each (median)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ringreduce.bench.machine import describe

    setups = [("mpi", "mpi", "auto"), ("ringreduce-shm", "rr", "shm"),
              ("ringreduce-tcp", "rr", "tcp"), ("gloo", "gloo", "auto")]
    runs: dict = {k: [] for k, _, _ in setups}
    for _ in range(a.repeat):
        for label, name, transport in setups:
            r = _run(name, a.iters, transport)
            if r:
                runs[label].append(r)
                print(f"{label:15s} rtt {r['rtt_us']:8.2f} us  one-way 64 MiB "
                      f"{r['oneway_gbps']:6.2f} GB/s", flush=True)
    res = {k: {"rtt_us": statistics.median(x["rtt_us"] for x in v),
               "oneway_gbps": statistics.median(x["oneway_gbps"] for x in v), "runs": v}
           for k, v in runs.items() if v}
    shm = res["ringreduce-shm"]
    ratios = {"rtt_vs_mpi": shm["rtt_us"] / res["mpi"]["rtt_us"] if "mpi" in res else None,
              "oneway_vs_gloo": shm["oneway_gbps"] / res["gloo"]["oneway_gbps"]}
    print(f"8 B round trip, ringreduce shm / Open MPI: {ratios['rtt_vs_mpi']}; 64 MiB one-way "
          f"ringreduce shm / gloo: {ratios['oneway_vs_gloo']:.2f}x")
    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump({"machine": describe(), "results": res, "ratios": ratios,
                       "checked": True, "iters": a.iters, "repeat": a.repeat}, f, indent=1)
    if a.plot:
        fig, (ax1, ax2) = _local.axes(2, (9, 3.5))
        names = list(res)
        ax1.bar(names, [res[n]["rtt_us"] for n in names])
        ax1.set_yscale("log")
        ax1.set_ylabel("8 B round trip, us (median)")
        ax2.bar(names, [res[n]["oneway_gbps"] for n in names])
        ax2.set_ylabel("64 MiB one-way, GB/s")
        for ax in (ax1, ax2):
            ax.tick_params(axis="x", rotation=30)
        _local.save(fig, a.plot)


if __name__ == "__main__":
    _local.entry(worker, main)
