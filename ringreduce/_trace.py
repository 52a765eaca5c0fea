"""Chrome-trace (Perfetto) timelines of every collective, per rank (RINGREDUCE_TRACE).

RINGREDUCE_TRACE=trace.json makes each rank record its collectives (start, end, bytes,
algorithm, sequence number) in the C++ core; at destroy() (or process exit) rank r writes
``trace.rank{r}.json`` -- or the path itself when it contains ``{rank}`` or the job has one
rank. Open the files in https://ui.perfetto.dev or chrome://tracing; ``merge()`` combines
them into one timeline with a row per rank. Labels given with ``label()`` (the DDP wrapper
names its buckets this way) are drawn as instant events on a second row; each group and
point-to-point channel the rank belonged to gets a row of its own (named after it), kept
when it is destroyed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

_LABELS: list = []  # (wall-clock us, text) recorded by label()
_KEPT: list = []  # (name, events) of this rank's destroyed groups and channels, by keep()
_LOCK = threading.Lock()
_MAX_LABELS = 1 << 20


def trace_path(pattern: str, rank: int, world: int) -> str:
    if "{rank}" in pattern:
        return pattern.replace("{rank}", str(rank))
    if world == 1:
        return pattern
    root, ext = os.path.splitext(pattern)
    return f"{root}.rank{rank}{ext or '.json'}"


def check_writable(tun: Any, rank: int, world: int) -> None:
    """RINGREDUCE_TRACE's and RINGREDUCE_FLIGHT_RECORDER's files can be written by this rank:
    checked at init, not when the job ends or fails -- then a folder this rank cannot write,
    or make, lost the diagnostics exactly when they were wanted (a helper). A folder that
    does not exist yet is made when the file is written (the program may make it later)."""
    for var, pattern, path in (
            ("RINGREDUCE_TRACE", tun.trace, tun.trace and trace_path(tun.trace, rank, world)),
            # (its files: this prefix + the core's ".rank<r>[.<group>].json")
            ("RINGREDUCE_FLIGHT_RECORDER", tun.flight_recorder, tun.flight_recorder)):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(folder):  # the nearest existing folder is where it is made
            folder = os.path.dirname(folder)
        if not (os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)):
            raise ValueError(
                f"{var}={pattern!r}: rank {rank} cannot write {path} ({folder} is "
                f"{'not writable' if os.path.isdir(folder) else 'not a folder'}); point "
                f"{var} to a folder every rank can write")


def label(text: str) -> None:
    """Mark the moment something happened (e.g. "bucket 3 ready") in this rank's trace."""
    with _LOCK:
        if len(_LABELS) < _MAX_LABELS:
            _LABELS.append((int(time.time() * 1e6), str(text)))


def keep(name: str, events: list[dict]) -> None:
    """Keep a group's (or channel's) events, taken just before it is destroyed, for this
    rank's trace file."""
    with _LOCK:
        if sum(len(e) for _, e in _KEPT) + len(events) <= _MAX_LABELS:
            _KEPT.append((name, events))


def _row(out: list, rank: int, tid: int, name: str) -> None:
    out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}})


def to_chrome(events: Iterable[dict], rank: int, labels: Iterable[tuple] = (),
              groups: Iterable[tuple] = ()) -> dict:
    """Chrome trace JSON object for one rank's core events (the world's), labels and
    groups ((name, events) each, a row per group)."""
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}]
    _row(out, rank, 0, "collectives")
    _row(out, rank, 1, "labels")
    rows = [(0, events)]
    for tid, (name, evs) in enumerate(groups, start=2):
        _row(out, rank, tid, name)
        rows.append((tid, evs))
    for tid, evs in rows:
        for e in evs:
            end = e["end_us"] or e["start_us"]
            out.append({
                "name": f"{e['collective']} #{e['seq']}", "cat": e["algo"], "ph": "X",
                "ts": e["start_us"], "dur": max(0, end - e["start_us"]), "pid": rank,
                "tid": tid, "args": {k: e[k] for k in ("seq", "algo", "dtype", "op", "root",
                                                       "count", "bytes", "ok")},
            })
    for ts, text in labels:
        out.append({"name": text, "ph": "i", "s": "t", "ts": ts, "pid": rank, "tid": 1})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write(comm: Any, pattern: str, rank: int, world: int) -> str | None:
    """Write this rank's trace file; returns its path."""
    with _LOCK:
        labels, groups = list(_LABELS), list(_KEPT)
        _LABELS.clear()
        _KEPT.clear()
    path = trace_path(pattern, rank, world)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = to_chrome(comm.trace_events() if comm is not None else [], rank, labels, groups)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def merge(paths: Iterable[str], out: str) -> str:
    """Combine per-rank trace files into one (rows stay separated by rank)."""
    events: list = []
    for p in paths:
        with open(p) as f:
            events.extend(json.load(f)["traceEvents"])
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return out
