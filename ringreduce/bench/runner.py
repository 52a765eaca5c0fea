"""What each rank runs: join the job, set up the anchors, sweep the sizes, report on rank 0.

Timing (per library and size): a barrier, the warm-up iterations, a barrier, then each timed
iteration is bracketed by perf_counter on every rank. The per-iteration times are then
all-reduced with max (an iteration lasts until its slowest rank is done), and the table
shows the median and p99 over iterations. Libraries are interleaved per size (ringreduce,
then each anchor, at the same size) so that they share the machine's noise. With -c N, N
more iterations follow the timed ones, each from reset inputs after a barrier, and their
results are verified (timing.measure). Rank 0 prints each size's line as it is measured
(live.LiveTable).
"""

from __future__ import annotations

import json
import os
import sys
from argparse import Namespace
from typing import Any, Callable

import numpy as np

from . import anchors, progress, report
from .checks import Buffers
from .checks import make_buffers as _make_host_buffers
from .cli import several_types
from .live import LiveTable
from .metrics import Case, Row, combinations, combo_key, make_case, make_cases
from .timing import measure

Reducer = Callable[[np.ndarray, str], np.ndarray]


class BenchError(Exception):
    """A problem every rank agrees on; rank 0 prints it, every rank exits with code 1."""


_DEVICE: list = [None]  # torch.device of --device cuda (set by run_rank), else None


def make_buffers(*args: Any) -> Buffers:
    """checks.make_buffers, moved to this rank's CUDA device with --device cuda."""
    b = _make_host_buffers(*args)
    dev = _DEVICE[0]
    if dev is None:
        return b
    inp = b.inp.to(dev)
    out = inp if b.out is b.inp else b.out.to(dev)
    mv = (lambda t: None if t is None else t.to(dev))
    return Buffers(inp, out, mv(b.initial), mv(b.expected))


def _trial(lib: anchors.Lib, case: Case, args: Namespace, rank: int, world: int,
           reduce_: Reducer) -> str | None:
    """Run `case` once; None if it worked on every rank, else why not (agreed by all)."""
    reason = None
    try:
        b = make_buffers(case, args.dtype, rank, world, args.redop, args.root, False)
        lib.run(case, b, args.redop, args.root)
    except Exception as e:  # noqa: BLE001 -- unsupported dtype/op in that library, typically
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    ok = reduce_(np.array([0 if reason else 1], dtype=np.int64), "min")[0]
    if ok:
        return None
    return reason or "failed on another rank"


SETTLE_ROUNDS, SETTLE_BYTES = 50, 64 << 20


