"""ringreduce-bench's table as it is measured (ringreduce/bench/live.py), what a sweep that
ends early keeps, and -c's checked iterations outside the timed ones. Helpers from
test_bench."""

from __future__ import annotations

import io
import json
import sys
from argparse import Namespace

import pytest
from test_bench import _meta, _rows, _run

from ringreduce.bench import report, timing
from ringreduce.bench.live import LiveTable
from ringreduce.bench.metrics import make_case


def test_the_live_table_prints_the_tables_lines_as_rows_come():
    """The same lines as report.table, each case's as soon as it is measured; the skip
    lines, known at the end only, before the summary."""
    rows, meta = _rows(), _meta()
    skipped = [{"library": "mpi", "op": "*", "reason": "not here"}]
    out = io.StringIO()
    live = LiveTable(meta, ["ringreduce", "gloo"], [], stream=out)
    seen = []
    for size in (8, 65536, 64 << 20):  # a case: every library's row of one size
        live.add([r for r in rows if r.op == "allreduce" and r.size == size])
        seen.append(out.getvalue().count("\n"))
    live.add([r for r in rows if r.op == "barrier"])
    live.finish(skipped)
    assert seen[0] < seen[1] < seen[2]  # one line per case, as it came
    whole = report.table(rows, meta, skipped).splitlines()
    skip = "#  compare: mpi skipped: not here"
    tail = len(report.summary(rows, meta, ["gloo"]))
    rest = [ln for ln in whole if ln != skip]
    assert skip in whole and tail > 2
    assert out.getvalue().splitlines() == rest[:-tail] + [skip] + rest[-tail:]


def test_the_barriers_row_has_no_wrong_count():
    """A barrier moves no data: nothing was checked, so its #wrong is "-" (it said 0)."""
    rows = [r for r in _rows() if r.op == "barrier"]
    line = report.row_line(rows[0], {}, [])
    assert line.split()[-1] == "-" and rows[0].wrong == 0, line


class _Lib:
    """A library that records what measure() does with it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def barrier(self) -> None:
        self.calls.append("barrier")

    def run(self, case, b, redop, root) -> None:
        self.calls.append("run")


class _Buffers:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.out = self.expected = None

    def reset(self) -> None:
        self.calls.append("reset")


def test_checked_iterations_come_after_the_timed_ones(monkeypatch):
    """nccl-tests' -c N: the timed iterations run back to back as without -c (inputs were
    reset and the ranks re-synchronised before each timed one: -c changed what was timed);
    then N iterations from reset inputs are verified."""
    monkeypatch.setattr(timing, "count_wrong", lambda out, expected: 1)
    lib = _Lib()
    args = Namespace(redop="sum", root=0, warmup=2, iters=3, check=2)
    times, wrong = timing.measure(lib, make_case("allreduce", 64, "float32", 2),
                                  _Buffers(lib.calls), args)
    assert len(times) == 3 and wrong == 2
    assert lib.calls == ["barrier", "run", "run", "barrier", "run", "run", "run",
                         "reset", "barrier", "run", "reset", "barrier", "run"]
    lib.calls.clear()
    assert timing.measure(lib, make_case("allreduce", 64, "float32", 2), _Buffers(lib.calls),
                          Namespace(**{**vars(args), "check": 0}))[1] == 0
    assert "reset" not in lib.calls


@pytest.mark.timeout(120)
@pytest.mark.parametrize("action,says", [
    ("kill", "# stopped early: PeerFailure: rank 1"),
    ("hang", "(the bench's limit per collective is --timeout 3 s)")])
def test_a_sweep_that_ends_early_keeps_what_it_measured(tmp_path, action, says):
    """Rank 1 dies (or hangs) part way: the sizes measured before are on the screen and in
    --json (marked incomplete, with the command as typed), and the end says why (they all
    came at the end: a failure showed none of them)."""
    js = tmp_path / "r.json"
    # settle 50, then warm-up 2 + 4 timed + 1 checked (+ barriers) per size: #85 falls in
    # the 3rd or 4th size
    rc, out, err = _run([sys.executable, "-m", "ringreduce.bench", "-n", "2", "-b", "8", "-e",
                         "64K", "-f", "4", "-w", "2", "-i", "4", "--timeout", "3",
                         "--progress", "never", "--json", str(js)], 100,
                        {"RINGREDUCE_FAULT": f"rank=1,seq=85,action={action}"})
    assert rc != 0, out + err
    measured = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert 1 <= len(measured) < 7, out
    stopped = [ln for ln in out.splitlines() if ln.startswith("# stopped early: ")]
    assert len(stopped) == 1 and says in stopped[0], out + err
    assert "the rows above are complete" in stopped[0]
    data = json.loads(js.read_text())
    assert data["meta"]["incomplete"] and [r["size"] for r in data["results"]] == \
        [int(ln.split()[0]) for ln in measured]
    assert data["meta"]["command"].startswith("ringreduce-bench -n 2 -b 8 -e 64K")
    assert data["totals"]["out_of_bounds"] == 0 and data["totals"]["avg_busbw_gbps"] > 0
