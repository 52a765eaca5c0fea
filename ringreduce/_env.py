"""The one module that reads the environment.

Everything ringreduce learns from environment variables comes through here:

* :func:`detect_launch` -- rank / world size / local rank and the rendezvous address, from
  torchrun (and ``ringreduce-run``), Open MPI, SLURM or MPICH/Hydra PMI variables;
* :func:`tunables` -- every ``RINGREDUCE_*`` knob, each declared exactly once in
  :class:`Tunables` with its variable name, default, type and meaning;
* :func:`select_interface_address` and :func:`host_identity` -- what this process tells its
  peers through the rendezvous store.

This module imports nothing from the rest of the package (so the launcher and tests can use
it before the C++ extension is built) and nothing outside the standard library.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = [
    "LaunchInfo",
    "Tunables",
    "describe_tunables",
    "detect_launch",
    "expand_hostlist",
    "host_identity",
    "select_interface_address",
    "tunables",
]

# --------------------------------------------------------------------------- launch detection


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, as the launcher described it.

    ``source`` names the launcher the values came from: ``"torchrun"`` (also set by
    ``ringreduce-run``), ``"explicit"`` (RANK/WORLD_SIZE set by hand), ``"openmpi"``,
    ``"slurm"``, ``"pmi"`` (MPICH/Intel MPI Hydra) or ``"default"`` (a single process).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    source: str


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """``int(env[name])`` with an error that names the variable; ``default`` if unset."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ValueError(f"{name} is not set; set it to a whole number, or launch with "
                             "torchrun / ringreduce-run, which set it for you")
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set {name} to a whole number "
                         "(it is normally set by the launcher: check the launch command)"
                         ) from None


def _check_range(rank_name: str, rank: int, size_name: str, size: int) -> None:
    if size < 1:
        raise ValueError(f"{size_name}={size}: {size_name} must be at least 1; check the "
                         "launch command")
    if not 0 <= rank < size:
        raise ValueError(f"{rank_name}={rank} but {size_name}={size}: {rank_name} must be in "
                         f"[0, {size_name}); check the launch command or the variables "
                         "exported to this process")


