"""Deadlines on the time this process ran, not on the wall clock.

A process stopped by SIGSTOP, a suspended job (SLURM suspend, docker pause) or a debugger
finds every wall-clock deadline passed the moment it resumes -- though the peer or store it
was waiting for may answer within milliseconds. The C++ core's heartbeat clock leaves such
pauses out (transport::livenessNs); these are the Python side's: a thread that looks at the
clock often (every 0.1 s or so) counts a gap between two looks longer than LATE_S as a pause.
"""

from __future__ import annotations

import time

# A gap between two looks at the clock longer than LATE_S counts as LATE_S (the rest as
# paused), as the C++ heartbeat clock counts a late run: the core's transport::kLateNs.
from ._C import LATE_S


class Pauses:
    """The time this process did not run, as one thread looking at the clock often sees it:
    a gap between two looks longer than LATE_S -- the process was stopped (SIGSTOP, a
    suspended job, a debugger) -- counts as LATE_S, the rest as paused."""

    def __init__(self) -> None:
        self.total = 0.0
        self._last = time.monotonic()

    def look(self) -> None:
        now = time.monotonic()
        if now - self._last > LATE_S:
            self.total += now - self._last - LATE_S
        self._last = now

    def since_look(self) -> float:
        """Seconds since the last look: long, and a pause may not be counted yet."""
        return time.monotonic() - self._last


class Awake:
    """A deadline on the time this process ran (found by a helper: a job paused during
    destroy() woke with every farewell deadline passed at once, so rank 0 closed the store
    under a rank still on its way, and the main thread left its farewell thread inside a
    store call at exit: std::terminate). Its own looks detect pauses -- or, given `pauses`,
    another thread's do: the farewell thread's looks are store calls, which may block for
    long without any pause, so _talk_until's waiting thread looks for both, and the talk's
    deadline and the wait's margin run on one clock."""

    def __init__(self, secs: float, pauses: Pauses | None = None):
        self.secs = secs
        self._own = pauses is None
        self._pauses = Pauses() if pauses is None else pauses
        self._start = time.monotonic()
        self._paused0 = self._pauses.total

    def left(self) -> float:
        if self._own:
            self._pauses.look()
        ran = time.monotonic() - self._start - (self._pauses.total - self._paused0)
        return self.secs - ran

    def expired(self) -> bool:
        return self.left() <= 0

    def unseen(self, secs: float) -> bool:
        """True when another thread looks for this deadline's pauses and has not looked for
        `secs`: right after a SIGCONT this thread may run first, when the deadline looks
        passed though the process was stopped."""
        return not self._own and self._pauses.since_look() > secs

    def at_least(self, secs: float) -> Awake:
        return Awake(max(self.left(), secs), None if self._own else self._pauses)

    def at_most(self, secs: float) -> Awake:
        return Awake(min(self.left(), secs), None if self._own else self._pauses)
