#!/usr/bin/env python
"""The torch.distributed backend's own cost (issue #12), 2 local ranks, same run:

  allreduce  dist.all_reduce on the "ringreduce" backend vs ringreduce.allreduce called
             directly (same process, same communicator, calls interleaved in rounds) and
             vs dist.all_reduce on gloo (its own launch just before), 8 B and 64 MiB; plus
             torch's own floor: dist.all_reduce on torch's FakeProcessGroup (a C++ backend
             that moves nothing), same process, interleaved -- what any backend pays.
  fsdp2      an FSDP2 (fully_shard) training step of a >= 20M-parameter MLP on
             "ringreduce" vs "gloo" (separate launches, interleaved), median step time.

    python bench/torch_backend.py --json bench/torch_backend.json --plot bench/torch_backend.png

Every rank checks every all-reduce result (rank-dependent inputs against the known sum) and
that the FSDP2 parameters after training match across the two backends (max |difference|
in the JSON). Medians over --iters after as many warm-up calls (every side warmed alike);
the slowest rank's median counts. Launches: the fastest of --launches (this VM sometimes
runs a whole launch several times slower; all launches are kept in the JSON).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import _local  # bench/_local.py (this script's directory is on sys.path)

SIZES = {"8 B": 2, "64 MiB": (64 << 20) // 4}  # float32 elements
ITERS_BIG = 12


def _time(fn, iters: int) -> float:
    for _ in range(iters):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _allreduce_worker(backend: str, out: str, iters: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "ringreduce":
        import torch.testing._internal.distributed.fake_pg  # registers "fake"

        fake = dist.new_group(backend="fake")
        c10d = dist.group.WORLD._get_backend(torch.device("cpu"))
        direct0 = c10d.direct_calls
    res: dict = {}
    for label, n in SIZES.items():
        x = torch.full((n,), float(rank + 1))
        want = float(world * (world + 1) // 2)
        it = iters if n < 1024 else ITERS_BIG
        sides = {"dist": lambda x=x: dist.all_reduce(x)}
        if backend == "ringreduce":
            import ringreduce as rr

            sides["rr"] = lambda x=x: rr.allreduce(x)
            sides["torch_floor"] = lambda x=x: dist.all_reduce(x, group=fake)
        got: dict = {k: [] for k in sides}
        for _ in range(3):  # rounds, interleaved
            for k, fn in sides.items():
                got[k].append(_time(fn, it))
                x.fill_(float(rank + 1))
                fn()
                if k != "torch_floor" and (float(x[0]) != want or float(x[-1]) != want):
                    raise SystemExit(f"{k} all-reduce gave {float(x[0])}, want {want}")
                x.fill_(float(rank + 1))
        res[label] = {k: min(v) for k, v in got.items()}
    if backend == "ringreduce":  # the synchronous path was the one measured
        res["direct_calls"] = c10d.direct_calls - direct0
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(res, f)


def _fsdp2_worker(backend: str, out: str, iters: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    width = 1600
    layers = [torch.nn.Linear(width, width) for _ in range(8)]  # 8 x 2.56M = 20.5M params
    m = torch.nn.Sequential(*layers)
    mesh = init_device_mesh("cpu", (world,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    nparams = sum(p.numel() for p in m.parameters())  # DTensors: the global size
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    xs = [torch.randn(16, width, generator=g) for _ in range(4)]

    def step(i: int = 0) -> None:
        opt.zero_grad()
        m(xs[i % 4]).pow(2).mean().backward()
        opt.step()
    ts = []
    for i in range(2 + iters):
        t0 = time.perf_counter()
        step(i)
        if i >= 2:
            ts.append(time.perf_counter() - t0)
    full = torch.cat([p.full_tensor().detach().flatten() for p in m.parameters()])
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump({"step": statistics.median(ts), "params": nparams,
                   "checksum": [float(full.sum()), float(full.abs().sum())]}, f)


def _slowest(ranks: list, key) -> float:
    return max(key(r) for r in ranks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=2000, help="8-byte calls per measurement")
    p.add_argument("--fsdp-steps", type=int, default=6)
    p.add_argument("--launches", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--worker", nargs=3, metavar=("MODE", "OUT", "ITERS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        mode, out, iters = a.worker
        kind, backend = mode.split(":")
        (_allreduce_worker if kind == "allreduce" else _fsdp2_worker)(backend, out, int(iters))
        return
    runs: dict = {"allreduce": {"gloo": [], "ringreduce": []}, "fsdp2": {"gloo": [], "ringreduce": []}}
    for i in range(a.launches):
        for backend in ("gloo", "ringreduce"):
            print(f"[launch {i + 1}/{a.launches}] all_reduce on {backend}...", file=sys.stderr,
                  flush=True)
            runs["allreduce"][backend].append(
                _local.launch(__file__, 2, f"allreduce:{backend}", a.iters))
        for backend in ("gloo", "ringreduce"):
            print(f"[launch {i + 1}/{a.launches}] FSDP2 step on {backend}...", file=sys.stderr,
                  flush=True)
            runs["fsdp2"][backend].append(
                _local.launch(__file__, 2, f"fsdp2:{backend}", a.fsdp_steps))
    res: dict = {"allreduce": {}, "fsdp2": {}, "launches": runs}
    for launch in runs["allreduce"]["ringreduce"]:
        if any(r["direct_calls"] <= 0 for r in launch):
            raise SystemExit("dist.all_reduce did not take the backend's synchronous path")
    for label in SIZES:
        def side(k: str, lb: str = label):
            return lambda x: x[lb][k]
        gloo = min(_slowest(r, side("dist")) for r in runs["allreduce"]["gloo"])
        best = min(runs["allreduce"]["ringreduce"], key=lambda r: _slowest(r, side("dist")))
        d = _slowest(best, side("dist"))
        rr = _slowest(best, side("rr"))
        floor = _slowest(best, side("torch_floor"))
        res["allreduce"][label] = {"backend_s": d, "rr_direct_s": rr, "gloo_s": gloo,
                                   "torch_floor_s": floor,
                                   "backend_over_direct": d / rr, "gloo_over_backend": gloo / d,
                                   "floor_over_direct": floor / rr,
                                   "backend_minus_floor_s": d - floor}
    f = {b: min(_slowest(r, lambda x: x["step"]) for r in runs["fsdp2"][b])
         for b in ("gloo", "ringreduce")}
    sums = [r[0]["checksum"] for b in ("gloo", "ringreduce") for r in runs["fsdp2"][b]]
    res["fsdp2"] = {"step_s": f, "ratio": f["ringreduce"] / f["gloo"],
                    "params": runs["fsdp2"]["gloo"][0][0]["params"],
                    "checksum_spread": max(abs(s[0] - sums[0][0]) for s in sums)}
    print(f"{'size':>8} {'backend':>12} {'rr direct':>12} {'gloo':>12} {'torch floor':>12} "
          f"{'bk/direct':>10} {'gloo/bk':>8}")
    for label, r in res["allreduce"].items():
        print(f"{label:>8} {r['backend_s'] * 1e6:>10.1f}us {r['rr_direct_s'] * 1e6:>10.1f}us "
              f"{r['gloo_s'] * 1e6:>10.1f}us {r['torch_floor_s'] * 1e6:>10.1f}us "
              f"{r['backend_over_direct']:>10.2f} {r['gloo_over_backend']:>8.1f}")
    print(f"FSDP2 step ({res['fsdp2']['params'] / 1e6:.1f}M params): ringreduce "
          f"{f['ringreduce'] * 1e3:.0f} ms, gloo {f['gloo'] * 1e3:.0f} ms, ratio "
          f"{res['fsdp2']['ratio']:.2f}; parameter checksum spread "
          f"{res['fsdp2']['checksum_spread']:.2e}")
    if a.json:
        from ringreduce.bench.machine import describe
        from ringreduce.bench.outfile import replacing  # whole file or none

        with replacing(a.json) as fh:  # the machine (and commit) first, as the other benches
            json.dump({"machine": describe(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       **res}, fh, indent=1)
    if a.plot:
        _plot(res, a.plot)


def _plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, label in zip(axes, SIZES):
        r = res["allreduce"][label]
        vals = [r["rr_direct_s"], r["torch_floor_s"], r["backend_s"], r["gloo_s"]]
        unit, scale = ("us", 1e6) if label == "8 B" else ("ms", 1e3)
        ax.bar(["rr.allreduce", "dist (torch's\nfake backend)", "dist\n(ringreduce)",
                "dist (gloo)"], [v * scale for v in vals], color=["#2a7", "#ccc", "#27a", "#aaa"])
        if label == "8 B":
            ax.set_yscale("log")
        ax.set_title(f"all_reduce {label}, 2 ranks")
        ax.set_ylabel(unit)
    f = res["fsdp2"]["step_s"]
    axes[2].bar(["ringreduce", "gloo"], [f["ringreduce"] * 1e3, f["gloo"] * 1e3],
                color=["#27a", "#aaa"])
    axes[2].set_title(f"FSDP2 step, {res['fsdp2']['params'] / 1e6:.0f}M params")
    axes[2].set_ylabel("ms")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