def _master(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    addr = env.get("MASTER_ADDR", "").strip() or None
    port: int | None = None
    if env.get("MASTER_PORT", "").strip():
        port = _env_int(env, "MASTER_PORT")
        if not 0 < port < 65536:
            raise ValueError(f"MASTER_PORT={port} is not a TCP port; set MASTER_PORT to a "
                             "free port in 1..65535")
    return addr, port


def _parse_tasks_per_node(value: str) -> list[int]:
    """Expand SLURM's compressed per-node task counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ValueError(f"cannot parse {part!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def expand_hostlist(hostlist: str) -> Iterator[str]:
    """Yield the hosts of a SLURM hostlist, lazily, in order.

    ``"node[01-03,07],gpu5"`` yields node01, node02, node03, node07, gpu5. Several bracket
    groups in one name expand as a product (``"r[1-2]n[1-2]"`` -> r1n1, r1n2, r2n1, r2n2) and
    zero padding follows the lower bound, as in ``scontrol show hostnames``.
    Raises ValueError on unbalanced brackets or bad ranges.
    """
    for item in _split_top_level(hostlist):
        # re.split with one group alternates: literal, bracket body, literal, ...
        pieces = re.split(r"\[([^\[\]]*)\]", item)
        parts: list[list[tuple[str, int]]] = []  # per piece: (first, last) ranges
        for i, piece in enumerate(pieces):
            if i % 2 == 1:
                parts.append(_parse_ranges(piece, hostlist))
            elif "[" in piece or "]" in piece:
                raise ValueError(f"unbalanced brackets in hostlist {hostlist!r}")
            elif piece:
                parts.append([(piece, -1)])
        yield from _product(parts, "")


def _product(parts: list[list[tuple[str, int]]], prefix: str) -> Iterator[str]:
    # Like itertools.product, but without materialising the ranges, so the first host of
    # "n[0000000-9999999]" costs nothing.
    if not parts:
        yield prefix
        return
    for first, last in parts[0]:
        if last < 0:  # a literal
            yield from _product(parts[1:], prefix + first)
            continue
        for n in range(int(first), last + 1):
            yield from _product(parts[1:], prefix + str(n).zfill(len(first)))


def _split_top_level(hostlist: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(hostlist):
        depth += (ch == "[") - (ch == "]")
        if depth < 0 or depth > 1:
            raise ValueError(f"unbalanced brackets in hostlist {hostlist!r}")
        if ch == "," and depth == 0:
            if hostlist[start:i].strip():
                yield hostlist[start:i].strip()
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced brackets in hostlist {hostlist!r}")
    if hostlist[start:].strip():
        yield hostlist[start:].strip()


def _parse_ranges(body: str, hostlist: str) -> list[tuple[str, int]]:
    """``"01-03,7"`` -> ``[("01", 3), ("7", 7)]``: the first number as written (its width is
    the zero padding) and the last as an int."""
    out: list[tuple[str, int]] = []
    for rng in body.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", rng)
        if m is None or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ValueError(f"bad range {rng!r} in hostlist {hostlist!r}")
        out.append((m.group(1), int(m.group(2) or m.group(1))))
    return out


def _slurm_master_addr(env: Mapping[str, str]) -> str | None:
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name, "").strip():
            try:
                return next(expand_hostlist(env[name]), None)
            except ValueError as e:
                raise ValueError(f"{name}={env[name]!r}: {e}; set MASTER_ADDR to the host of "
                                 "rank 0 instead") from None
    return None


def _slurm_master_port(env: Mapping[str, str]) -> int | None:
    # Every task of a step sees the same job and step ids, so all agree on this port without
    # talking; MASTER_PORT overrides it when it collides with something.
    if not env.get("SLURM_JOB_ID", "").strip().isdigit():
        return None
    job = int(env["SLURM_JOB_ID"])
    step = int(env["SLURM_STEP_ID"]) if env.get("SLURM_STEP_ID", "").isdigit() else 0
    return 20000 + (job * 7 + step) % 20000


def _slurm_local_world_size(env: Mapping[str, str], local_rank: int,
                            world: int) -> tuple[str, int]:
    """(variable it came from, number of tasks of this step on this node)."""
    node = _env_int(env, "SLURM_NODEID", 0)
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        if env.get(name, "").strip():
            try:
                counts = _parse_tasks_per_node(env[name])
            except ValueError as e:
                raise ValueError(f"{name}={env[name]!r}: {e}; expected a form like '4', "
                                 "'4,2' or '2(x3),1'") from None
            return name, counts[node] if node < len(counts) else counts[-1]
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or ""
    if nodes.strip() == "1":
        return "SLURM_NTASKS", world
    # Unknown: the smallest size consistent with our local rank.
    return "SLURM_LOCALID+1", local_rank + 1


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Work out rank, world size and local placement from the launcher's variables.

    Precedence (first match wins): torchrun-style ``RANK``/``WORLD_SIZE`` (with
    ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), Open MPI ``OMPI_COMM_WORLD_*``, SLURM
    ``SLURM_PROCID``/``SLURM_NTASKS``, MPICH/Hydra ``PMI_RANK``/``PMI_SIZE``; otherwise a
    single process (rank 0 of 1). ``MASTER_ADDR``/``MASTER_PORT`` are always taken from the
    environment when present; under SLURM they default to the first host of the step's node
    list and a port derived from the job id. Missing local values default to a single host
    (local rank = rank). Raises ValueError, naming the variable, for non-integers and
    out-of-range ranks.
    """
    env = os.environ if env is None else env
    addr, port = _master(env)

    if "RANK" in env or "WORLD_SIZE" in env:
        if "RANK" not in env or "WORLD_SIZE" not in env:
            have, miss = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
            raise ValueError(f"{have} is set but {miss} is not; set both (torchrun and "
                             "ringreduce-run do) or neither")
        rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
        _check_range("RANK", rank, "WORLD_SIZE", world)
        lrank = _env_int(env, "LOCAL_RANK", rank)
        lsize = _env_int(env, "LOCAL_WORLD_SIZE", world)
        _check_range("LOCAL_RANK", lrank, "LOCAL_WORLD_SIZE", lsize)
        source = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "explicit"
        return LaunchInfo(rank, world, lrank, lsize, addr, port, source)

    if "OMPI_COMM_WORLD_RANK" in env:
        rank = _env_int(env, "OMPI_COMM_WORLD_RANK")
        world = _env_int(env, "OMPI_COMM_WORLD_SIZE")
        _check_range("OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", world)
        lrank = _env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", rank)
        lsize = _env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
        _check_range("OMPI_COMM_WORLD_LOCAL_RANK", lrank, "OMPI_COMM_WORLD_LOCAL_SIZE", lsize)
        return LaunchInfo(rank, world, lrank, lsize, addr, port, "openmpi")

    if "SLURM_PROCID" in env:
        rank = _env_int(env, "SLURM_PROCID")
        size_name = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
                          if env.get(n, "").strip()), "SLURM_NTASKS")
        world = _env_int(env, size_name)
        _check_range("SLURM_PROCID", rank, size_name, world)
        lrank = _env_int(env, "SLURM_LOCALID", 0)
        lsize_name, lsize = _slurm_local_world_size(env, lrank, world)
        _check_range("SLURM_LOCALID", lrank, lsize_name, lsize)
        addr = addr if addr is not None else _slurm_master_addr(env)
        port = port if port is not None else _slurm_master_port(env)
        return LaunchInfo(rank, world, lrank, lsize, addr, port, "slurm")

    if "PMI_RANK" in env:
        rank, world = _env_int(env, "PMI_RANK"), _env_int(env, "PMI_SIZE")
        _check_range("PMI_RANK", rank, "PMI_SIZE", world)
        lrank = _env_int(env, "MPI_LOCALRANKID", rank)
        lsize = _env_int(env, "MPI_LOCALNRANKS", world)
        _check_range("MPI_LOCALRANKID", lrank, "MPI_LOCALNRANKS", lsize)
        return LaunchInfo(rank, world, lrank, lsize, addr, port, "pmi")

    return LaunchInfo(0, 1, 0, 1, addr, port, "default")


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


