"""Rank 0's table, printed as the sweep measures it: each size's line as soon as every
library has run it, as nccl-tests prints (the whole table came at the end: a failed or
interrupted sweep showed nothing of what it had measured; found by a helper). The lines are
report's; the skip lines, known only at the end, come before the summary."""

from __future__ import annotations

import sys
from typing import IO

from . import report
from .metrics import Row
from .progress import Progress


class LiveTable:
    def __init__(self, meta: dict, libs: list[str], earlier: list[Row],
                 bar: Progress | None = None, stream: IO[str] | None = None) -> None:
        """libs: the libraries measured in this sweep; earlier: rows measured before it
        (the mpirun job's), shown beside ringreduce's as they come."""
        self.meta, self.bar = meta, bar
        self.stream = stream or sys.stdout
        self.anchors = report.present_anchors(meta, set(libs) | {r.lib for r in earlier})
        self.rows: list[Row] = []  # this sweep's, as they come
        self.earlier = earlier
        self.by = {(r.lib, r.key, r.size): r for r in earlier}
        self.op: str | None = None
        self.started = False

    def _print(self, lines: list[str]) -> None:
        if not self.started:  # the header with the first lines: a run that ends at once
            self.started = True  # (an error before any size) prints only its error
            lines = report.header(self.meta, []) + lines
        if self.bar is not None:
            self.bar.close()  # off the terminal's line first; its next step redraws it
        self.stream.write("".join(line + "\n" for line in lines))
        self.stream.flush()

    def add(self, rows: list[Row]) -> None:
        """One case's rows, every library's: its line."""
        self.rows += rows
        lines = []
        for r in rows:
            self.by[(r.lib, r.key, r.size)] = r
        for r in rows:
            if r.lib != "ringreduce":
                continue
            if r.op != self.op:
                self.op = r.op
                lines += report.op_head(r.op, self.anchors)
            lines.append(report.row_line(r, self.by, self.anchors))
        if lines:
            self._print(lines)

    def all_rows(self) -> list[Row]:
        return self.rows + self.earlier

    def finish(self, skipped: list[dict], stopped: str | None = None) -> None:
        """The skip lines and the summary; `stopped`: why the sweep ended early."""
        rows = self.all_rows()
        lines = report.skip_lines(skipped, self.meta)
        if stopped:
            lines.append(f"# stopped early: {stopped}; " + (
                "the rows above are complete, the summary covers them only" if self.rows
                else "no size was finished"))
        self._print(lines + report.summary(rows, self.meta, self.anchors))
