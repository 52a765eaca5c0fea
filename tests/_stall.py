"""Shared check: a rank that arrives late makes every waiting rank's stall report name it
and the line of its last call (tests/test_backend_native.py, tests/test_fastcall.py)."""

from __future__ import annotations

import re
from typing import Any

from _spawn import run_world_raw

FAST_HB = {"RINGREDUCE_HEARTBEAT_TIMEOUT": "1", "RINGREDUCE_HEARTBEAT_INTERVAL": "0.25"}


def late_rank_reports(target: str, init: bool, ok: Any) -> None:
    """Run `target(rank, world, late=2, sleep_s=3.0)` on 3 ranks with a 1 s stall warning;
    `ok(value)` judges each rank's result; ranks 0 and 1 must report rank 2 idle after its
    last collective, called from the worker file's line."""
    outs = run_world_raw(3, target, 2, 3.0, timeout=60, init=init,
                         env={"RINGREDUCE_STALL_WARN": "1", **FAST_HB})
    story = "\n".join(o.describe() for o in outs)
    assert all(o.ok and ok(o.value) for o in outs), story
    src = re.escape(target.split(":")[0] + ".py")
    for o in outs[:2]:
        stall = [ln for ln in o.stderr.splitlines() if "stall:" in ln]
        assert stall, f"rank {o.rank}: no stall report\n{story}"
        assert re.search(rf"rank 2 \(.*\) is idle after collective #\d+; last call site "
                         rf"{src}:\d+", stall[0]), stall[0]
        assert re.search(rf"called from {src}:", stall[0]), stall[0]
