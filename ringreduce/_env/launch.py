"""Rank, world size, local rank and the rendezvous address, from torchrun (and
ringreduce-run), Open MPI, SLURM or MPICH/Hydra PMI variables.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

# --------------------------------------------------------------------------- launch detection


@dataclass(frozen=True)
class LaunchInfo:
    """Where this process sits in the job, as the launcher described it.

    ``source`` names the launcher the values came from: ``"torchrun"`` (also set by
    ``ringreduce-run``), ``"explicit"`` (RANK/WORLD_SIZE set by hand), ``"openmpi"``,
    ``"slurm"``, ``"pmi"`` (MPICH/Intel MPI Hydra), ``"given"`` (rank and world size passed
    by the caller, e.g. torch's init_process_group) or ``"default"`` (a single process).
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
            raise ValueError(f"{name} is {'not set' if raw is None else 'empty'}; set it to a "
                             "whole number, or launch with "
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


def _check_local(lrank_name: str, lrank: int, lsize_name: str, lsize: int, size_name: str,
                 size: int) -> None:
    """The local rank within the local world size, which is within the world size (a host
    cannot hold more ranks than the job)."""
    _check_range(lrank_name, lrank, lsize_name, lsize)
    if lsize > size:
        raise ValueError(f"{lsize_name}={lsize} but {size_name}={size}: a host cannot run more "
                         f"ranks than the job has; check the launch command or the variables "
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


# Where SLURM lists the hosts, the step's first.
_SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def _slurm_master_addr(env: Mapping[str, str]) -> str | None:
    for name in _SLURM_NODELISTS:
        if env.get(name, "").strip():
            try:
                return next(expand_hostlist(env[name]), None)
            except ValueError as e:
                raise ValueError(f"{name}={env[name]!r}: {e}; set MASTER_ADDR to the host of "
                                 "rank 0 instead") from None
    return None


def _slurm_step(env: Mapping[str, str]) -> str | None:
    """"JOB.STEP" (SLURM_JOB_ID, SLURM_STEP_ID: the same on every task of one srun step and
    on no other step's), "JOB.batch" without a step id (the batch script's own processes);
    None without a job id."""
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job.isdigit():
        return None
    step = env.get("SLURM_STEP_ID", "").strip()
    return f"{int(job)}.{int(step) if step.isdigit() else 'batch'}"


def _slurm_master_port(env: Mapping[str, str]) -> int | None:
    # Every task of a step sees the same job and step ids, so all agree on this port without
    # talking; MASTER_PORT overrides it when it collides with something. A hash, as Open
    # MPI's below: a linear formula (job * 7 + step) gave job J's step s + 7 job J + 1's step
    # s's port (neighbouring job ids share nodes: job arrays; found by a helper).
    import zlib

    step = _slurm_step(env)
    return None if step is None else 20000 + zlib.crc32(f"slurm/{step}".encode()) % 20000


def _mpi_master_port(env: Mapping[str, str]) -> int | None:
    """A port every process of one Open MPI job derives alike, from its job's id (PMIx
    namespace, or the job's session directory); MASTER_PORT overrides it."""
    import zlib

    key = env.get("PMIX_NAMESPACE", "") or env.get("OMPI_MCA_ess_base_jobid", "")
    if not key and env.get("OMPI_FILE_LOCATION"):
        key = os.path.dirname(env["OMPI_FILE_LOCATION"].rstrip("/"))  # .../ompi.PID/JOB
    if not key:
        return None
    return 20000 + zlib.crc32(key.encode()) % 20000


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


def _slurm_size_name(env: Mapping[str, str]) -> str:
    return next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
                 if env.get(n, "").strip()), "SLURM_NTASKS")


def _pmi_inside_slurm(env: Mapping[str, str]) -> bool:
    """PMI_RANK/PMI_SIZE that disagree with SLURM's task id and count: an MPI launcher
    (MPICH's or Intel MPI's mpiexec) started this process inside a SLURM allocation, whose
    variables it inherited (the batch step's, or those of the srun that started Hydra's
    proxies, one task per node); the innermost launcher's variables describe the job. srun
    with PMI2 sets both alike."""
    pmi = env.get("PMI_RANK", "").strip(), env.get("PMI_SIZE", "").strip()
    slurm = env.get("SLURM_PROCID", "").strip(), env.get(_slurm_size_name(env), "").strip()
    return all(v.isdigit() for v in pmi) and pmi != slurm


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Work out rank, world size and local placement from the launcher's variables.

    Precedence (first match wins): torchrun-style ``RANK``/``WORLD_SIZE`` (with
    ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``), Open MPI ``OMPI_COMM_WORLD_*``, SLURM
    ``SLURM_PROCID``/``SLURM_NTASKS`` (unless ``PMI_RANK``/``PMI_SIZE`` disagree with them:
    mpiexec inside an allocation), MPICH/Hydra ``PMI_RANK``/``PMI_SIZE``; otherwise a
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
        # Unset, LOCAL_WORLD_SIZE defaults to WORLD_SIZE: name the variable that was read.
        _check_local("LOCAL_RANK", lrank, "LOCAL_WORLD_SIZE" if env.get(
            "LOCAL_WORLD_SIZE", "").strip() else "WORLD_SIZE", lsize, "WORLD_SIZE", world)
        for size_name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
            # A torchrun under mpirun makes WORLD_SIZE >= the launcher's process count; fewer
            # means RANK/WORLD_SIZE were left over in the environment (each MPI process
            # would start its own job). SLURM's counts are left out: a batch step's
            # SLURM_NTASKS says nothing about a torchrun it starts.
            if env.get(size_name, "").strip().isdigit() and int(env[size_name]) > world:
                raise ValueError(
                    f"WORLD_SIZE={world} but {size_name}={env[size_name]}: this process was "
                    f"started by MPI with more processes than WORLD_SIZE says; unset RANK and "
                    f"WORLD_SIZE (left over in the environment?) so that ringreduce reads "
                    f"{size_name}, or launch with torchrun / ringreduce-run")
        source = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "explicit"
        return LaunchInfo(rank, world, lrank, lsize, addr, port, source)

    if "OMPI_COMM_WORLD_RANK" in env:
        rank = _env_int(env, "OMPI_COMM_WORLD_RANK")
        world = _env_int(env, "OMPI_COMM_WORLD_SIZE")
        _check_range("OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", world)
        lrank = _env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", rank)
        lsize = _env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
        _check_local("OMPI_COMM_WORLD_LOCAL_RANK", lrank, "OMPI_COMM_WORLD_LOCAL_SIZE", lsize,
                     "OMPI_COMM_WORLD_SIZE", world)
        if lsize == world:  # one host: rendezvous on it, as ringreduce-run would
            addr = addr if addr is not None else "127.0.0.1"
            port = port if port is not None else _mpi_master_port(env)
        return LaunchInfo(rank, world, lrank, lsize, addr, port, "openmpi")

    if "SLURM_PROCID" in env and not _pmi_inside_slurm(env):
        rank = _env_int(env, "SLURM_PROCID")
        size_name = _slurm_size_name(env)
        world = _env_int(env, size_name)
        _check_range("SLURM_PROCID", rank, size_name, world)
        lrank = _env_int(env, "SLURM_LOCALID", 0)
        lsize_name, lsize = _slurm_local_world_size(env, lrank, world)
        # An allocation's tasks per node may exceed a step's task count (a smaller srun):
        # the step's ranks on this node are at most its world.
        lsize = min(lsize, world)
        _check_range("SLURM_LOCALID", lrank, lsize_name, lsize)
        addr = addr if addr is not None else _slurm_master_addr(env)
        port = port if port is not None else _slurm_master_port(env)
        return LaunchInfo(rank, world, lrank, lsize, addr, port, "slurm")

    if "PMI_RANK" in env:
        rank, world = _env_int(env, "PMI_RANK"), _env_int(env, "PMI_SIZE")
        _check_range("PMI_RANK", rank, "PMI_SIZE", world)
        lrank = _env_int(env, "MPI_LOCALRANKID", rank)
        lsize = _env_int(env, "MPI_LOCALNRANKS", world)
        _check_local("MPI_LOCALRANKID", lrank, "MPI_LOCALNRANKS", lsize, "PMI_SIZE", world)
        return LaunchInfo(rank, world, lrank, lsize, addr, port, "pmi")

    return LaunchInfo(0, 1, 0, 1, addr, port, "default")


# Where each launcher puts the local rank / local world size (first one set wins).
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                    "MPI_LOCALRANKID", "PMI_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def launch_given(rank: int, world_size: int,
                 env: Mapping[str, str] | None = None) -> LaunchInfo:
    """The launch description when the caller already knows rank and world size (torch's
    init_process_group hands them to the backend; ringreduce.init(rank=, world_size=)).

    Those two win over the environment, which is then only asked for what it can add: the
    local rank and local world size (LOCAL_RANK from torchrun or Lightning, Open MPI's,
    SLURM's or Hydra's), used when they fit, and MASTER_ADDR/MASTER_PORT. Nothing in the
    environment can fail such an init: Lightning exports WORLD_SIZE and LOCAL_RANK but
    never RANK, torch's own test suite sets neither, and a stale variable is not an error
    when the caller said otherwise.
    """
    env = os.environ if env is None else env
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is out of range for world_size {world_size}: rank must "
                         f"be in [0, world_size) and world_size at least 1")
    try:
        addr, port = _master(env)
    except ValueError:
        addr, port = env.get("MASTER_ADDR", "").strip() or None, None
    lrank, lsize = _local_rank_var(env, lambda v: v <= rank, rank), world_size
    for name in _LOCAL_SIZE_VARS:
        raw = env.get(name, "").strip()
        if raw.isdigit() and lrank < int(raw) <= world_size:
            lsize = int(raw)
            break
    if lsize == world_size and lrank != rank:
        lsize = max(lrank + 1, 1)  # several hosts, local size unknown: the least that fits
    return LaunchInfo(rank, world_size, lrank, lsize, addr, port, "given")


