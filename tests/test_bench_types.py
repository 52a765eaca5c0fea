"""ringreduce-bench with several types and reductions (-d all / lists, --op all / lists), as
nccl-tests' -d all and -o all: the parser, the combinations a sweep runs, skips of what a
library refuses, the table, JSON and plot of such a run, the Open MPI job's arguments, and
a real sweep (2 ranks, loopback TCP). The rest of the bench's tests are in test_bench.py."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from test_bench import _LAUNCH_VARS, PNG_MAGIC, _run

from ringreduce.bench import anchors, cli, metrics, progress, report, runner
from ringreduce.bench.metrics import REDUCING, Row

HAVE = [d for d in cli.DTYPES if hasattr(torch, d)]  # what -d all means with this torch


@pytest.fixture(autouse=True)
def _not_a_rank(monkeypatch):
    """parse_args counts this host's ranks from the launcher's variables: none here."""
    for k in _LAUNCH_VARS:
        monkeypatch.delenv(k, raising=False)


# ---------------------------------------------------------------- command line

def test_all_lists_and_aliases():
    a = cli.parse_args(["-d", "all", "--op", "all"])
    assert a.dtypes == HAVE and a.redops == list(cli.REDOPS)
    assert (a.dtype, a.redop) == (None, None)  # no single value: each combination has its own
    assert cli.several_types(a)
    a = cli.parse_args(["-d", "float32,int8", "--op", "max,SUM"])
    assert (a.dtypes, a.redops) == (["float32", "int8"], ["max", "sum"])
    # nccl-tests' spellings, case, spaces; repeats run once, in the order given
    a = cli.parse_args(["-d", "half, BF16,float16,double", "--op", "min,min"])
    assert (a.dtypes, a.redops) == (["float16", "bfloat16", "float64"], ["min"])
    assert (a.dtype, a.redop) == (None, "min") and cli.several_types(a)
    assert cli.parse_args(["-d", "int8,all"]).dtypes == ["int8", *(d for d in HAVE if d != "int8")]
    a = cli.parse_args(["-d", "int", "--op", "prod"])  # one of each: as before
    assert (a.dtypes, a.dtype, a.redops, a.redop) == (["int32"], "int32", ["prod"], "prod")
    assert not cli.several_types(a)


@pytest.mark.parametrize("argv,said", [
    (["-d", "float32,complex64"], "unknown dtype 'complex64'; use one of float32, float64"),
    (["-d", "float32,"], "empty item in -d 'float32,'"),
    (["-d", ""], "empty item in -d"),
    (["--op", "sum,xor"], "unknown reduction 'xor'; use one of sum, avg, prod, min, max or all"),
    (["--op", ","], "empty item in --op"),
    (["--op", "all_reduce"], "--op picks the reduction; the collective is -o all_reduce"),
    (["-o", "max"], "the reduction is --op max"),
    (["--tune", "-d", "all"], ("--tune fits the cost model to float32 sum all-reduces (its "
                               "alpha and beta are per message and per byte, whatever the "
                               f"type): drop -d {len(HAVE)} values")),
    (["--tune", "--op", "sum,max"], "drop --op sum,max"),
    (["--tune", "-d", "int8"], "drop -d int8"),  # was silently ignored: the fit is float32's
    (["--tune", "-d", "fp64", "--op", "min"], "drop -d float64, --op min"),
])
def test_bad_lists_are_named(argv, said, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert said in capsys.readouterr().err


def test_missing_unsigned_types(monkeypatch, capsys):
    """On a torch before 2.3 (no uint16/32/64): all means the others, naming one is an error."""
    monkeypatch.setattr(cli, "_available", lambda name: name in ("float32", "int8", "uint8"))
    assert cli.parse_args(["-d", "all"]).dtypes == ["float32", "int8", "uint8"]
    with pytest.raises(SystemExit):
        cli.parse_args(["-d", "float32,uint32"])
    assert "uint32 needs torch >= 2.3" in capsys.readouterr().err


def test_combinations_repeat_only_what_differs():
    """Every type of every collective, every reduction of the reducing ones only, and
    barrier once."""
    dtypes, redops = ["float32", "int8"], ["sum", "avg", "max"]
    got = metrics.combinations(["allreduce", "broadcast", "barrier", "reduce_scatter"],
                               dtypes, redops)
    assert got == [("allreduce", d, r) for d in dtypes for r in redops] + \
        [("broadcast", d, "sum") for d in dtypes] + [("barrier", "float32", "sum")] + \
        [("reduce_scatter", d, r) for d in dtypes for r in redops]
    keys = [metrics.combo_key(*c) for c in got]
    assert len(set(keys)) == len(keys)
    assert ("broadcast", "int8", None) in keys and ("barrier", None, None) in keys
    assert set(REDUCING) == {"allreduce", "reduce_scatter", "reduce"}


# ---------------------------------------------------------------- the sweep (in-process fakes)

class _Fake(anchors.Lib):
    """A library on one rank that refuses the (dtype, redop) pairs in `refuse`; its
    collectives leave the buffers as they are, which on one rank is the right result of
    allreduce, broadcast and reduce."""

    def __init__(self, name, refuse=()):
        self.name, self.refuse, self.runs = name, set(refuse), []

    def run(self, case, b, redop, root):
        dtype = str(b.inp.dtype).replace("torch.", "")
        if case.op in REDUCING and (dtype, redop) in self.refuse:
            raise ValueError(f"{self.name} cannot reduce {dtype} with {redop}")
        self.runs.append((case.op, dtype, redop if case.op in REDUCING else None))

    def barrier(self):
        pass


class _Bar:
    def __init__(self):
        self.steps = []

    def step(self, amount, label=""):
        self.steps.append(amount)


def _sweep(argv, libs):
    args = cli.parse_args(["-b", "8", "-e", "64", "-f", "8", "-w", "0", "-i", "2", *argv])
    bar = _Bar()
    rows, skipped = runner.sweep(args, libs, lambda a, op: a, 0, 1, bar)
    return args, rows, skipped, bar


def test_a_refused_combination_is_a_skip_with_several_types():
    mine, gloo = _Fake("ringreduce", {("int8", "avg")}), _Fake("gloo", {("int8", "max")})
    args, rows, skipped, bar = _sweep(["-o", "allreduce,broadcast,barrier", "-d",
                                       "float32,int8", "--op", "avg,max", "--check"],
                                      [mine, gloo])
    everything = {metrics.combo_key(*c) for c in
                  metrics.combinations(args.ops, args.dtypes, args.redops)}
    ran = {lib: {(r.key, r.size) for r in rows if r.lib == lib} for lib in ("ringreduce", "gloo")}
    assert {k for k, _ in ran["ringreduce"]} == everything - {("allreduce", "int8", "avg")}
    assert {k for k, _ in ran["gloo"]} == everything - {("allreduce", "int8", "avg"),
                                                        ("allreduce", "int8", "max")}
    assert len(rows) == len(ran["ringreduce"]) + len(ran["gloo"])  # no row twice
    assert all(r.wrong == 0 for r in rows)
    assert skipped == [
        {"library": "ringreduce", "op": "allreduce", "type": "int8", "redop": "avg",
         "reason": "ValueError: ringreduce cannot reduce int8 with avg"},
        {"library": "gloo", "op": "allreduce", "type": "int8", "redop": "max",
         "reason": "ValueError: gloo cannot reduce int8 with max"}]
    # gloo never ran what ringreduce refused: nothing to compare it with
    assert ("allreduce", "int8", "avg") not in gloo.runs
    # the progress bar's total is every combination's sizes for every library, and every
    # one of them (skipped or measured) is stepped
    total = runner.total_work(args, 1, 2)
    assert sum(bar.steps) == pytest.approx(total)
    per_lib = sum(progress.weight(c.size) for op, d, _ in
                  metrics.combinations(args.ops, args.dtypes, args.redops)
                  for c in metrics.make_cases(op, args.sizes, d, 1))
    assert total == pytest.approx(2 * per_lib) and len(everything) == 7


def test_a_refused_combination_ends_the_run_with_one_type():
    mine = _Fake("ringreduce", {("int8", "avg")})
    with pytest.raises(runner.BenchError, match=r"ringreduce cannot run allreduce of int8 \(avg\) "
                                                "with these options: ValueError: ringreduce "
                                                "cannot reduce int8 with avg"):
        _sweep(["-o", "broadcast,allreduce", "-d", "int8", "--op", "avg"], [mine])


# ---------------------------------------------------------------- table, JSON, plot

def _typed_rows():
    """ringreduce and gloo at 2 sizes of allreduce float32/int8 x sum/max, gloo 2x slower on
    float32 and 8x on int8 (and no int8 max), broadcast of both types, one barrier."""
    rows = []
    for lib in ("ringreduce", "gloo"):
        for dtype, slow in (("float32", 2.0), ("int8", 8.0)):
            for redop in ("sum", "max"):
                if lib == "gloo" and (dtype, redop) == ("int8", "max"):
                    continue
                for size in (64, 4096):
                    t = 1e-5 * (slow if lib == "gloo" else 1.0)
                    rows.append(Row("allreduce", lib, size, size // 4, dtype, redop, 0, "-",
                                    2, times=[t] * 3, wrong=0))
            rows.append(Row("broadcast", lib, 64, 16, dtype, "sum", 0, "-", 2,
                            times=[2e-5 * (slow if lib == "gloo" else 1.0)] * 3, wrong=0))
    rows.append(Row("barrier", "ringreduce", 0, 0, "float32", "sum", 0, "-", 2,
                    times=[1e-5] * 3, wrong=0))
    return rows


def _typed_meta():
    a = cli.parse_args(["-o", "allreduce,broadcast,barrier", "-d", "float32,int8", "--op",
                        "sum,max", "--compare", "gloo", "--check"])
    return report.make_meta(a, 2, ["hostA", "hostA"], {"gloo": "torch gloo"}, "tcp")


def test_table_and_json_of_several_types_compare_like_with_like(tmp_path):
    rows, meta = _typed_rows(), _typed_meta()
    skipped = [runner.skip_entry("gloo", "allreduce", "int8", "max", "RuntimeError: no")]
    text = report.table(rows, meta, skipped)
    assert "#  collectives allreduce,broadcast,barrier  type float32,int8  redop sum,max  " \
           "root 0" in text
    assert "#  compare: gloo skipped for allreduce int8 max: RuntimeError: no" in text
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    # every ringreduce row once, with its own type and redop, and gloo's ratio of the same
    # combination (2x for float32, 8x for int8, none where gloo did not run)
    ratio = {(ln[2], ln[3], int(ln[0])): ln[-2] for ln in lines if ln[2] != "-"}
    assert ratio == {("float32", "sum", 64): "2.00", ("float32", "sum", 4096): "2.00",
                     ("float32", "max", 64): "2.00", ("float32", "max", 4096): "2.00",
                     ("int8", "sum", 64): "8.00", ("int8", "sum", 4096): "8.00",
                     ("int8", "max", 64): "-", ("int8", "max", 4096): "-",
                     ("float32", "-", 64): "2.00", ("int8", "-", 64): "8.00"}, text
    assert len(lines) == sum(r.lib == "ringreduce" for r in rows)
    # geometric mean over like pairs only: 2 (float32: 4 allreduce rows, 1 broadcast), 8
    # (int8: 2 allreduce rows, 1 broadcast); the barrier had no gloo row
    g = (2.0 ** 5 * 8.0 ** 3) ** (1 / 8)
    assert (f"geometric mean over sizes, types and reductions {g:.3g}x of allreduce, "
            f"broadcast only, 5 of 7 collective/type/reduction combinations (> 1: ringreduce "
            f"faster)") in text, text
    # gloo's average is over its rows; ringreduce's beside it over the same ones
    mine = [r for r in rows if r.lib == "ringreduce" and r.op != "barrier"
            and (r.dtype, r.redop) != ("int8", "max")]
    gl = [r for r in rows if r.lib == "gloo"]
    assert (f"# gloo avg bus bandwidth : {sum(r.busbw for r in gl) / len(gl):.4g} "
            f"(ringreduce's over the same {len(mine)} rows: "
            f"{sum(r.busbw for r in mine) / len(mine):.4g})") in text, text
    # the anchor's wrong results are named with their type and reduction
    next(r for r in rows if (r.lib, r.dtype, r.redop, r.size) ==
         ("gloo", "int8", "sum", 4096)).wrong = 3
    assert "# gloo out of bounds values : 3 FAILED (at allreduce int8 sum 4096 B;" in \
        report.table(rows, meta, skipped)
    data = report.to_json(rows, meta, skipped)
    assert (data["meta"]["dtypes"], data["meta"]["redops"]) == (["float32", "int8"],
                                                                ["sum", "max"])
    assert (data["meta"]["dtype"], data["meta"]["redop"]) == ("float32,int8", "sum,max")
    assert {(r["op"], r["type"], r["redop"]) for r in data["results"]
            if r["library"] == "ringreduce"} == {
        ("allreduce", d, r) for d in ("float32", "int8") for r in ("sum", "max")} | {
        ("broadcast", "float32", None), ("broadcast", "int8", None), ("barrier", None, None)}


def test_skip_lines_say_what_was_skipped():
    meta = report.make_meta(cli.parse_args(["-o", "allreduce,broadcast", "-d", "all", "--op",
                                            "all"]), 2, ["h"], {}, "tcp")
    sk = runner.skip_entry
    skipped = [sk("mpi", "allreduce", d, "avg", "no avg") for d in HAVE]  # every type's avg
    skipped += [sk("mpi", "allreduce", "bfloat16", r, "no bf16") for r in cli.REDOPS
                if r != "avg"]
    skipped += [sk("gloo", "allreduce", "int16", r, "bad type") for r in cli.REDOPS]
    skipped += [sk("gloo", "allreduce", "int8", "avg", "int avg"),
                sk("gloo", "broadcast", "int16", "sum", "bad type"),
                {"library": "nccl", "op": "*", "reason": "not here"}]
    skipped += [sk("gloo", "allreduce", d, r, "all of it") for d in HAVE for r in ("min", "max")]
    head = report.table([], meta, skipped).splitlines()
    for line in ("#  compare: mpi skipped for allreduce avg: no avg",
                 "#  compare: mpi skipped for allreduce bfloat16 sum,prod,min,max: no bf16",
                 "#  compare: gloo skipped for allreduce int16: bad type",
                 "#  compare: gloo skipped for allreduce int8 avg: int avg",
                 "#  compare: gloo skipped for broadcast int16: bad type",
                 "#  compare: nccl skipped: not here",
                 "#  compare: gloo skipped for allreduce min,max: all of it"):
        assert line in head, "\n".join(head)
    one = report.make_meta(cli.parse_args(["-d", "int16"]), 2, ["h"], {}, "tcp")
    assert "#  compare: gloo skipped for allreduce: bad type" in report.table(
        [], one, [sk("gloo", "allreduce", "int16", "sum", "bad type")])
    assert "#  ringreduce skipped for allreduce int8 avg: refused" in report.table(
        [], meta, [sk("ringreduce", "allreduce", "int8", "avg", "refused")])


def test_plot_of_several_types_and_reductions(tmp_path):
    from ringreduce.bench import plot

    rows = _typed_rows()
    assert plot.panels(rows, ["allreduce", "broadcast"]) == [
        ("allreduce", "sum"), ("allreduce", "max"), ("broadcast", None)]
    one = [r for r in rows if r.redop == "sum"]
    assert plot.panels(one, ["allreduce", "broadcast"]) == [("allreduce", None),
                                                            ("broadcast", None)]
    out = tmp_path / "types.png"
    assert plot.plot(rows, _typed_meta(), str(out)) is None
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 5000
    # a JSON of an older version (meta without the lists) still draws
    meta = {k: v for k, v in _typed_meta().items() if k not in ("dtypes", "redops")}
    assert plot.plot(one, meta, str(tmp_path / "old.png")) is None


# ---------------------------------------------------------------- the Open MPI job

class _FakeMPI(_Fake):
    """What mpi_job runs, on one rank: refuses avg and bfloat16 as MPI does."""

    note = "Fake MPI 1.0"

    def __init__(self):
        super().__init__("mpi")
        self.comm = SimpleNamespace(Get_rank=lambda: 0, Get_size=lambda: 1)

    def run(self, case, b, redop, root):
        if case.op in REDUCING and redop == "avg":
            raise ValueError("MPI has no 'avg' reduction")
        if b.inp.dtype == torch.bfloat16:
            raise TypeError("bfloat16 has no numpy/MPI datatype")
        super().run(case, b, redop, root)

    def allreduce_np(self, a, op):
        return a


def test_the_mpi_job_sweeps_the_same_lists(monkeypatch, tmp_path):
    """The launcher passes -d/--op on to the mpirun job as given; the job sweeps every
    combination, skipping what MPI refuses, and the ranks merge its rows and skips."""
    from ringreduce.bench import launch, mpi_job

    argv = ["-o", "allreduce,broadcast,barrier", "-d", "float32,bfloat16,int8", "--op",
            "sum,avg", "-b", "8", "-e", "64", "-f", "8", "-w", "0", "-i", "2", "--check",
            "--progress", "never"]
    seen = {}

    def command(n, rank_argv, out, extra=""):
        seen["argv"] = rank_argv
        return "not run here"

    monkeypatch.setattr(launch, "mpi_command", command)
    os.unlink(launch.run_mpi_job(cli.parse_args(argv), 2, argv, 10))
    out = tmp_path / "mpi.json"
    monkeypatch.setattr(anchors, "MPI", _FakeMPI)
    threads = torch.get_num_threads()
    try:
        assert mpi_job.main([*seen["argv"], "--mpi-results", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)  # the job sets 1, as its ranks do
    data = json.loads(out.read_text())
    assert "error" not in data, data
    got = {(r["op"], r["type"], r["redop"], r["size"]) for r in data["results"]}
    assert len(got) == len(data["results"]) and all(r["wrong"] == 0 for r in data["results"])
    assert {k[:3] for k in got} == {("allreduce", "float32", "sum"), ("allreduce", "int8", "sum"),
                                    ("broadcast", "float32", None), ("broadcast", "int8", None),
                                    ("barrier", None, None)}
    assert {(s["op"], s["type"], s["redop"]): s["reason"] for s in data["skipped"]} == {
        ("allreduce", "float32", "avg"): "ValueError: MPI has no 'avg' reduction",
        ("allreduce", "bfloat16", "sum"): "TypeError: bfloat16 has no numpy/MPI datatype",
        ("allreduce", "bfloat16", "avg"): "ValueError: MPI has no 'avg' reduction",
        ("allreduce", "int8", "avg"): "ValueError: MPI has no 'avg' reduction",
        ("broadcast", "bfloat16", None): "TypeError: bfloat16 has no numpy/MPI datatype"}
    rows, skipped, note = runner._load_mpi_results(str(out))
    args = cli.parse_args([*argv, "--compare", "mpi"])
    text = report.table(rows, report.make_meta(args, 1, ["h"], {"mpi": note}, "tcp"), skipped)
    assert "#  compare: mpi skipped for allreduce avg: ValueError: MPI has no 'avg' " \
           "reduction" in text, text
    assert "#  compare: mpi skipped for allreduce bfloat16 sum: TypeError" in text, text


# ---------------------------------------------------------------- a real run

@pytest.mark.timeout(300)
def test_every_type_and_reduction_checked_against_gloo(tmp_path):
    """-d all --op all: each (collective, type, reduction) once per size for ringreduce,
    verified; broadcast once per type, barrier once; gloo's refusals skipped with reasons."""
    js = tmp_path / "all.json"
    rc, out, err = _run([sys.executable, "-m", "ringreduce.bench",
                         "-n", "2", "-b", "8", "-e", "1K", "-f", "8", "-w", "1", "-i", "2",
                         "-o", "allreduce,broadcast,barrier", "-d", "all", "--op", "all",
                         "--check", "--json", str(js), "--compare", "gloo", "--transport",
                         "tcp", "--progress", "never"], 280, {"GLOO_SOCKET_IFNAME": "lo"})
    assert rc == 0, out + err
    data = json.loads(js.read_text())
    res, skipped = data["results"], data["skipped"]
    want = {("allreduce", d, r) for d in HAVE for r in cli.REDOPS} | \
        {("broadcast", d, None) for d in HAVE} | {("barrier", None, None)}
    mine = [r for r in res if r["library"] == "ringreduce"]
    assert {(r["op"], r["type"], r["redop"]) for r in mine} == want
    for lib in ("ringreduce", "gloo"):  # no row twice: broadcast not per reduction etc.
        keys = [(r["op"], r["type"], r["redop"], r["size"]) for r in res if r["library"] == lib]
        assert len(keys) == len(set(keys)), lib
    sizes = {"allreduce": 3, "broadcast": 3, "barrier": 1}  # 8, 64, 512 B; barrier has none
    assert len(mine) == sum(sizes[op] for op, _, _ in want)
    assert all(r["wrong"] == 0 and r["iters"] == 2 for r in mine)
    assert all(r["wrong"] is not None for r in res)
    # gloo: every combination either measured or skipped with a reason (never both); it has
    # no uint64 (see test_bench's unsigned test)
    theirs = {(r["op"], r["type"], r["redop"]) for r in res if r["library"] == "gloo"}
    gskip = {(s["op"], s["type"], s["redop"]): s["reason"] for s in skipped
             if s["library"] == "gloo"}
    assert theirs | set(gskip) == want and not theirs & set(gskip)
    assert ("allreduce", "uint64", "sum") in gskip and ("broadcast", "uint64", None) in gskip
    assert all(reason.strip() for reason in gskip.values())
    assert all(s["library"] == "gloo" for s in skipped)  # ringreduce refused nothing
    assert (data["meta"]["dtypes"], data["meta"]["redops"]) == (HAVE, list(cli.REDOPS))
    assert "# Out of bounds values : 0 OK" in out and "# gloo out of bounds values : 0 OK" in out
    assert f"  type {','.join(HAVE)}  redop sum,avg,prod,min,max  " in out
    assert any(ln.startswith("#  compare: gloo skipped for allreduce ") and "uint64" in ln
               for ln in out.splitlines()), out
    assert f"of {len(want)} collective/type/reduction combinations" in out, out
    table = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(table) == len(mine)