def _p_str(name: str, raw: str) -> str:
    return raw


def _p_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE or low in _FALSE:
        return low in _TRUE
    raise _bad(name, raw, "/".join(_TRUE + _FALSE) + " (case-insensitive)")


FAULT_COLLECTIVES = {"any": 0, "allreduce": 1, "broadcast": 2, "barrier": 3, "allgather": 4,
                     "reduce_scatter": 5}
_FAULT_FORMAT = ("rank=R[,collective=any|allreduce|broadcast|barrier|allgather|reduce_scatter]"
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
        "How often each rank sends a UDP heartbeat to every peer.")
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


# --------------------------------------------------------------------------- addresses

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def _interface_names() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return []


def _ipv4_from_ip_command(ifname: str) -> str | None:
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", ifname],
                             capture_output=True, text=True, timeout=5, check=True).stdout
        for link in json.loads(out or "[]"):
            for info in link.get("addr_info", []):
                if info.get("family") == "inet" and info.get("local"):
                    return str(info["local"])
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return None


def _interface_ipv4(ifname: str) -> str:
    names = _interface_names()
    hint = (f"available interfaces: {', '.join(names) or 'none found'}. Set "
            "RINGREDUCE_SOCKET_IFNAME to one of them, or unset it to use the interface that "
            "routes to MASTER_ADDR")
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("256s", ifname.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
    except OSError as e:
        if e.errno == errno.ENODEV or (names and ifname not in names):
            raise ValueError(f"network interface {ifname!r} does not exist; {hint}") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"network interface {ifname!r} has no IPv4 address; {hint}"
                             ) from None
    except ImportError:
        pass
    addr = _ipv4_from_ip_command(ifname)
    if addr is None:
        raise ValueError(f"cannot find an IPv4 address for interface {ifname!r}; {hint}")
    return addr


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1", "") or host.startswith("127.")


