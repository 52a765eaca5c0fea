"""Output of a sweep: the nccl-tests-style table, JSON and CSV files, and the plot."""

from __future__ import annotations

import csv
import math
import platform
import sys
import time
from argparse import Namespace
from collections import Counter

from .. import _env
from . import machine
from .metrics import REDUCING, ROOTED, Row, combo_key
from .outfile import replacing, write_json

CSV_FIELDS = ("op", "library", "size", "count", "type", "redop", "root", "algo", "world_size",
              "time_us", "p99_us", "algbw_gbps", "busbw_gbps", "wrong", "iters")


def make_meta(args: Namespace, world: int, hosts: list, notes: dict, transport: str) -> dict:
    """What the run measured, for the table header and the JSON file."""
    import ringreduce

    counts = Counter(hosts or [platform.node()])
    return {
        "tool": "ringreduce-bench", "ringreduce_version": ringreduce.__version__,
        "world_size": world, "hosts": dict(counts), "ops": list(args.ops),
        # "dtype"/"redop": comma-joined (one name unless -d/--op gave several), the lists too
        "dtype": ",".join(args.dtypes), "redop": ",".join(args.redops),
        "dtypes": list(args.dtypes), "redops": list(args.redops),
        "root": args.root, "algo": args.algo,
        "transport": transport,
        "transport_requested": args.transport or _env.tunables().transport,
        "command": getattr(args, "command", None) or command_line(),
        "minbytes": args.minbytes, "maxbytes": args.maxbytes, "stepfactor": args.stepfactor,
        "stepbytes": args.stepbytes, "device": getattr(args, "device", "cpu"),
        "timeout_s": args.timeout,
        "warmup": args.warmup, "iters": args.iters, "check": int(args.check),
        "compare": list(args.compare), "libraries": dict(notes),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine.describe(),
    }


def command_line() -> str:
    """This rank's command, as ringreduce-bench's (a rank of a job someone else started)."""
    import shlex

    return shlex.join(["ringreduce-bench", *sys.argv[1:]])


