"""Every ``RINGREDUCE_*`` knob, parsed and validated: :class:`Tunables`, built from the one
table that declares them (``csrc/core/tunables.def``, read here as ``_C.TUNABLES``: variable,
default, type and meaning of each); the seconds range every wait accepts.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

# --------------------------------------------------------------------------- tunables

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SIZE_SUFFIX = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
                "g": 1 << 30, "gib": 1 << 30}


def _bad(name: str, raw: str, allowed: str) -> ValueError:
    return ValueError(f"{name}={raw!r} is not valid; allowed: {allowed}. Fix or unset {name}")


def _seconds_range(allow_zero: bool) -> str:
    low = "0 <= seconds" if allow_zero else "0 < seconds"
    return f"{low} <= {MAX_WAIT_S:.0f} (one year; every wait needs a finite deadline)"


def check_seconds(what: str, value: Any, allow_zero: bool = False) -> float:
    """`value` as float seconds, or ValueError naming `what` and the accepted range
    (negative, NaN, infinite and above MAX_WAIT_S are refused)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}={value!r} is not a number of seconds; accepted: "
                         f"{_seconds_range(allow_zero)}") from None
    if not (v >= 0 if allow_zero else v > 0) or not v <= MAX_WAIT_S:
        raise ValueError(f"{what}={value!r} is out of range; accepted: "
                         f"{_seconds_range(allow_zero)}")
    return v


def _p_nonneg_seconds(name: str, raw: str) -> float:
    try:
        return check_seconds(name, float(raw), allow_zero=True)
    except ValueError:
        raise _bad(name, raw, f"a number of seconds >= 0 (0 disables); "
                   f"{_seconds_range(True)}") from None


def _p_seconds(name: str, raw: str) -> float:
    try:
        return check_seconds(name, float(raw))
    except ValueError:
        raise _bad(name, raw, f"a positive number of seconds, e.g. 600 or 2.5; "
                   f"{_seconds_range(False)}") from None


