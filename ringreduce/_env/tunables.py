"""Every ``RINGREDUCE_*`` knob, each declared exactly once in :class:`Tunables` with its
variable name, default, type and meaning; the seconds range every wait accepts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

# --------------------------------------------------------------------------- tunables

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SIZE_SUFFIX = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
                "g": 1 << 30, "gib": 1 << 30}


def _bad(name: str, raw: str, allowed: str) -> ValueError:
    return ValueError(f"{name}={raw!r} is not valid; allowed: {allowed}. Fix or unset {name}")


# The longest wait anything may ask for (one year; the C++ core's kMaxWaitSeconds in
# csrc/core/deadline.h is the same number). Every wait has a deadline, so infinity is no
# value; beyond this the deadline arithmetic would overflow.
MAX_WAIT_S = 366 * 24 * 3600.0


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
    return int(m.group(1)) * _SIZE_SUFFIX[m.group(2).lower()]


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
    if v < 1:
        raise ValueError(f"{name}={raw!r}: expected a whole number >= 1")
    return v


def _p_str(name: str, raw: str) -> str:
    return raw


def _p_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise _bad(name, raw, "/".join(_TRUE + _FALSE) + " (case-insensitive)")


# Equal to _C.COLLECTIVE_CODES plus "any" (tests/test_env.py checks; this package must load
# without the extension, so it cannot read them from there).
FAULT_COLLECTIVES = {"any": 0, "allreduce": 1, "broadcast": 2, "barrier": 3, "allgather": 4,
                     "reduce_scatter": 5, "reduce": 6, "gather": 7, "scatter": 8,
                     "all_to_all": 9}
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


def _knob(env: str, default: Any, parse: Callable[[str, str], Any], kind: str, doc: str,
          empty_is_default: bool = True, **kw: Any) -> Any:
    """Declare one tunable: its variable, default, parser, type for --help, and meaning."""
    meta = {"env": env, "parse": parse, "kind": kind, "doc": doc, "empty": empty_is_default}
    return field(default=default, metadata=meta, **kw)


@dataclass
class Tunables:
    """Every RINGREDUCE_* knob (plus torchrun's agent-store flag), parsed and validated.

    Each field is declared once below with its environment variable, default, type and
    meaning; :func:`tunables` reads them and :func:`describe_tunables` lists them.
    """

    timeout: float = _knob(
        "RINGREDUCE_TIMEOUT", 600.0, _p_seconds, "seconds",
        "How long one collective may wait for a peer before raising TimeoutError.")
    connect_timeout: float = _knob(
        "RINGREDUCE_CONNECT_TIMEOUT", 120.0, _p_seconds, "seconds",
        "How long init may take to rendezvous and connect to every peer.")
    socket_ifname: str | None = _knob(
        "RINGREDUCE_SOCKET_IFNAME", None, _p_str, "interface name",
        "Network interface to listen on (e.g. eth0); default: the one routing to "
        "MASTER_ADDR.")
    secret: str | None = _knob(
        "RINGREDUCE_SECRET", None, _p_str, "string",
        "Shared secret authenticating peer connections; default: a random one exchanged "
        "through the store (ringreduce-run sets a fresh one per job).", repr=False)
    debug: str = _knob(
        "RINGREDUCE_DEBUG", "", _p_choice("", "WARN", "INFO", "DEBUG", "TRACE", upper=True),
        "'' | WARN | INFO | DEBUG | TRACE", "Log level of the library ('' = errors only).",
        empty_is_default=False)
    transport: str = _knob(
        "RINGREDUCE_TRANSPORT", "auto", _p_choice("auto", "tcp", "shm"), "auto | tcp | shm",
        "Force one transport; auto uses shared memory within a host and TCP across hosts.")
    algo: str = _knob(
        "RINGREDUCE_ALGO", "auto", _p_choice("auto", "ring", "tree", "shm"), "auto | ring | tree | shm",
        "Force the all-reduce algorithm; auto lets the cost model pick per message size.")
    segment_bytes: int = _knob(
        "RINGREDUCE_SEGMENT_BYTES", 512 * 1024, _p_positive_bytes, "bytes",
        "Pipelining unit for large messages (accepts K/M/G suffixes).")
    half_wire: int = _knob(
        "RINGREDUCE_HALF_WIRE", 16, _p_half_wire, "16 | 32",
        "Bits per float16/bfloat16 partial sum sent over TCP. 16: half the bytes, each hop "
        "adds in float32 and rounds to 16 bits; 32: float32 partials, rounded once at the "
        "end. Must be the same on every rank.")
    tree_threshold_bytes: int | None = _knob(
        "RINGREDUCE_TREE_THRESHOLD_BYTES", None, _p_bytes, "bytes",
        "All-reduces up to this size use the tree, larger ones the ring; overrides the cost "
        "model.")
    tuning_file: str | None = _knob(
        "RINGREDUCE_TUNING_FILE", None, _p_str, "path",
        "JSON file with measured cost-model constants (alpha, beta) for this machine.")
    trace: str | None = _knob(
        "RINGREDUCE_TRACE", None, _p_str, "path",
        "Where to write a trace of this rank's collectives (for debugging).")
    heartbeat_interval: float = _knob(
        "RINGREDUCE_HEARTBEAT_INTERVAL", 0.5, _p_seconds, "seconds",
        "How often each rank sends a UDP heartbeat to each peer it watches.")
    full_mesh_max: int = _knob(
        "RINGREDUCE_FULL_MESH_MAX", 16, _p_count, "ranks",
        "Jobs (and groups) of up to this many ranks connect every pair at init and heartbeat "
        "every peer; larger ones connect and watch only ranks r +- 2^k (O(log n) peers) and "
        "make other connections on first use.")
    heartbeat_timeout: float = _knob(
        "RINGREDUCE_HEARTBEAT_TIMEOUT", 4.0, _p_nonneg_seconds, "seconds",
        "A peer silent this long is reported as frozen, partitioned or dead (0 disables).")
    stall_warn: float = _knob(
        "RINGREDUCE_STALL_WARN", 10.0, _p_nonneg_seconds, "seconds",
        "After waiting this long in one collective, log which ranks are behind (0 = off).")
    flight_recorder: str | None = _knob(
        "RINGREDUCE_FLIGHT_RECORDER", None, _p_str, "path",
        "On failure each rank writes its last 64 collectives to PATH.rank<r>.json.")
    checksum: bool = _knob(
        "RINGREDUCE_CHECKSUM", False, _p_bool, "bool",
        "Checksum every message to catch corruption (slower; for debugging).")
    call_sites: bool = _knob(
        "RINGREDUCE_CALL_SITES", True, _p_bool, "bool",
        "Remember which line of the program issued each collective, for stall reports, "
        "errors and the flight recorder.")
    fault: dict | None = _knob(  # noqa: RUF009 - default None
        "RINGREDUCE_FAULT", None, _p_fault, _FAULT_FORMAT,
        "Fault injection for testing failure handling: rank R kills (SIGKILL), stops "
        "(SIGSTOP), exits or hangs itself at the begin, middle (first wait for a peer) or "
        "end of its first matching collective with sequence number >= N; PATH receives the "
        "time of the fault.")
    use_agent_store: bool = _knob(
        "TORCHELASTIC_USE_AGENT_STORE", False, _p_bool, "bool",
        "Set by torchrun: connect to the launcher's TCPStore instead of hosting one on "
        "rank 0.")


def tunables(env: Mapping[str, str] | None = None) -> Tunables:
    """Read every tunable from ``env`` (default ``os.environ``).

    Unset variables (and empty ones, except RINGREDUCE_DEBUG where '' means errors only) take
    their defaults. Raises ValueError naming the variable, the bad value and what is allowed.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Tunables):
        raw = env.get(f.metadata["env"])
        if raw is None or (raw.strip() == "" and f.metadata["empty"]):
            continue
        values[f.name] = f.metadata["parse"](f.metadata["env"], raw)
    return Tunables(**values)


def describe_tunables() -> str:
    """One paragraph per environment variable, for --help texts and docs."""
    lines = []
    for f in dataclasses.fields(Tunables):
        default = "unset" if f.default is None else repr(f.default)
        lines.append(f"  {f.metadata['env']} ({f.metadata['kind']}; default {default})")
        lines.append(f"      {f.metadata['doc']}")
    return "\n".join(lines)