def settle_rounds(size: int, warmup: int) -> int:
    """Untimed rounds of a collective's first size (see _settle): 50, but no more than move
    64 MiB (50 rounds of 32 MiB took minutes at 5 ranks, found by a helper), and at least
    the -w warm-up."""
    return max(warmup, min(SETTLE_ROUNDS, -(-SETTLE_BYTES // max(size, 1))))


def _settle(libs: list[anchors.Lib], case: Case, args: Namespace, rank: int, world: int) -> None:
    """Untimed rounds of the first case for every library: the first timed size otherwise
    pays for cold caches, thread start-up and connection warm-up (seen as 10x outliers)."""
    b = make_buffers(case, args.dtype, rank, world, args.redop, args.root, False)
    for lib in libs:
        lib.barrier()
        for _ in range(settle_rounds(case.size, args.warmup)):
            lib.run(case, b, args.redop, args.root)
    del b


def skip_entry(library: str, op: str, dtype: str | None, redop: str | None,
               reason: str) -> dict:
    """One entry of the "skipped" list: a library that did not run a combination."""
    _, t, r = combo_key(op, dtype, redop)
    return {"library": library, "op": op, "type": t, "redop": r, "reason": reason}


def sweep(args: Namespace, libs: list[anchors.Lib], reduce_: Reducer, rank: int, world: int,
          bar: progress.Progress | None = None,
          on_case: Callable[[list[Row]], None] | None = None,
          skipped: list[dict] | None = None) -> tuple[list[Row], list[dict]]:
    """Measure every (op, dtype, redop) combination x size x library; returns rows
    (identical on all ranks) and skips (appended to `skipped` as they are found). A
    combination ringreduce (libs[0]) refuses ends the run with one -d and one --op
    (BenchError); with several it is skipped (ringreduce's entry), and no anchor runs it.
    on_case: called with each case's rows (every library's) once they are measured."""
    rows: list[Row] = []
    skipped = [] if skipped is None else skipped
    lenient = several_types(args)
    for op, dtype, redop in combinations(args.ops, args.dtypes, args.redops):
        cargs = Namespace(**{**vars(args), "dtype": dtype, "redop": redop})
        cases = make_cases(op, args.sizes, dtype, world)
        active = []
        for lib in libs:
            why = _trial(lib, make_case(op, 8, dtype, world), cargs, rank, world, reduce_)
            mine = lib is libs[0] and lib.name == "ringreduce"
            if why and mine and not lenient:
                raise BenchError(f"ringreduce cannot run {_what(op, dtype, redop)} with these "
                                 f"options: {why}")
            if why:
                skipped.append(skip_entry(lib.name, op, dtype, redop, why))
                if mine:  # nothing to compare the anchors with: none of them runs it
                    active = []
                    break
            else:
                active.append(lib)
        skipped_w = sum(progress.weight(c.size) for c in cases) * (len(libs) - len(active))
        if bar:
            bar.step(skipped_w)
        if not active:
            continue
        _settle(active, cases[0], cargs, rank, world)
        for case in cases:
            b = make_buffers(case, dtype, rank, world, redop, args.root, bool(args.check))
            first = len(rows)
            for lib in active:
                times, wrong = measure(lib, case, b, cargs)
                t = reduce_(np.array(times, dtype=np.float64), "max")
                w = int(reduce_(np.array([wrong], dtype=np.int64), "sum")[0])
                rows.append(Row(op=op, lib=lib.name, size=case.size, count=case.param_count,
                                dtype=dtype, redop=redop, root=args.root,
                                algo=lib.algo(case), world=world, times=[float(x) for x in t],
                                wrong=w if args.check else None))
                if bar:
                    bar.step(progress.weight(case.size),
                             f"{_what(op, dtype, redop)} {case.size} B {lib.name}")
            if on_case is not None:
                on_case(rows[first:])
            del b
    return rows, skipped


def _what(op: str, dtype: str, redop: str) -> str:
    """"allreduce of int8 (avg)", "broadcast of float32", "barrier"."""
    _, t, r = combo_key(op, dtype, redop)
    return op + (f" of {t}" if t else "") + (f" ({r})" if r else "")


def total_work(args: Namespace, world: int, nlibs: int) -> float:
    """The progress bar's total: every combination's sizes, for every library."""
    return sum(progress.weight(c.size)
               for op, dtype, _ in combinations(args.ops, args.dtypes, args.redops)
               for c in make_cases(op, args.sizes, dtype, world)) * nlibs


def _load_mpi_results(path: str) -> tuple[list[Row], list[dict], str]:
    with open(path) as f:
        data = json.load(f)
    if data.get("error"):
        return [], [{"library": "mpi", "op": "*", "reason": data["error"]}], ""
    return ([Row.from_dict(d) for d in data["results"]], data.get("skipped", []),
            data.get("note", ""))


def _anchor_libs(args: Namespace, rank: int, world: int) -> tuple[list[anchors.Lib], list[dict]]:
    from ringreduce import _env, _rendezvous

    libs: list[anchors.Lib] = []
    skipped: list[dict] = []
    for name in args.compare:
        if name == "nccl":
            why = "gloo is also requested: torch has one default process group per run; " \
                  "compare gloo and nccl in separate runs" if "gloo" in args.compare else None
            if why is None:
                info, tun = _env.detect_launch(), _env.tunables()
                store = _rendezvous.make_store(info.master_addr, info.master_port, rank, world,
                                               tun.connect_timeout, tun.use_agent_store)
                libs.append(anchors.Nccl(store, rank, world, args.timeout))
        elif name == "gloo":
            why = anchors.gloo_unavailable()
            if why is None:
                info, tun = _env.detect_launch(), _env.tunables()
                store = _rendezvous.make_store(info.master_addr, info.master_port, rank, world,
                                               tun.connect_timeout, tun.use_agent_store)
                libs.append(anchors.Gloo(store, rank, world, args.timeout))
        elif args.mpi_results:
            continue  # measured by a separate mpirun job; merged on rank 0
        elif _env.detect_launch().source != "openmpi":
            why = ("needs ranks started by mpirun: use -n N (the bench then runs its own "
                   "mpirun job) or launch the bench with mpirun")
        else:
            why = anchors.mpi_unavailable()
            if why is None:
                libs.append(anchors.MPI())
        if why:
            skipped.append({"library": name, "op": "*", "reason": why})
    return libs, skipped


def _stopped(args: Namespace, live: LiveTable, meta: dict, skipped: list[dict],
             e: BaseException) -> None:
    """Rank 0, when the sweep ended early: the summary of the rows it has, and the files
    (marked incomplete) -- then the error goes on as it was."""
    from .. import _C

    why = ("interrupted (KeyboardInterrupt)" if isinstance(e, KeyboardInterrupt) else
           f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    if isinstance(e, _C.CollectiveTimeout):
        why += f" (the bench's limit per collective is --timeout {args.timeout:g} s)"
    try:
        live.finish(skipped, stopped=why)
        report.write_outputs(args, live.all_rows(), {**meta, "incomplete": why}, skipped)
    except Exception as more:  # noqa: BLE001 -- the first error is the one to raise
        print(f"ringreduce-bench: could not write the partial results: {more}",
              file=sys.stderr, flush=True)


def run_rank(args: Namespace) -> int:
    """Entry point of one rank of the benchmark job; returns the exit code."""
    import torch

    import ringreduce as rr

    torch.set_num_threads(1)  # checks and fills must not compete with the peers' cores
    if args.transport:
        os.environ["RINGREDUCE_TRANSPORT"] = args.transport
    if getattr(args, "device", "cpu") == "cuda":
        from ringreduce import _env

        local = _env.detect_launch().local_rank
        _DEVICE[0] = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(_DEVICE[0])
    rr.init(timeout=args.timeout)
    libs: list[anchors.Lib] = []
    me = anchors.RingReduce(args.algo)
    try:
        rank, world = me.group.rank, me.group.world_size
        if not 0 <= args.root < world:
            raise BenchError(f"--root {args.root} is not a rank of this job ({world} ranks)")
        if args.tune:
            from . import tune

            return tune.run(args, me, rank, world)
        extra, skipped = _anchor_libs(args, rank, world)
        libs = [me, *extra]
        notes = {lib.name: lib.note for lib in extra}
        earlier: list[Row] = []
        if args.mpi_results and rank == 0:  # measured by the mpirun job before this one
            earlier, mskip, mnote = _load_mpi_results(args.mpi_results)
            skipped += mskip
            if mnote:
                notes["mpi"] = mnote + " (separate mpirun job before this run, not interleaved)"
        bar = progress.Progress(total_work(args, world, len(libs)),
                                rank == 0 and progress.wanted(args.progress))
        meta = report.make_meta(args, world, me.group.hosts, notes, me.transport)
        live = LiveTable(meta, [lib.name for lib in libs], earlier, bar) if rank == 0 else None
        try:
            rows, _ = sweep(args, libs, me.allreduce_np, rank, world, bar,
                            live.add if live else None, skipped)
        except BaseException as e:  # a peer failed, a timeout, Ctrl-C: keep what was measured
            bar.close()
            if live and (live.rows or not isinstance(e, BenchError)):
                _stopped(args, live, meta, skipped, e)
            raise
        bar.close()
        if live:
            live.finish(skipped)
            report.write_outputs(args, live.all_rows(), meta, skipped)
        return 1 if report.out_of_bounds(rows) else 0
    except BenchError as e:
        if me.group.rank == 0:
            print(f"ringreduce-bench: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for lib in reversed(libs[1:]):
            lib.close()
        rr.destroy()
        sys.stdout.flush()