def _p_bytes(name: str, raw: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", raw.strip())
    if m is None or m.group(2).lower() not in _SIZE_SUFFIX:
        raise _bad(name, raw, "a whole number of bytes, optionally with K, M or G (x1024)")
    value = int(m.group(1)) * _SIZE_SUFFIX[m.group(2).lower()]
    if value >= 1 << 62:
        raise _bad(name, raw, "a number of bytes below 4 EiB (2^62)")
    return value


def _p_positive_bytes(name: str, raw: str) -> int:
    value = _p_bytes(name, raw)
    if value <= 0:
        raise _bad(name, raw, "a positive number of bytes, e.g. 524288 or 512K")
    return value


def _p_count(name: str, raw: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        v = -1
    if not 1 <= v < 1 << 31:
        raise ValueError(f"{name}={raw!r}: expected a whole number from 1 to 2^31 - 1")
    return v


def _p_str(name: str, raw: str) -> str:
    return raw


def _p_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise _bad(name, raw, "/".join(_TRUE + _FALSE) + " (case-insensitive)")


def _core() -> Any:
    """The C++ extension, without importing the ringreduce package (whose __init__ imports
    torch when it is installed): the launcher and tests load this package by path."""
    mod = sys.modules.get("ringreduce._C")
    if mod is not None:
        return mod
    pkg = Path(__file__).resolve().parent.parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = pkg / f"_C{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location("ringreduce._C", path)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            sys.modules["ringreduce._C"] = mod
            return mod
    return importlib.import_module("ringreduce._C")  # an installed copy, if any


_C = _core()
# The longest wait anything may ask for (one year: the core's kMaxWaitSeconds in
# csrc/core/deadline.h). Every wait has a deadline, so infinity is no value; beyond this
# the deadline arithmetic would overflow.
MAX_WAIT_S: float = _C.MAX_WAIT_SECONDS
# The collectives fault injection can name: the core's codes plus "any".
FAULT_COLLECTIVES = {"any": 0, **dict(_C.COLLECTIVE_CODES)}
_FAULT_FORMAT = ("rank=R[,collective=any|" + "|".join(list(FAULT_COLLECTIVES)[1:]) + "]"
                 "[,seq=N][,at=begin|mid|end][,action=kill|stop|exit|hang][,stamp=PATH]")


def _p_fault(name: str, raw: str) -> dict:
    """RINGREDUCE_FAULT (tests only): rank R injects a fault at a point of a collective."""
    spec = {"rank": None, "collective": "any", "seq": "1", "at": "mid", "action": "kill",
            "stamp": ""}
    for part in raw.split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in spec:
            raise _bad(name, raw, _FAULT_FORMAT)
        spec[key] = value.strip()
    ok = (spec["rank"] is not None and spec["rank"].isdigit() and spec["seq"].isdigit()
          and int(spec["seq"]) >= 1 and spec["collective"] in FAULT_COLLECTIVES
          and spec["at"] in ("begin", "mid", "end")
          and spec["action"] in ("kill", "stop", "exit", "hang"))
    if not ok:
        raise _bad(name, raw, _FAULT_FORMAT)
    spec["rank"], spec["seq"] = int(spec["rank"]), int(spec["seq"])
    return spec


def _p_choice(*choices: str, upper: bool = False) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().upper() if upper else raw.strip().lower()
        if value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            raise _bad(name, raw, f"{shown} (case-insensitive)")
        return value

    return parse


def _p_half_wire(name: str, raw: str) -> int:
    if raw.strip() not in ("16", "32"):
        raise _bad(name, raw, "16 (16-bit partial sums on the wire) or 32 (float32 partials)")
    return int(raw.strip())


# Parsers by the names csrc/core/tunables.def gives them.
_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "seconds": _p_seconds, "seconds0": _p_nonneg_seconds, "bytes": _p_positive_bytes,
    "bytes_opt": _p_bytes, "count": _p_count, "bool": _p_bool, "str": _p_str,
    "secret": _p_str, "half_wire": _p_half_wire, "fault": _p_fault,
}


def _choices(shown: str) -> tuple[str, ...]:
    """"auto | tcp | shm" -> ("auto", "tcp", "shm"); '' is written as two quotes."""
    return tuple(c.strip().strip("'") for c in shown.split("|"))


def _field(row: Mapping[str, Any]) -> tuple[str, Any, Any]:
    """One dataclass field of Tunables from one row of the table."""
    kind = row["parse"]
    if kind in ("choice", "choice_upper"):
        parse = _p_choice(*_choices(row["shown"]), upper=kind == "choice_upper")
    elif kind in _PARSERS:
        parse = _PARSERS[kind]
    else:  # pragma: no cover - the table and this module are built together
        raise RuntimeError(f"{row['env']}: unknown parser {kind!r} in csrc/core/tunables.def")
    default = row["default"]
    if not row["core"] and default is not None:  # Python's rows give the variable's text
        default = parse(row["env"], default)
    meta = {"env": row["env"], "parse": parse, "doc": row["doc"], "core": row["core"],
            "kind": _FAULT_FORMAT if kind == "fault" else row["shown"]}
    return (row["name"], Any, dataclasses.field(default=default, metadata=meta,
                                                 repr=kind != "secret"))


Tunables = dataclasses.make_dataclass("Tunables", [_field(row) for row in _C.TUNABLES])
Tunables.__module__ = __name__
Tunables.__doc__ = """Every RINGREDUCE_* knob (plus torchrun's agent-store flag), parsed and
validated: one field per row of csrc/core/tunables.def (its variable, default, type and
meaning); :func:`tunables` reads them and :func:`describe_tunables` lists them."""


def core_options(t: Any) -> dict[str, Any]:
    """The values the C++ core reads (the table's core rows), keyed as it expects them;
    unset ones (None) are left to the core's defaults."""
    return {f.name: getattr(t, f.name) for f in dataclasses.fields(t)
            if f.metadata["core"] and getattr(t, f.name) is not None}


def tunables(env: Mapping[str, str] | None = None) -> Tunables:
    """Read every tunable from ``env`` (default ``os.environ``).

    Unset variables (and empty ones) take their defaults. Raises ValueError naming the
    variable, the bad value and what is allowed.
    """
    env = os.environ if env is None else env
    _warn_unknown(env)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Tunables):
        raw = _given(f, env)
        if raw is not None:
            values[f.name] = f.metadata["parse"](f.metadata["env"], raw)
    return _cross_check(Tunables(**values))


