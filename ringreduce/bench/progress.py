"""A plain-text progress bar on stderr (rank 0 only), shown once a sweep has run for a few
seconds. Work is weighted by bytes moved plus a per-size constant, so the estimate of what
is left does not treat a 64 MiB step like an 8-byte one."""

from __future__ import annotations

import sys
import time
from typing import IO

_LATENCY_BYTES = 64 * 1024  # what one tiny step costs, in bytes-equivalent
_COLS = 120  # every line is cut or padded to this, and close() blanks as many: no residue


def weight(size: int) -> float:
    return float(size + _LATENCY_BYTES)


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    def __init__(self, total: float, enabled: bool, stream: IO[str] | None = None,
                 delay: float = 2.0, width: int = 28) -> None:
        self.total = max(total, 1.0)
        self.done = 0.0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.delay, self.width = delay, width
        self.start = time.monotonic()
        self.shown = False

    def step(self, amount: float, label: str = "") -> None:
        self.done = min(self.total, self.done + amount)
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        if elapsed < self.delay:
            return
        frac = self.done / self.total
        fill = int(frac * self.width)
        left = elapsed / frac - elapsed if frac > 0 else 0.0
        line = (f"\r[{'#' * fill}{'.' * (self.width - fill)}] {frac * 100:5.1f}%  "
                f"{_clock(elapsed)} elapsed, ~{_clock(left)} left  {label}")
        self.stream.write(line[:_COLS + 1].ljust(_COLS + 1))  # + the leading \r
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * _COLS + "\r")
            self.stream.flush()
            self.shown = False


def wanted(mode: str, stream: IO[str] | None = None) -> bool:
    """--progress auto|always|never: auto shows the bar only on a terminal."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    s = stream or sys.stderr
    return bool(getattr(s, "isatty", lambda: False)())
