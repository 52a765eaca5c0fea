#!/usr/bin/env python
"""The issue-4 benchmark: training step time of a ~25M-parameter model with
ringreduce.ddp.DistributedDataParallel vs torch DDP on the gloo backend, 2 ranks, same run.

    python bench/ddp_step.py                      # starts 2 local ranks itself
    python bench/ddp_step.py --model transformer --steps 20 --json bench/ddp_step.json
    ringreduce-run -n 2 bench/ddp_step.py         # or torchrun --nproc_per_node 2 ...

Modes, measured step by step in turn (so noise from the machine hits all alike), each with
its own model replica and SGD optimizer:
  ringreduce  ringreduce's DDP wrapper (bucketed all-reduce overlapped with backward)
  torch-gloo  torch.nn.parallel.DistributedDataParallel on a gloo process group
  rr-view / gloo-view   the same with gradient_as_bucket_view=True (--grad-view)
  torch-rr    torch's DDP on the "ringreduce" torch.distributed backend (--torch-rr)
  local       no communication (the same model, no DDP): the compute floor

Per mode: median step time and its breakdown -- forward (incl. loss), backward (incl. the
end-of-backward wait), optimizer -- and how much communication backward left exposed:
  unhidden  = time from the last gradient accumulated to backward() returning (measured the
              same way for every wrapper, with a post-accumulate-grad hook per parameter):
              the reduction not hidden behind backward, plus writing gradients back
  comm      = time to all-reduce the same buckets with nothing else running
  overlap   = 1 - unhidden / comm  (share of the all-reduce time hidden behind backward)
For the ringreduce wrapper the instrumented end-of-backward wait is reported as well.
Every rank uses torch.set_num_threads(--threads, default 1): fair on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable

from _local import launcher  # bench/_local.py (this script's directory is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = 0.9  # ringreduce step time <= 0.9 x torch DDP on gloo
EXPOSED_TARGET = 0.35  # issue 14: exposed communication <= 0.35 x torch DDP on gloo's


def parse_args(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--nproc", type=int, default=2, help="ranks to start (outside a job)")
    p.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    p.add_argument("--steps", type=int, default=15, help="measured steps per mode")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps per mode")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--torch-rr", action="store_true",
                   help="also measure torch DDP over the 'ringreduce' backend")
    p.add_argument("--grad-view", action="store_true",
                   help="also measure both wrappers with gradient_as_bucket_view=True")
    p.add_argument("--json", default=None, help="write results here (rank 0)")
    p.add_argument("--plot", default=None, help="draw the step breakdown as PNG (with --json)")
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="only draw --plot from an earlier --json file")
    p.add_argument("--check", action="store_true",
                   help="after timing, assert that every DDP mode left identical parameters "
                        "on all ranks and that the wrappers agree with torch DDP on gloo")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- models


def build(kind: str):
    import torch
    from torch import nn

    if kind == "mlp":
        # 1024 -> 5 x 2048 -> 1024: 25.2M parameters, 7 linear layers.
        dims = [1024] + [2048] * 6 + [1024]
        layers: list = []
        for i in range(len(dims) - 1):
            layers += [nn.Linear(dims[i], dims[i + 1]), nn.GELU()]
        model = nn.Sequential(*layers[:-1])

        def batch(g: torch.Generator) -> tuple:
            return torch.randn(32, 1024, generator=g), torch.randn(32, 1024, generator=g)

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.mse_loss(out, y)
        return model, batch, loss_fn

    vocab, d, seq = 8192, 512, 32

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, 8, 2048, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(self.emb(x)))

    def lm_batch(g: torch.Generator) -> tuple:
        x = torch.randint(0, vocab, (4, seq), generator=g)
        return x, torch.roll(x, -1, 1)

    def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out.reshape(-1, vocab), y.reshape(-1))
    return LM(), lm_batch, lm_loss


# ----------------------------------------------------------------------------- per rank


class Mode:
    def __init__(self, name: str, model: Any, opt: Any, no_sync: Callable, stats: Any = None):
        self.name = name
        self.model = model
        self.opt = opt
        self.no_sync = no_sync
        self.stats = stats  # ringreduce Reducer.stats (instrumented wait), or None
        self.rows: list = []  # per measured step: dict of phase -> seconds
        self.local_bwd: list = []  # backward under no_sync()
        self.last_ready = 0.0  # perf_counter() when the last gradient was accumulated
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, _p: Any) -> None:
        self.last_ready = time.perf_counter()


def run_rank(args: argparse.Namespace) -> None:
    import contextlib
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import ringreduce as rr
    from ringreduce import _env, _rendezvous
    from ringreduce.ddp import DistributedDataParallel as RRDDP

    torch.set_num_threads(args.threads)
    rr.init()
    rank, world = rr.get_rank(), rr.get_world_size()
    info, tun = _env.detect_launch(), _env.tunables()
    # One store for both libraries: the TCPStore ringreduce created on MASTER_PORT.
    store = _rendezvous.make_store(info.master_addr, info.master_port, rank, world,
                                   tun.connect_timeout, tun.use_agent_store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)

    torch.manual_seed(0)
    base, make_batch, loss_fn = build(args.model)
    nparams = sum(p.numel() for p in base.parameters())
    g = torch.Generator().manual_seed(100 + rank)
    x, y = make_batch(g)

    def opt_for(m: Any) -> Any:
        return torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)

    cap = args.bucket_cap_mb
    modes = []
    m = RRDDP(copy.deepcopy(base), bucket_cap_mb=cap)
    modes.append(Mode("ringreduce", m, opt_for(m), m.no_sync, m.reducer.stats))
    # The other side of its overlap policy (RINGREDUCE_DDP_OVERLAP), measured in the same run.
    other = "rr-overlap" if not m.reducer.overlap else "rr-deferred"
    m = RRDDP(copy.deepcopy(base), bucket_cap_mb=cap)
    m.reducer.overlap = other == "rr-overlap"
    modes.append(Mode(other, m, opt_for(m), m.no_sync, m.reducer.stats))
    m = TorchDDP(copy.deepcopy(base), bucket_cap_mb=cap)
    modes.append(Mode("torch-gloo", m, opt_for(m), m.no_sync))
    if args.grad_view:
        m = RRDDP(copy.deepcopy(base), bucket_cap_mb=cap, gradient_as_bucket_view=True)
        modes.append(Mode("rr-view", m, opt_for(m), m.no_sync, m.reducer.stats))
        m = TorchDDP(copy.deepcopy(base), bucket_cap_mb=cap, gradient_as_bucket_view=True)
        modes.append(Mode("gloo-view", m, opt_for(m), m.no_sync))
    if args.torch_rr:
        import ringreduce.backend

        pg = dist.new_group(backend="ringreduce")  # reuses ringreduce's communicator
        m = TorchDDP(copy.deepcopy(base), process_group=pg, bucket_cap_mb=cap)
        modes.append(Mode("torch-rr", m, opt_for(m), m.no_sync))
    local = copy.deepcopy(base)
    modes.append(Mode("local", local, opt_for(local), contextlib.nullcontext))

    def step(md: Mode, record: bool, sync: bool = True) -> None:
        with contextlib.nullcontext() if sync else md.no_sync():
            c0 = time.process_time()
            t0 = time.perf_counter()
            md.opt.zero_grad(set_to_none=True)
            loss = loss_fn(md.model(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
        if not sync:
            if record:
                md.local_bwd.append(t2 - t1)
            return
        md.opt.step()
        t3 = time.perf_counter()
        if record:
            md.rows.append({
                "forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0,
                # from the last gradient accumulated to backward() returning: the
                # communication (and write-back) that backward did not hide
                "tail": t2 - md.last_ready,
                "wait": md.stats.wait_s if md.stats is not None else float("nan"),
                "cpu": time.process_time() - c0})

    for md in modes:
        for _ in range(args.warmup):
            step(md, False)
    # Communication alone: the same buckets, all-reduced back to back, nothing else running.
    sizes = [b.buffer.numel() for b in modes[0].model.reducer.buckets]
    bufs = [torch.randn(n) for n in sizes]
    comm_ts: dict = {"ringreduce": [], "torch-gloo": []}

    def comm_alone(lib: str, record: bool) -> None:
        rr.barrier()
        t0 = time.perf_counter()
        if lib == "ringreduce":
            works = [rr.allreduce(b, op="avg", async_op=True) for b in bufs]
        else:
            works = [dist.all_reduce(b, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        if record:
            comm_ts[lib].append(time.perf_counter() - t0)

    for lib in comm_ts:
        comm_alone(lib, False)
    # Interleave everything step by step, so that noise from the machine hits all alike.
    for i in range(args.steps):
        for md in modes:
            rr.barrier()
            step(md, True)
        if i % 2 == 0:
            for md in modes:
                if md.name != "local":
                    rr.barrier()
                    step(md, True, sync=False)
            for lib in comm_ts:
                comm_alone(lib, True)
    rr.barrier()
    comm = {lib: statistics.median(ts) for lib, ts in comm_ts.items()}
    comm_of = {"ringreduce": "ringreduce", "rr-view": "ringreduce", "torch-rr": "ringreduce",
               "rr-overlap": "ringreduce", "rr-deferred": "ringreduce",
               "torch-gloo": "torch-gloo", "gloo-view": "torch-gloo"}

    def med(vals: list) -> float:
        return statistics.median(vals) if vals else float("nan")

    results = {}
    local_step = med([row["step"] for row in by_name(modes, "local").rows])
    for md in modes:
        r = {f"{k}_ms": med([row[k] for row in md.rows]) * 1e3
             for k in ("step", "forward", "backward", "optimizer", "cpu")}
        if md.name != "local":
            tail = med([row["tail"] for row in md.rows])
            c = comm[comm_of[md.name]]
            r["backward_no_sync_ms"] = med(md.local_bwd) * 1e3
            r["unhidden_comm_ms"] = tail * 1e3
            r["comm_alone_ms"] = c * 1e3
            r["overlap"] = max(0.0, min(1.0, 1 - tail / c))
            # What communication costs the step: this rank's step minus its step with no
            # communication at all (the same model, data and optimizer).
            r["exposed_comm_ms"] = (r["step_ms"] / 1e3 - local_step) * 1e3
        if md.stats is not None:
            r["wait_ms"] = med([row["wait"] for row in md.rows]) * 1e3
        results[md.name] = r
    # Paired ratio: step i of ringreduce over step i of torch-gloo (run back to back).
    results["ringreduce"]["paired_ratio"] = med(
        [a["step"] / b["step"] for a, b in zip(by_name(modes, "ringreduce").rows,
                                               by_name(modes, "torch-gloo").rows)])
    checked = check_models(modes, rank, world) if args.check else None
    gathered: list = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        report(args, world, nparams, len(sizes), slowest_rank(gathered), checked)
    dist.destroy_process_group()
    rr.destroy()


def by_name(modes: list, name: str) -> Mode:
    return next(md for md in modes if md.name == name)


def slowest_rank(per_rank: list) -> dict:
    """Per mode, every column of the rank whose median step was slowest (a step is as slow
    as its slowest rank), tagged with that rank: columns are never mixed across ranks."""
    out = {}
    for name in per_rank[0]:
        rank = max(range(len(per_rank)), key=lambda r: per_rank[r][name]["step_ms"])
        out[name] = dict(per_rank[rank][name], rank=rank)
    return out


def check_models(modes: list, rank: int, world: int) -> dict:
    """--check: every DDP mode must leave identical parameters on every rank, and the
    wrappers must agree with each other (same start, data and number of synced steps).
    Raises AssertionError (so the run fails) when they do not; returns what was checked."""
    import torch
    import torch.distributed as dist

    flat = {md.name: torch.cat([p.detach().reshape(-1) for p in md.model.parameters()])
            for md in modes if md.name != "local"}
    for name, v in flat.items():
        copies = [torch.empty_like(v) for _ in range(world)]
        dist.all_gather(copies, v)
        for r, c in enumerate(copies):
            assert torch.equal(c, v), f"--check: {name}: rank {r}'s parameters differ from rank {rank}'s"
    ref = flat["torch-gloo"]
    worst = {}
    for name, v in flat.items():
        diff = (v - ref).abs().max().item()
        assert torch.allclose(v, ref, rtol=1e-4, atol=1e-5), (
            f"--check: {name} ended {diff:.3g} away from torch DDP on gloo (max abs difference)")
        worst[name] = diff
    return {"ranks_identical": True, "max_abs_diff_vs_torch_gloo": worst}


def report(args: argparse.Namespace, world: int, nparams: int, nbuckets: int,
           res: dict, checked: dict | None) -> None:
    print(f"# DDP training step, {args.model} ({nparams / 1e6:.1f}M parameters, "
          f"{nbuckets} buckets of <= {args.bucket_cap_mb:g} MiB), {world} ranks, "
          f"{args.threads} thread(s)/rank; medians of the slowest rank (per mode, all columns "
          f"from that rank)")
    cols = ["step_ms", "forward_ms", "backward_ms", "unhidden_comm_ms", "optimizer_ms",
            "comm_alone_ms", "overlap", "exposed_comm_ms", "cpu_ms"]
    print(f"| {'mode':11s} | " + " | ".join(f"{c.removesuffix('_ms'):>13s}"
                                           for c in cols) + " |")
    print("|" + "-" * 13 + "|" + "|".join("-" * 15 + ":" for _ in cols) + "|")
    for name, r in res.items():
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{'-':>13s}" if v is None or (c == "overlap" and math.isnan(v)) else
                         f"{v * 100:12.0f}%" if c == "overlap" else f"{v:13.1f}")
        print(f"| {name:11s} | " + " | ".join(cells) + " |")
    mine, gloo = res["ringreduce"]["step_ms"], res["torch-gloo"]["step_ms"]
    ratio = mine / gloo
    paired = res["ringreduce"]["paired_ratio"]
    print("# times in ms; unhidden_comm: last gradient ready -> backward() returns (the "
          "reduction backward did not hide, plus the write-back); overlap = 1 - unhidden / "
          "comm_alone; exposed_comm: step - the no-communication step of the same rank; "
          "cpu: process CPU time per step (all threads)")
    exposed = res["ringreduce"]["exposed_comm_ms"] / res["torch-gloo"]["exposed_comm_ms"]
    print(f"# exposed communication ringreduce / torch-gloo = {exposed:.2f} (target <= "
          f"{EXPOSED_TARGET}: {'met' if exposed <= EXPOSED_TARGET else 'NOT met'}); overlap "
          f"policy: {'on' if 'rr-deferred' in res else 'off'} (RINGREDUCE_DDP_OVERLAP)" +
          "".join(f"; {k}: {res[k]['exposed_comm_ms'] / res['torch-gloo']['exposed_comm_ms']:.2f}"
                  for k in ("rr-overlap", "rr-deferred") if k in res))
    print(f"# ringreduce end-of-backward wait for collectives (instrumented): "
          f"{res['ringreduce'].get('wait_ms', float('nan')):.1f} ms")
    print(f"# step time ratio ringreduce / torch-gloo = {ratio:.2f} (of medians), "
          f"{paired:.2f} (median of step-by-step pairs) "
          f"(target <= {TARGET}: {'met' if max(ratio, paired) <= TARGET else 'NOT met'})")
    if checked is not None:
        print("# --check: parameters identical on every rank; max |difference| vs torch DDP "
              "on gloo: " + ", ".join(f"{k} {v:.2g}" for k, v in
                                       checked["max_abs_diff_vs_torch_gloo"].items()))
    if args.json:
        from ringreduce.bench.machine import describe
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(args.json) as f:
            json.dump({"command": "python bench/ddp_step.py " + " ".join(sys.argv[1:]),
                       "machine": describe(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "check": checked, "method": "medians per rank; per mode the slowest "
                       "rank's row", "model": args.model, "params": nparams, "world": world,
                       "threads": args.threads, "buckets": nbuckets,
                       "bucket_cap_mb": args.bucket_cap_mb, "results": res,
                       "ratio_vs_gloo": ratio, "paired_ratio_vs_gloo": paired,
                       "exposed_ratio_vs_gloo": exposed}, f, indent=2)
    if args.plot:
        with open(args.json) as f:
            plot(json.load(f), args.plot)


def plot(data: dict, path: str) -> None:
    """Step time per mode, split into forward, backward, the communication backward left
    exposed, and the optimizer (medians of the slowest rank), one bar per mode."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    res = data["results"]
    modes = list(res)
    parts = [("forward", "forward_ms", "C0"), ("backward", None, "C1"),
             ("unhidden comm", "unhidden_comm_ms", "C3"), ("optimizer", "optimizer_ms", "C2")]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(modes) + 1.6))
    left = [0.0] * len(modes)
    for label, key, color in parts:
        if key is None:  # backward without its unhidden tail
            vals = [res[m]["backward_ms"] - res[m].get("unhidden_comm_ms", 0.0) for m in modes]
        else:
            vals = [res[m].get(key, 0.0) for m in modes]
        ax.barh(modes, vals, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, vals)]
    for i, m in enumerate(modes):
        ax.text(left[i] + 1, i, f"{res[m]['step_ms']:.0f} ms", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("ms per training step (medians of the slowest rank)")
    ax.set_title(f"DDP step, {data['model']} ({data['params'] / 1e6:.1f}M parameters), "
                 f"{data['world']} ranks", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list) -> int:
    args = parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), args.plot or args.replot.removesuffix(".json") + ".png")
        return 0
    if args.plot and not args.json:
        sys.exit("--plot draws from the --json results: pass --json FILE too")
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ:
        import subprocess

        cmd = [*launcher(), "-n", str(args.nproc),
               os.path.abspath(__file__), *argv]
        return subprocess.call(cmd)
    run_rank(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