def store_tunables(env: Mapping[str, str] | None = None) -> Tunables:
    """Tunables with only what reaching the store needs read (RINGREDUCE_CONNECT_TIMEOUT,
    TORCHELASTIC_USE_AGENT_STORE) -- defaults when those are what is wrong: for a rank that
    refused its other settings to tell the others so (ringreduce.api)."""
    env = os.environ if env is None else env
    keep = ("RINGREDUCE_CONNECT_TIMEOUT", "TORCHELASTIC_USE_AGENT_STORE")
    try:
        return tunables({k: env[k] for k in keep if k in env})
    except ValueError:
        return Tunables()


# RINGREDUCE_* names that are no setting of a running job: the build's (setup.py), the
# launcher's hand-over to its ranks, the test suite's.
_OTHER_NAMES = frozenset({
    "RINGREDUCE_CUDA", "RINGREDUCE_CUDA_ARCH_LIST", "RINGREDUCE_BUILD_JOBS",
    "RINGREDUCE_WERROR", "RINGREDUCE_SANITIZE", "RINGREDUCE_TEST_CUDA_BUILD",
    "RINGREDUCE_RUN_PEER_FAILURES", "RINGREDUCE_FUZZ_SECONDS", "RINGREDUCE_FUZZ_SEED",
    "RINGREDUCE_ISA"})
_WARNED: set = set()


def _warn_unknown(env: Mapping[str, str]) -> None:
    """Warn once per name about a RINGREDUCE_* variable nothing reads -- a misspelt
    RINGREDUCE_TIMEOUTS=2 left the 600 s default in force without a word (found by a
    helper) -- naming the closest setting."""
    import difflib
    import logging

    known = {f.metadata["env"] for f in dataclasses.fields(Tunables)} | _OTHER_NAMES
    for name in sorted(k for k in env if k.startswith("RINGREDUCE_") and k not in known):
        if name in _WARNED:
            continue
        _WARNED.add(name)
        tail = len("RINGREDUCE_")  # compared without the prefix every name shares
        names = sorted(k[tail:] for k in known)
        # A close spelling, else the one setting it abbreviates (RINGREDUCE_SEGMENT)
        begun = [k[tail:] for k in known - _OTHER_NAMES if name[tail:] and k[tail:].startswith(
            name[tail:])]
        close = difflib.get_close_matches(name[tail:], names, n=1, cutoff=0.75) or \
            (begun if len(begun) == 1 else [])
        logging.getLogger("ringreduce").warning(
            "%s is not a ringreduce setting and is ignored%s (ringreduce-run --help lists "
            "them)", name, f"; did you mean RINGREDUCE_{close[0]}?" if close else "")


def _given(f: dataclasses.Field, env: Mapping[str, str]) -> str | None:
    """The raw value the environment gives tunable field `f`; None: unset or empty."""
    raw = env.get(f.metadata["env"])
    return None if raw is None or raw.strip() == "" else raw