def resolve(host: str, port: int, timeout: float, what: str) -> list:
    """socket.getaddrinfo(host, port, SOCK_DGRAM) with a deadline: a numeric address is
    parsed at once (no lookup); a name is looked up on a helper thread, and after `timeout`
    seconds this gives up (getaddrinfo has no timeout of its own, and an unreachable DNS
    server blocks it for minutes). Raises ValueError (no such name) or CollectiveTimeout."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM,
                                  flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass  # a name: look it up
    found: list = []
    failed: list[OSError] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM))
        except OSError as e:
            failed.append(e)

    t = threading.Thread(target=lookup, name="ringreduce-resolve", daemon=True)
    t.start()
    t.join(timeout)
    if failed:
        raise ValueError(f"cannot resolve {what}={host!r} ({failed[0]}); set {what} to an "
                         "address every rank can reach")
    if not found:
        from ._C import CollectiveTimeout

        raise CollectiveTimeout(
            f"resolving {what}={host!r} took longer than {timeout:g} s (is the DNS server "
            f"reachable? use a numeric address, or fix /etc/hosts or resolv.conf)")
    return found[0]


def _route_source(master_addr: str, timeout: float) -> str:
    infos = resolve(master_addr, 9, timeout, "MASTER_ADDR")
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # prefer IPv4
    last: OSError | None = None
    for family, _, _, _, sockaddr in infos:
        try:
            # connect() on UDP only picks the route and source address; nothing is sent.
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                return str(s.getsockname()[0])
        except OSError as e:
            last = e
    raise ValueError(f"no route to MASTER_ADDR={master_addr!r} ({last}); set "
                     "RINGREDUCE_SOCKET_IFNAME to the interface peers should use")


def select_interface_address(master_addr: str | None, ifname: str | None,
                             timeout: float = 30.0) -> str:
    """The local address this rank should listen on and advertise to its peers.

    With ``ifname`` (RINGREDUCE_SOCKET_IFNAME; a comma-separated list tries each in turn)
    that interface's IPv4 address; otherwise the address of the interface that routes to
    ``master_addr``, or ``"127.0.0.1"`` when ``master_addr`` is unset or a loopback name.
    Raises ValueError, listing the available interfaces, when the interface is missing.
    Always returns a numeric address (the C++ core then needs no name lookup); looking up a
    MASTER_ADDR name takes at most ``timeout`` seconds (CollectiveTimeout after that).
    """
    if ifname:
        names = [n.strip() for n in ifname.split(",") if n.strip()]
        errors: list[str] = []
        for name in names:
            try:
                return _interface_ipv4(name)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[-1] if len(errors) == 1 else "; ".join(errors))
    if master_addr is None or _is_loopback(master_addr.strip()):
        return "127.0.0.1"
    return _route_source(master_addr.strip(), timeout)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def host_identity() -> str:
    """A short string equal for two processes exactly when they can share memory.

    Hostname plus a digest of the kernel boot id (two containers or machines with the same
    hostname differ), the IPC namespace and the device of /dev/shm (containers on one kernel
    with private /dev/shm differ) and the network namespace. Used to decide which peers may use the shm transport.
    """
    facts: Sequence[str] = (
        _read_text("/proc/sys/kernel/random/boot_id"),
        _safe_readlink("/proc/self/ns/ipc"),
        # Separate network namespaces (containers, emulated clusters) count as separate hosts.
        _safe_readlink("/proc/self/ns/net"),
        _shm_device(),
    )
    digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:12]
    return f"{socket.gethostname()}/{digest}"


def _safe_readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _shm_device() -> str:
    try:
        return str(os.stat("/dev/shm").st_dev)
    except OSError:
        return ""