# What init's launch was (note_launch): the launcher variables that gave its world size and
# rendezvous address when they were not WORLD_SIZE / MASTER_ADDR / MASTER_PORT, for messages
# naming what to fix; and, under srun, the job's id (run_id).
_ORIGIN: dict[str, str] = {}
_SRUN_ID = [""]


def note_launch(info: LaunchInfo, *, world_given: bool, addr_given: bool, port_given: bool,
                env: Mapping[str, str] | None = None) -> None:
    """Remember, at init, how this process was launched (`info`: the launch init used).
    Where a launcher's own variables (SLURM, Open MPI, PMI) rather than torchrun's or
    init()'s arguments gave the values, messages name those (a rank started outside srun,
    in a 4-task allocation, was told to check a WORLD_SIZE and MASTER_ADDR nobody set; a
    helper). Ranks srun started name their job "slurm-JOB.STEP" (run_id): only those --
    detected from SLURM's variables alone, in a step (SLURM_STEP_ID), with no MPI launcher's
    variables beside them, so that every rank of one job takes the id, or none does (an
    MPICH mpiexec inside a batch script: its rank 0's PMI rank equals SLURM's, the others'
    do not -- mixed ids refused each other; the review)."""
    env = os.environ if env is None else env
    _ORIGIN.clear()
    mpi = any(k in env for k in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"))
    srun = info.source == "slurm" and not mpi and env.get("SLURM_STEP_ID", "").strip().isdigit()
    step = _slurm_step(env) if srun else None
    _SRUN_ID[0] = f"slurm-{step}" if step is not None else ""
    size_var = {"slurm": _slurm_size_name(env), "openmpi": "OMPI_COMM_WORLD_SIZE",
                "pmi": "PMI_SIZE"}.get(info.source)
    if size_var is None:
        return
    if not world_given:
        _ORIGIN["WORLD_SIZE"] = f"world size ({size_var}={info.world_size})"
    if info.source == "slurm":
        hosts = next((n for n in _SLURM_NODELISTS if env.get(n, "").strip()), "SLURM_NODELIST")
        addr, port = f"the first host of {hosts}", "derived from SLURM_JOB_ID and SLURM_STEP_ID"
    else:
        addr, port = "127.0.0.1, the ranks sharing one host", "derived from the job's id"
    if not addr_given and not env.get("MASTER_ADDR", "").strip() and info.master_addr:
        _ORIGIN["MASTER_ADDR"] = f"MASTER_ADDR (unset: {addr})"
    if not port_given and not env.get("MASTER_PORT", "").strip() and info.master_port:
        _ORIGIN["MASTER_PORT"] = f"MASTER_PORT (unset: {port})"


def origin(name: str) -> str:
    """What messages call WORLD_SIZE, MASTER_ADDR or MASTER_PORT in this process (note_launch):
    the name itself unless a launcher's variables gave the value."""
    return _ORIGIN.get(name, name)


def same_launch_hint() -> str:
    """The question a wait for every rank ends with."""
    return (f"did every rank start, with the same {origin('WORLD_SIZE')} and "
            f"{origin('MASTER_ADDR')}/{origin('MASTER_PORT')}?")


# What run_id() reads, for messages.
RUN_ID_VARS = "TORCHELASTIC_RUN_ID, or under srun SLURM_JOB_ID.SLURM_STEP_ID"


def run_id(env: Mapping[str, str] | None = None) -> str:
    """The launcher's id of this job (TORCHELASTIC_RUN_ID: torchrun's rendezvous id;
    ringreduce-run's, drawn per job unless inherited; else, for ranks srun started,
    "slurm-JOB.STEP", fixed at init by note_launch), or "" when none says: two jobs with
    different ids are two jobs, even when one was started on the other's MASTER_PORT."""
    return (os.environ if env is None else env).get("TORCHELASTIC_RUN_ID", "") or _SRUN_ID[0]


def _local_rank_var(env: Mapping[str, str], fits: Callable[[int], bool], default: int) -> int:
    """The first launcher variable's local rank that is a number and `fits`, else default."""
    for name in _LOCAL_RANK_VARS:
        raw = env.get(name, "").strip()
        if raw.isdigit() and fits(int(raw)):
            return int(raw)
    return default


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its host as the first launcher variable that gives one says
    (torchrun's LOCAL_RANK, Open MPI's, SLURM's, Hydra's), else 0."""
    return _local_rank_var(os.environ if env is None else env, lambda v: True, 0)


# The notes folder ringreduce-run gives its ranks (ringreduce/run.py's PEER_FAILURES_VAR:
# the same name; that file runs standalone): _blame marks an exit on another rank's failure.
PEER_FAILURES_VAR = "RINGREDUCE_RUN_PEER_FAILURES"


def peer_failures_folder(env: Mapping[str, str] | None = None) -> str:
    """Where this rank of ringreduce-run marks an exit on another rank's failure ("": not
    under ringreduce-run)."""
    return (os.environ if env is None else env).get(PEER_FAILURES_VAR, "")


def restart_count(env: Mapping[str, str] | None = None) -> str:
    """Which attempt of a torchrun job this is (TORCHELASTIC_RESTART_COUNT; "0": the first)."""
    return (os.environ if env is None else env).get("TORCHELASTIC_RESTART_COUNT", "0")