def is_set(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment gives tunable `name` (a Tunables field) a value: a default
    passed down by a framework (torch's process-group timeout) must not override it."""
    f = next(f for f in dataclasses.fields(Tunables) if f.name == name)
    return _given(f, os.environ if env is None else env) is not None


def _cross_check(t: Any) -> Any:
    """Values fine alone but not together, or outside what the core accepts."""
    default = {f.name: f.default for f in dataclasses.fields(Tunables)}
    if not 64 <= t.segment_bytes <= 1 << 30:  # 100G: std::bad_alloc at the first ring step
        raise ValueError(f"RINGREDUCE_SEGMENT_BYTES={t.segment_bytes}: expected 64 bytes to "
                         f"1G (the default is {default['segment_bytes'] / 1024:g}K)")
    if t.heartbeat_interval < 0.01:  # 1e-9 made an idle rank burn a quarter of a core
        raise ValueError(f"RINGREDUCE_HEARTBEAT_INTERVAL={t.heartbeat_interval:g}: expected "
                         f"at least 0.01 seconds (the default is "
                         f"{default['heartbeat_interval']:g}; a peer is declared silent only "
                         f"after RINGREDUCE_HEARTBEAT_TIMEOUT anyway)")
    if t.heartbeat_timeout > 0 and t.heartbeat_interval >= t.heartbeat_timeout:
        raise ValueError(
            f"RINGREDUCE_HEARTBEAT_INTERVAL={t.heartbeat_interval:g} must be shorter than "
            f"RINGREDUCE_HEARTBEAT_TIMEOUT={t.heartbeat_timeout:g} (a peer is declared silent "
            f"after the timeout, so heartbeats must come more often; e.g. at most a quarter "
            f"of it), or set RINGREDUCE_HEARTBEAT_TIMEOUT=0 to turn the check off")
    if t.algo == "shm" and t.transport == "tcp":  # refused at the first all-reduce, as algo=
        raise ValueError("RINGREDUCE_ALGO=shm needs shared memory, which "
                         "RINGREDUCE_TRANSPORT=tcp turns off: unset one of them")
    return t


# Knobs every rank of a job must set alike: they shape what goes on the wire (segment
# size, half-precision partials), which algorithm runs, or how ranks connect. Init compares
# them (ringreduce._rendezvous) and names the variable; before, a difference surfaced as a
# "frame size mismatch" or "pass the same algo=" that blamed the program (found by a helper).
# The heartbeat pair too: one rank's interval above another's timeout made a live rank
# "stop responding" (each rank checks only its own pair). CMA: a scatter's or broadcast's
# root decides for all its receivers, so one rank's 0 did not keep it from reading in place.
JOB_WIDE = ("transport", "algo", "segment_bytes", "half_wire", "tree_threshold_bytes",
            "full_mesh_max", "group_links", "heartbeat_interval", "heartbeat_timeout",
            "checksum", "cma")
# The cost model's fit (RINGREDUCE_TUNING_FILE): ranks that read different files -- or one
# that found none -- planned different algorithms ("algorithm mismatch ... pass the same
# algo=", which blamed the program; a helper).
TUNING_FIT = ("alpha_us", "beta_ns_per_byte")


def job_wide(t: Any, options: Mapping[str, Any]) -> str:
    """This rank's job-wide settings as one line ("RINGREDUCE_X=v;..."): the parsed values
    (512K and 524288 agree; booleans as 1 and 0), the core's where init's arguments or the
    tuning file set them."""
    env = {f.name: f.metadata["env"] for f in dataclasses.fields(t)}
    shown = [(env[k], options.get(k, getattr(t, k))) for k in JOB_WIDE]
    threshold = options.get("tree_threshold_bytes", t.tree_threshold_bytes)
    if t.algo == "auto" and (threshold is None or threshold < 0):  # else the fit is unused
        shown += [(f"RINGREDUCE_TUNING_FILE's {k}", options.get(k, "built-in"))
                  for k in TUNING_FIT]
    return ";".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in shown)


def describe_tunables() -> str:
    """One paragraph per environment variable, for --help texts and docs."""
    lines = []
    for f in dataclasses.fields(Tunables):
        default = "unset" if f.default is None else repr(f.default)
        lines.append(f"  {f.metadata['env']} ({f.metadata['kind']}; default {default})")
        lines.append(f"      {f.metadata['doc']}")
    return "\n".join(lines)