def _fmt(x: float, width: int, prec: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-".rjust(width)
    return f"{x:{width}.{prec}f}"


def speedup(mine: Row, other: Row | None, p99: bool = False) -> float:
    """other's time / ringreduce's time (= ringreduce busbw / other busbw): > 1 is faster."""
    if other is None:
        return float("nan")
    a, b = (mine.p99_us, other.p99_us) if p99 else (mine.time_us, other.time_us)
    return b / a if a > 0 else float("nan")


def header(meta: dict, skipped: list[dict]) -> list[str]:
    hosts = ", ".join(f"{h} x{c}" for h, c in meta["hosts"].items())
    transport = f"{meta['transport']} (RINGREDUCE_TRANSPORT={meta['transport_requested']})"
    out = [(f"# ringreduce-bench (ringreduce {meta['ringreduce_version']}): "
            f"{meta['world_size']} rank{'s' * (meta['world_size'] != 1)} on {hosts}"),
           (f"#  collectives {','.join(meta['ops'])}  type {meta['dtype']}  redop {meta['redop']}"
            f"  root {meta['root']}  algo {meta['algo']}  transport {transport}"),
           (f"#  warmup {meta['warmup']}  iters {meta['iters']}  check {int(meta['check'])}"
            "  time = median over iterations of the slowest rank; p99 likewise")]
    m = meta.get("machine")
    if m:
        out.append(f"#  machine: {m['cpu_model']} ({m['cpus_usable']}/{m['cpus']} CPUs usable"
                   f"{', ' + m['hypervisor'] + ' guest' if m.get('hypervisor') else ''}), "
                   f"torch {m['torch']}, commit {m['ringreduce_commit']}")
    for name, note in meta["libraries"].items():
        out.append(f"#  compare: {name}: {note}")
    return out + skip_lines(skipped, meta)


def _types(meta: dict) -> tuple[list[str], list[str]]:
    """The run's dtypes and reductions (a JSON file of an older version has one of each)."""
    return (meta.get("dtypes") or [meta["dtype"]], meta.get("redops") or [meta["redop"]])


def _label(op: str, dtype: str | None, redop: str | None, meta: dict) -> str:
    """The collective, with its type and reduction where the run has several of them."""
    dtypes, redops = _types(meta)
    _, t, r = combo_key(op, dtype, redop)
    return " ".join([op, *([t] if t and len(dtypes) > 1 else []),
                     *([r] if r and len(redops) > 1 else [])])


def skip_lines(skipped: list[dict], meta: dict) -> list[str]:
    """One line per library, collective and reason, naming the types / reductions skipped
    where the run has several ("gloo skipped for allreduce int16, uint16, int8 avg: ...")."""
    groups: dict[tuple, list[tuple]] = {}
    for s in skipped:
        groups.setdefault((s["library"], s["op"], s["reason"]), []).append(
            (s.get("type"), s.get("redop")))
    out = []
    for (lib, op, reason), items in groups.items():
        what = "" if op == "*" else " for " + _skipped_what(op, items, meta)
        # ringreduce skips only where -d/--op gave several (one refused is an error)
        out.append(f"#  {'compare: ' * (lib != 'ringreduce')}{lib} skipped{what}: {reason}")
    return out


def _skipped_what(op: str, items: list[tuple], meta: dict) -> str:
    """`op` and which of its (type, redop) combinations `items` are: a type alone when
    every reduction of it is there, nothing more when every combination is."""
    dtypes, redops = _types(meta)
    many_t = len(dtypes) > 1 and op != "barrier"
    many_r = len(redops) > 1 and op in REDUCING
    by_type: dict = {}
    for t, r in items:
        by_type.setdefault(t, []).append(r)
    parts, whole = [], not many_t or set(by_type) >= set(dtypes)
    shared = {tuple(rs) for rs in by_type.values()}
    if many_t and many_r and whole and len(shared) == 1:  # the same reductions of every type
        rs = shared.pop()
        return op if set(rs) >= set(redops) else f"{op} {','.join(map(str, rs))}"
    for t, rs in by_type.items():
        every_r = not many_r or set(rs) >= set(redops)
        whole = whole and every_r
        words = ([t] if many_t and t else []) + ([] if every_r else [",".join(map(str, rs))])
        parts.append(" ".join(words))
    parts = [p for p in parts if p]
    return op if whole or not parts else f"{op} {', '.join(parts)}"


def op_head(op: str, anchors: list[str]) -> list[str]:
    """The lines that open a collective's part of the table."""
    head = (f"#{'size':>11} {'count':>12} {'type':>9} {'redop':>6} {'root':>5} {'algo':>8} "
            f"{'time(us)':>10} {'p99(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} "
            f"{'#wrong':>7}")
    unit = f"#{'(B)':>11} {'(elements)':>12}"
    for a in anchors:
        head += f" | {a + '(us)':>10} {a + ' busbw':>11} {'x' + a:>7} {'x' + a + '99':>8}"
    return ["#", f"# {op}", head, unit]


def row_line(r: Row, by: dict, anchors: list[str]) -> str:
    """ringreduce's row `r`, with each anchor's row of the same case from `by` ((library,
    key, size) -> Row) beside it."""
    op = r.op
    redop = r.redop if op in REDUCING else "-"
    root = str(r.root) if op in ROOTED else "-"
    bw = op != "barrier"  # (it moves no data: nothing to check or to measure bandwidth of)
    wrong = "N/A" if r.wrong is None else str(r.wrong) if bw else "-"
    line = (f"{r.size:>12} {r.count:>12} {r.dtype if bw else '-':>9} {redop:>6} {root:>5} "
            f"{r.algo:>8} {_fmt(r.time_us, 10)} {_fmt(r.p99_us, 10)} "
            f"{_fmt(r.algbw if bw else None, 11, 3)} {_fmt(r.busbw if bw else None, 11, 3)} "
            f"{wrong:>7}")
    for a in anchors:
        o = by.get((a, r.key, r.size))
        if o is not None and o.wrong:  # its results were wrong: no ratio to quote
            ratios = f"{'wrong':>7} {'wrong':>8}"
        else:
            ratios = f"{_fmt(speedup(r, o), 7)} {_fmt(speedup(r, o, p99=True), 8)}"
        line += (f" | {_fmt(o.time_us if o else None, 10)} "
                 f"{_fmt(o.busbw if (o and bw) else None, 11, 3)} {ratios}")
    return line


def _op_table(op: str, rows: list[Row], anchors: list[str]) -> list[str]:
    by = {(r.lib, r.key, r.size): r for r in rows if r.op == op}  # same type, redop, size
    return op_head(op, anchors) + [row_line(r, by, anchors) for r in rows
                                   if r.op == op and r.lib == "ringreduce"]


def _ratio_summary(ratios: dict[tuple, float], ops: list[str], combos: int) -> str:
    """The geometric mean of the ratios an anchor has (((op, type, redop), size) -> ratio;
    nan where it did not run), naming the collectives it covers when not all of the table's
    and, with `combos` > 1 (several types / reductions), how many of them."""
    have = {k: x for k, x in ratios.items() if x > 0 and not math.isnan(x)}
    if not have:
        return "n/a (no size where both results were right)"
    covered = [op for op in ops if any(k[0][0] == op for k in have)]
    only = f" of {', '.join(covered)} only" if covered != ops else ""
    if combos > 1:
        only += (f", {len({k[0] for k in have})} of {combos} "
                 "collective/type/reduction combinations")
    g = math.exp(sum(math.log(x) for x in have.values()) / len(have))
    return f"{g:.3g}x{only} (> 1: ringreduce faster)"


def table(rows: list[Row], meta: dict, skipped: list[dict]) -> str:
    """The whole report as printed on rank 0 (the live table, runner's, prints the same
    lines as the rows come, its skip lines before the summary)."""
    anchors = present_anchors(meta, {r.lib for r in rows})
    out = header(meta, skipped)
    for op in [op for op in meta["ops"] if any(r.op == op for r in rows)]:
        out += _op_table(op, rows, anchors)
    return "\n".join(out + summary(rows, meta, anchors))


def present_anchors(meta: dict, libs: set[str]) -> list[str]:
    """The compared libraries among `libs`, in --compare's order."""
    return [a for a in meta.get("compare", []) if a in libs]


def summary(rows: list[Row], meta: dict, anchors: list[str]) -> list[str]:
    """The lines after the table: wrong values, each anchor's ratio, the average busbw."""
    out: list[str] = []
    ops = [op for op in meta["ops"] if any(r.op == op for r in rows)]
    mine = [r for r in rows if r.lib == "ringreduce"]
    bad = out_of_bounds(rows)
    if bad is not None:
        out.append(f"# Out of bounds values : {bad} {'OK' if bad == 0 else 'FAILED'}")
    by = {(r.lib, r.key, r.size): r for r in rows}  # like with like: same type and redop
    dtypes, redops = _types(meta)
    several = len(dtypes) > 1 or len(redops) > 1
    combos = len({r.key for r in mine}) if several else 1
    for a in anchors:
        checked = [r for r in rows if r.lib == a and r.wrong is not None]
        bad = sum(r.wrong or 0 for r in checked)
        if bad:  # an anchor's wrong results make its ratios meaningless: say so
            at = list(dict.fromkeys(f"{_label(r.op, r.dtype, r.redop, meta)} {r.size} B"
                                    for r in checked if r.wrong))
            out.append(f"# {a} out of bounds values : {bad} FAILED (at " + ", ".join(at[:6])
                       + "; its times there do not count)")
        elif checked:
            out.append(f"# {a} out of bounds values : 0 OK")
        # Sizes where its results were wrong count in neither summary (as the note says).
        theirs = [r for r in rows if r.lib == a and r.op != "barrier" and not r.wrong]
        sp = {(r.key, r.size): speedup(r, o) for r in mine
              if not getattr(o := by.get((a, r.key, r.size)), "wrong", None)}
        if theirs:
            avg = sum(r.busbw for r in theirs) / len(theirs)
            line = f"# {a} avg bus bandwidth : {avg:.4g}"
            same = [m for r in theirs if (m := by.get(("ringreduce", r.key, r.size)))]
            if same and len(same) != sum(r.op != "barrier" for r in mine):
                line += (f" (ringreduce's over the same {len(same)} rows: "
                         f"{sum(r.busbw for r in same) / len(same):.4g})")
            out.append(line)
        over = "sizes, types and reductions" if several else "sizes"
        out.append(f"# ringreduce vs {a}: time ratio {a}/ringreduce, geometric mean over {over} "
                   + _ratio_summary(sp, ops, combos))
    out.append(f"# Avg bus bandwidth    : {avg_busbw(rows):.4g}")
    return out


def avg_busbw(rows: list[Row]) -> float:
    """ringreduce's busbw averaged over its rows (nccl-tests' "Avg bus bandwidth")."""
    bw = [r.busbw for r in rows if r.lib == "ringreduce" and r.op != "barrier"]
    return sum(bw) / len(bw) if bw else 0.0


def out_of_bounds(rows: list[Row], lib: str = "ringreduce") -> int | None:
    """`lib`'s wrong elements over its checked rows (nccl-tests' "Out of bounds values");
    None where none was checked (-c 0)."""
    checked = [r for r in rows if r.lib == lib and r.wrong is not None]
    return sum(r.wrong or 0 for r in checked) if checked else None


def to_json(rows: list[Row], meta: dict, skipped: list[dict]) -> dict:
    """The JSON file: what ran (meta), every row, the skips, and the table's totals."""
    totals = {"avg_busbw_gbps": avg_busbw(rows), "out_of_bounds": out_of_bounds(rows)}
    return {"meta": meta, "results": [r.as_dict() for r in rows], "skipped": skipped,
            "totals": totals}


def write_csv(path: str, rows: list[Row]) -> None:
    with replacing(path) as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r.as_dict(with_times=False))


def write_outputs(args: Namespace, rows: list[Row], meta: dict, skipped: list[dict]) -> None:
    """--json / --csv / --plot files (rank 0)."""
    if args.json:
        write_json(args.json, to_json(rows, meta, skipped), separators=(",", ":"))
        print(f"# wrote {args.json}", file=sys.stderr)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"# wrote {args.csv}", file=sys.stderr)
    if args.plot:
        from . import plot

        why = plot.plot(rows, meta, args.plot)
        print(f"# {why or 'wrote ' + args.plot}", file=sys.stderr)
