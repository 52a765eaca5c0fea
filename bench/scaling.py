#!/usr/bin/env python
"""The scaling table (issue #14, "Scale: from 2 ranks to thousands"): what each rank pays and
sees as the world grows -- init time, open fds, RSS, TCP connections and heartbeat traffic
per rank, 8-byte all-reduce latency, and how long the survivors take to learn that a rank
was killed -- for n local ranks over shared memory and over TCP.

    python bench/scaling.py --json bench/scaling.json --plot bench/scaling.png  # n = 2..64
    python bench/scaling.py --quick                                              # n = 2, 4, 8
    python bench/scaling.py --sizes 8,64 --transports tcp --env RINGREDUCE_FULL_MESH_MAX=1

Each (n, transport) is one job: ``ringreduce-run -n N --no-prefix`` (its run.py as a file)
starting this script's worker with RINGREDUCE_TRANSPORT set (plus any --env K=V). Each rank
writes its results to a JSON file in a temporary directory; this process aggregates them.
Per rank, in order:
  init     wall time of ringreduce.init() (the table's init_s is the slowest rank's; it
           includes waiting for ranks that were still importing). RSS (VmRSS) right after.
  fds      entries of /proc/self/fd after init and one all-reduce (median and max over ranks).
  links    world communicator's link_stats(): "connections" (open TCP connections) and
           "heartbeat_targets"; heartbeat datagrams/s = growth of "heartbeat_sent" over
           --hb-window seconds between two barriers (medians over ranks).
  latency  8-byte (2 x float32) all-reduce, rank-dependent values, every result checked,
           20 warm-up then --iters timed calls (at most 50 from n = 32), each timed with
           perf_counter; the table shows rank 0's median.
  kill     rank 0 broadcasts T = now + 0.5 s; rank n//2 sleeps until T and SIGKILLs itself;
           the survivors loop over checked 64 KiB all-reduces until one raises, and record
           time.time() - T and whether the message names "rank n//2" (median / max over
           survivors). Survivors ignore the SIGTERM that ringreduce-run sends when a rank
           dies (on a real cluster the ranks on other hosts do not get it); its
           --grace-period (--kill-limit) bounds the wait. The job's non-zero exit is expected.
checks (JSON): every all-reduce result correct, every survivor named the victim, and the
fds and heartbeat ratios 64 ranks / 8 ranks per transport against the issue's bar (<= 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from _local import launcher  # bench/_local.py (this script's directory is on sys.path)

BAR = 2.0  # issue #14: per-rank fds and heartbeat traffic at 64 ranks <= 2x those at 8
PANELS = (("fds_median", "open fds per rank (median)"),
          ("hb_pkts_per_s", "heartbeat datagrams/s per rank"),
          ("connections", "TCP connections per rank"),
          ("init_s", "init, s (slowest rank; dotted: from the last start)"),
          ("allreduce_8b_us", "8 B all-reduce, us (rank 0 median)"),
          ("kill_detect_s_median", "kill detection, s (median; dotted: max)"))


def _dump(path: str, obj: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)  # the parent never reads half a file


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def worker(out: str, spec: str) -> None:
    import numpy as np

    import ringreduce as rr
    from ringreduce import _state

    iters, warmup, hb_window = (f(v) for f, v in zip((int, int, float), spec.split(",")))
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    res: dict = {"rank": rank, "t_init_start": time.time()}
    t0 = time.perf_counter()
    rr.init()
    res["init_s"] = time.perf_counter() - t0
    res["t_init_end"] = time.time()
    res["rss_mib"] = _rss_mib()
    comm = _state.current().comm
    stats = getattr(comm, "link_stats", None)  # newer cores only: None -> nulls, error later

    x = np.empty(2, np.float32)
    base = np.array([rank + 1, 0.5 * rank], np.float32)
    want = np.array([n * (n + 1) / 2, n * (n - 1) / 4], np.float32)  # exact in float32
    wrong = 0

    def ar8() -> float:
        nonlocal wrong
        x[:] = base
        t = time.perf_counter()
        rr.allreduce(x)
        t = time.perf_counter() - t
        wrong += int(not np.array_equal(x, want))
        return t

    ar8()
    res["fds"] = len(os.listdir("/proc/self/fd"))
    for _ in range(warmup - 1):
        ar8()
    res["allreduce_8b_s"] = statistics.median(ar8() for _ in range(iters))
    rr.barrier()
    if stats is None:
        res["link_stats"] = None
        time.sleep(hb_window)  # keep the ranks' timelines the same either way
    else:
        s0, t0 = stats(), time.perf_counter()
        time.sleep(hb_window)
        s1, el = stats(), time.perf_counter() - t0
        lacks = {"connections", "heartbeat_targets", "heartbeat_sent"} - set(s1)
        if lacks:
            raise SystemExit(f"Communicator.link_stats() returned no {sorted(lacks)}: {s1}")
        res["link_stats"] = s1
        res["hb_pkts_per_s"] = (s1["heartbeat_sent"] - s0["heartbeat_sent"]) / el
    rr.barrier()
    res["wrong"] = wrong
    _dump(os.path.join(out, f"m{rank}.json"), res)

    victim = n // 2
    if rank != victim:  # ringreduce-run SIGTERMs everyone when the victim dies: not us
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stamp = np.array([time.time() + 0.5], np.float64)
    rr.broadcast(stamp, src=0)
    t_kill = float(stamp[0])
    if rank == victim:
        time.sleep(max(0.0, t_kill - time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    big = np.empty(16 * 1024, np.float32)  # 64 KiB
    try:
        while True:
            big.fill(rank + 1)
            rr.allreduce(big)
            wrong += int(not (big == n * (n + 1) / 2).all())
    except Exception as e:  # noqa: BLE001 - whatever the library raises is the result
        k = {"detect_s": time.time() - t_kill, "type": type(e).__name__, "msg": str(e)[:400],
             "named": bool(re.search(rf"\brank {victim}\b", str(e))), "wrong": wrong}
    _dump(os.path.join(out, f"k{rank}.json"), k)
    os._exit(0)  # no teardown against a dead peer


def _kill_ranks(tmp: str) -> None:
    """SIGKILL the process group of every worker of this job still alive (they run in their
    own sessions; found by the job's unique temporary directory on their command line)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if b"--worker" in args and tmp.encode() in args:
                os.killpg(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _load(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_config(n: int, transport: str, a: argparse.Namespace, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="rr-scaling-") as tmp:
        return _run_config(tmp, n, transport, a, env)


def _run_config(tmp: str, n: int, transport: str, a: argparse.Namespace, env: dict) -> dict:
    iters = min(a.iters, 50) if n >= 32 else a.iters
    cmd = [*launcher(), "-n", str(n), "--no-prefix",
           "--grace-period", str(a.kill_limit), sys.executable, os.path.abspath(__file__),
           "--worker", tmp, f"{iters},{a.warmup},{a.hb_window}"]
    row: dict = {"n": n, "transport": transport, "iters": iters, "error": None}
    t0 = time.monotonic()
    with open(os.path.join(tmp, "launcher.log"), "wb") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, **env, "RINGREDUCE_TRANSPORT": transport,
                                  "OMP_NUM_THREADS": "1"})
        try:
            row["launcher_rc"] = p.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            row["launcher_rc"], row["error"] = None, f"timed out after {a.timeout:g} s"
        finally:
            _kill_ranks(tmp)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    row["wall_s"] = time.monotonic() - t0
    m = [_load(os.path.join(tmp, f"m{r}.json")) for r in range(n)]
    victim = n // 2
    k = [_load(os.path.join(tmp, f"k{r}.json")) for r in range(n) if r != victim]
    if None in m:
        with open(os.path.join(tmp, "launcher.log"), errors="replace") as f:
            row["log_tail"] = f.read()[-2000:]
        last = [ln for ln in row["log_tail"].splitlines() if ln.strip()][-2:]
        lost = [r for r in range(n) if m[r] is None]
        row["error"] = (f"{row['error'] + '; ' if row['error'] else ''}ranks {lost} wrote no results "
                        f"(the launcher's log ends: {' | '.join(last)})").strip()
        return row
    med = statistics.median
    ls = [r["link_stats"] for r in m]
    hb = [r.get("hb_pkts_per_s") for r in m]
    row.update({
        "init_s": max(r["init_s"] for r in m),
        "init_after_last_s": max(r["t_init_end"] for r in m) - max(r["t_init_start"] for r in m),
        "fds_median": med(r["fds"] for r in m), "fds_max": max(r["fds"] for r in m),
        "rss_mib": med(r["rss_mib"] for r in m),
        "link_stats": None not in ls,
        "hb_pkts_per_s": med(hb) if None not in ls else None,
        "hb_pkts_per_s_max": max(hb) if None not in ls else None,
        "connections": med(s["connections"] for s in ls) if None not in ls else None,
        "hb_targets": med(s["heartbeat_targets"] for s in ls) if None not in ls else None,
        "allreduce_8b_us": m[0]["allreduce_8b_s"] * 1e6,
        "victim": victim,
        "wrong_results": sum(r["wrong"] for r in m) + sum(r["wrong"] for r in k if r),
        "kill_detect_s_median": None, "kill_detect_s_max": None,
        "victim_named": all(r is not None and r["named"] for r in k),
        "example_error": next((r["msg"] for r in k if r), "")})
    got = [r["detect_s"] for r in k if r]
    if got:
        row["kill_detect_s_median"], row["kill_detect_s_max"] = med(got), max(got)
    if len(got) < len(k):
        row["error"] = (f"{len(k) - len(got)} of {len(k)} survivors did not detect the kill "
                        f"within {a.kill_limit:g} s")
    if not row["error"]:
        shutil.rmtree(tmp, ignore_errors=True)  # kept when something went wrong
    return row


def _ratios(rows: list, transports: list) -> dict:
    out: dict = {"bar": BAR, "fds_64_over_8": {}, "hb_64_over_8": {}}
    for t in transports:
        by_n = {r["n"]: r for r in rows if r["transport"] == t and not r["error"]}
        if 8 not in by_n or 64 not in by_n:
            continue
        for key, col in (("fds_64_over_8", "fds_median"), ("hb_64_over_8", "hb_pkts_per_s")):
            lo, hi = by_n[8].get(col), by_n[64].get(col)
            ratio = hi / lo if lo and hi is not None else None
            out[key][t] = {"ratio": ratio, "within_bar": None if ratio is None else ratio <= BAR}
    return out


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(str(v) if spec == "s" else v, spec)


def _table(rows: list) -> str:
    cols = (("n", "n", "d"), ("transport", "transport", "s"), ("init_s", "init s", ".2f"),
            ("init_after_last_s", "init* s", ".2f"), ("fds_median", "fds med", "g"),
            ("fds_max", "fds max", "g"), ("rss_mib", "RSS MiB", ".0f"), ("connections", "conns", "g"),
            ("hb_targets", "hb tgts", "g"), ("hb_pkts_per_s", "hb pkt/s", ".1f"),
            ("allreduce_8b_us", "8B ar us", ".1f"), ("kill_detect_s_median", "kill med s", ".3f"),
            ("kill_detect_s_max", "kill max s", ".3f"), ("victim_named", "named", "s"))
    lines = [" ".join(f"{h:>10}" for _, h, _ in cols)]
    for r in rows:
        lines.append(" ".join(f"{_fmt(r.get(k), s):>10}" for k, _, s in cols)
                     + (f"  ERROR: {r['error'].strip().splitlines()[0]}" if r["error"] else ""))
    return "\n".join(lines)


def _plot(rows: list, transports: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (col, title) in zip(axes.flat, PANELS):
        for i, t in enumerate(transports):
            pts = [(r["n"], r.get(col)) for r in rows
                   if r["transport"] == t and r.get(col) is not None]
            if pts:
                ax.plot(*zip(*pts), "os^v"[i % 4] + "-", color=f"C{i}", label=t, alpha=0.8)
            extra = {"kill_detect_s_median": "kill_detect_s_max", "init_s": "init_after_last_s"}
            if col in extra:
                pts = [(r["n"], r[extra[col]]) for r in rows
                       if r["transport"] == t and r.get(extra[col]) is not None]
                if pts:
                    ax.plot(*zip(*pts), ":", color=f"C{i}")
        ax.set_xscale("log", base=2)
        ns = sorted({r["n"] for r in rows})
        ax.set_xticks(ns, [str(v) for v in ns])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("ranks (n)")
        if col == "allreduce_8b_us":
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("ringreduce per-rank cost vs world size (one machine)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--sizes", default="2,4,8,16,32,64", help="world sizes (comma-separated)")
    p.add_argument("--quick", action="store_true", help="sizes 2,4,8")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--iters", type=int, default=200, help="timed 8 B all-reduces (<= 50 at n >= 32)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--hb-window", type=float, default=3.0, help="seconds heartbeats are counted")
    p.add_argument("--kill-limit", type=float, default=30.0,
                   help="give up on survivors this long after the victim died")
    p.add_argument("--timeout", type=float, default=600.0, help="hard limit per job, seconds")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment for the ranks (repeatable)")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    sizes = [2, 4, 8] if a.quick else [int(v) for v in a.sizes.split(",")]
    transports = a.transports.split(",")
    if min(sizes) < 2 or a.warmup < 1 or a.iters < 1 or set(transports) - {"shm", "tcp"}:
        p.error("sizes must be >= 2, --warmup/--iters >= 1, transports shm and/or tcp")
    if any("=" not in kv for kv in a.env):
        p.error("--env takes K=V")
    # 2-core machines: ranks importing torch one after another can take minutes at n = 64
    env = {"RINGREDUCE_CONNECT_TIMEOUT": "600", **dict(kv.split("=", 1) for kv in a.env)}
    rows = []
    for n in sizes:
        for t in transports:
            row = run_config(n, t, a, env)
            rows.append(row)
            print(f"[scaling] n={n:<3} {t}: {row['wall_s']:.1f} s  "
                  + (f"ERROR {row['error'].strip()}" if row["error"] else
                     f"init {row['init_s']:.2f} s, fds {row['fds_median']:g}, "
                     f"hb {_fmt(row['hb_pkts_per_s'], '.1f')}/s, 8 B {row['allreduce_8b_us']:.1f}"
                     f" us, kill {_fmt(row['kill_detect_s_median'], '.3f')} s"),
                  file=sys.stderr, flush=True)
    missing_ls = any(r.get("link_stats") is False for r in rows)
    ok = [r for r in rows if not r["error"]]
    checks = {**_ratios(rows, transports),
              "wrong_results": sum(r["wrong_results"] for r in ok),
              "victim_named_all": all(r["victim_named"] for r in ok),
              "failed": [f"{r['n']}/{r['transport']}" for r in rows if r["error"]],
              "link_stats": "missing" if missing_ls else "ok"}
    print(_table(rows))
    print("init s: slowest rank's ringreduce.init(); init* s: from the last rank entering "
          "init to the last leaving it")
    print("checks: " + json.dumps(checks))
    if missing_ls:
        print("ERROR: the world communicator has no link_stats() (this build of ringreduce._C "
              "predates it): connections / heartbeat columns are null", file=sys.stderr)
    from ringreduce.bench.machine import describe

    if a.json:
        from ringreduce.bench.outfile import replacing  # whole file or none
        with replacing(a.json) as f:
            json.dump({"machine": describe(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "cmd": "python bench/scaling.py " + " ".join(argv or sys.argv[1:]),
                       "env": env, "rows": rows, "checks": checks}, f, indent=1)
    if a.plot:
        _plot(rows, transports, a.plot)
    bad = checks["wrong_results"] or not checks["victim_named_all"] or checks["failed"]
    return 1 if bad or missing_ls else 0


if __name__ == "__main__":
    sys.exit(main())
