"""``ringreduce-run``: start N local ranks of a Python program, torchrun-style.

    ringreduce-run -n 4 train.py --epochs 3
    ringreduce-run -n 2 -m mypkg.train --lr 0.1
    python -m ringreduce.run -n 2 --master-port 29500 bench.py

Each rank gets the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, TORCHELASTIC_RUN_ID, ...)
plus a fresh RINGREDUCE_SECRET (and OMP_NUM_THREADS=1 unless set, as torchrun), runs in
its own process group, and has its output lines prefixed with ``[rank K] ``. When one rank
fails, the others get SETTLE_S to fail on their own (all such failures are reported), then
are stopped (SIGTERM, then SIGKILL after a grace period); the launcher exits with the code
of the failure to blame (_root_cause; 128+signal for a signal). SIGINT/SIGTERM/SIGHUP sent to the launcher are forwarded to every rank; a second
one kills them at once.

This module imports nothing from the rest of the package, so it also runs as a plain file
(and ``import ringreduce`` does not import it: ``python -m ringreduce.run`` would warn).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any, Callable

PROG = "ringreduce-run"
DEFAULT_GRACE_S = 5.0
# After a rank fails, how long the others may take to fail on their own before they are
# stopped: a rank that sys.exit(3)s makes its peers raise PeerFailure (code 1) within
# milliseconds -- sometimes before its own exit is seen -- and all of them are reported.
SETTLE_S = 0.5
# A rank already ending on an uncaught PeerFailure (marked, see peer_failed) may still be in
# its exit hooks -- destroy()'s farewell waits up to 1 s after a failure for a rank that
# froze -- so the settling lasts while such a rank runs, at most this long after the first
# failure. Stopped by the launcher, it was not counted among the ranks reporting the
# culprit (CI saw it).
SETTLE_MARKED_S = 3.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_OPTS_WITH_VALUE = ("-n", "--nproc-per-node", "--nproc_per_node", "--master-port",
                    "--master_port", "--master-addr", "--master_addr", "--grace-period",
                    "--grace_period", "--nnodes", "--node-rank", "--node_rank")


def _sibling(name: str) -> Any:
    """A module beside this file, loaded by its path (this file runs as a plain file and
    imports nothing of the package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_ringreduce_run{name}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_output = _sibling("_run_output")
_program = _sibling("_run_command")
_UsageError, _command = _program.UsageError, _program.command


def _split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the program: (launcher options, [script-or-'-m', module, program args...]).

    The first non-option word (or ``-m MODULE``, or whatever follows ``--``) starts the
    program's command line; everything after it belongs to the program, as with python.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return list(argv[:i]), list(argv[i + 1:])
        if arg.startswith("-m") and not arg.startswith("--"):  # -m mod, or -mmod as python
            module = [arg[2:]] if arg != "-m" else []
            return list(argv[:i]), ["-m", *module, *argv[i + 1:]]
        if not arg.startswith("-") or arg == "-":
            return list(argv[:i]), list(argv[i:])
        i += 2 if arg in _OPTS_WITH_VALUE else 1
    return list(argv), []


def _gpu_count() -> int:
    """The NVIDIA GPUs this launch may use, as torch.cuda.device_count() counts them,
    without importing torch (which this launcher avoids): those the driver lists
    (/proc/driver/nvidia/gpus), at most as many as CUDA_VISIBLE_DEVICES names when it is set
    (its list ends at the first entry that is negative, as CUDA reads it; "" hides all)."""
    try:
        driver = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return driver
    named = 0
    for entry in visible.split(","):
        if not entry.strip() or entry.strip().startswith("-"):
            break
        named += 1
    return min(driver, named)


def _nproc(text: str) -> int:
    """-n: a number, or torchrun's "cpu" (the CPUs this process may use), "gpu" (the GPUs)
    or "auto" (the GPUs if any, else the CPUs)."""
    word = text.strip().lower()
    if word in ("cpu", "gpu", "auto"):
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        gpus = _gpu_count()
        if word == "gpu" and gpus == 0:
            raise argparse.ArgumentTypeError("'gpu': no NVIDIA GPU found (/proc/driver/nvidia"
                                             "/gpus, CUDA_VISIBLE_DEVICES); pass a number of "
                                             "ranks, or 'cpu'")
        return gpus if word == "gpu" or (word == "auto" and gpus) else cpus
    return _positive_int(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number (or torchrun's cpu, gpu, auto)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"got {value}; pass the number of ranks to start, at least 1 (e.g. -n 4)")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; pass one in 1..65535")
    return value


def _pet(name: str, default: str | None = None) -> str | None:
    """torchrun's environment default for an option: PET_<NAME>, else `default`."""
    return os.environ.get(f"PET_{name}") or default


_PET_TYPED = {"NPROC_PER_NODE": "-n", "NODE_RANK": "--node-rank", "MASTER_PORT": "--master-port"}


def _check_pet(parser: argparse.ArgumentParser, given: set[str]) -> None:
    """A bad PET_* value for an option the command line does not give (`given`: the
    options it has), named as the variable: argparse named the option, never typed."""
    for env, opt in _PET_TYPED.items():
        action = parser._option_string_actions[opt]
        value = os.environ.get(f"PET_{env}")
        if not value or given & set(action.option_strings):
            continue
        try:
            action.type(value)
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise _UsageError(f"PET_{env}={value!r} (torchrun's default for {opt}): {e}; fix "
                              f"or unset it, or pass {opt}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,  # _split_argv must know which options take a value
        usage=f"{PROG} [-n N] [options] ([python] script.py | -m module | --no-python cmd) "
              "[args...]",
        description="Start N local ranks of a Python program with torchrun-compatible "
                    "environment variables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # torchrun's spellings (--nproc_per_node, --master_port, ...) are accepted as well.
    # Defaults from torchrun's PET_* variables (Kubeflow's PyTorchJob sets them; torchrun
    # reads every option from one), below the command line, as torchrun's.
    p.add_argument("-n", "--nproc-per-node", "--nproc_per_node", dest="nproc", type=_nproc,
                   default=_pet("NPROC_PER_NODE", "1"), metavar="N",
                   help="number of ranks (default 1, as torchrun's), or cpu, gpu, auto")
    # torchrun's single-host spellings, so that its command lines run unchanged.
    p.add_argument("--standalone", action="store_true",
                   help="accepted for torchrun's command lines: every job here is one host's, "
                        "on a fresh port unless --master-port is given")
    p.add_argument("--nnodes", default=_pet("NNODES", "1"), metavar="1",
                   help="accepted for torchrun's command lines: 1 (or 1:1) only")
    p.add_argument("--node-rank", "--node_rank", type=int, default=_pet("NODE_RANK", "0"),
                   metavar="0",
                   help="accepted for torchrun's command lines: 0 only")
    p.add_argument("--master-addr", "--master_addr", default=_pet("MASTER_ADDR", "127.0.0.1"),
                   help="MASTER_ADDR given to the ranks (default: 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", type=_port, default=_pet("MASTER_PORT"),
                   help="MASTER_PORT given to the ranks (default: a free port)")
    p.add_argument("--no-python", "--no_python", action="store_true",
                   help="run the program as an executable instead of a Python script "
                        "(torchrun's --no-python)")
    p.add_argument("--no-prefix", action="store_true",
                   help="don't prefix output lines with '[rank K] '")
    p.add_argument("--grace-period", "--grace_period", type=float, default=DEFAULT_GRACE_S, metavar="SECONDS",
                   help="after a rank fails, how long the others get between SIGTERM and "
                        f"SIGKILL (default: {DEFAULT_GRACE_S:g})")
    return p


def _epilog() -> str:
    """The tunables list for --help, from the sibling _env package loaded by path:
    importing ringreduce would import its extension (and maybe torch) just to print help."""
    import importlib.util

    pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_env")
    try:
        spec = importlib.util.spec_from_file_location(
            "_ringreduce_env_for_help", os.path.join(pkg, "__init__.py"),
            submodule_search_locations=[pkg])
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses need it
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return "environment variables read by ringreduce:\n" + module.describe_tunables()
    except Exception:  # noqa: BLE001 -- help without the list beats no help
        return ""


# Set for the ranks: a folder where a rank leaves a file named by its pid when it ends on an
# uncaught PeerFailure (ringreduce._blame, which ``import ringreduce`` installs in each rank;
# _root_cause reads them). The same name as _blame.PEER_FAILURES_VAR: this file runs
# standalone, importing nothing of the package.
PEER_FAILURES_VAR = "RINGREDUCE_RUN_PEER_FAILURES"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _rank_env(base: dict[str, str], rank: int, n: int, addr: str, port: int, run_id: str,
              secret: str, notes: str) -> dict[str, str]:
    env = dict(base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(n),
        "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n),
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(n),
        "MASTER_ADDR": addr, "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        # No agent store here: rank 0 hosts the TCPStore on MASTER_PORT.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "RINGREDUCE_SECRET": secret,
        "TORCHELASTIC_ERROR_FILE": _error_file(notes, rank),  # torchrun's: @record writes it
        PEER_FAILURES_VAR: notes,
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _error_file(notes: str, rank: int) -> str:
    return os.path.join(notes, f"error-{rank}.json")


def _recorded(notes: str, rank: int, code: int) -> str | None:
    """The error `rank` recorded (torch's @record wrote it to TORCHELASTIC_ERROR_FILE), as
    torchrun's root cause: its message, and the file copied, with the exit code, to the
    launcher's own TORCHELASTIC_ERROR_FILE where that is set (a scheduler reads it)."""
    import json

    try:
        with open(_error_file(notes, rank)) as f:
            data = json.load(f)
        message = data["message"]
        text = message["message"] if isinstance(message, dict) else str(message)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    mine = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if mine:
        if isinstance(message, dict):
            message["errorCode"] = code
        with contextlib.suppress(OSError), open(mine, "w") as f:
            json.dump(data, f)
    return str(text)


def parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGTERM the child if the launcher dies (even by SIGKILL).

    It runs between fork and exec, so it only calls an already-resolved libc function.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by signal {_signal_name(-code)}"
    return f"exited with code {code}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class _Job:
    """The running ranks. All methods run on the launcher's main thread (signal handlers too,
    as Python runs them there); waiter threads only put (rank, code) on ``exited``."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.exited: queue.Queue[tuple[int, int]] = queue.Queue()
        self.threads: list[threading.Thread] = []
        self.codes: dict[int, int] = {}
        self.signals: list[int] = []
        self.running_at_signal = 0  # ranks still running when the first signal came
        self.screen = _output.Screen()  # our stdout/stderr, shared by the ranks' output
        self.pumps: dict[int, list[threading.Thread]] = {}  # rank -> its output's threads
        # Where ranks mark an exit on an uncaught PeerFailure (ringreduce._blame).
        _remove_stale_notes()
        self.notes = tempfile.mkdtemp(prefix=NOTES_PREFIX)
        # Held while this launcher lives (the kernel drops it when the process dies).
        self.notes_lock = os.open(os.path.join(self.notes, NOTES_LOCK), os.O_CREAT | os.O_RDWR,
                                  0o600)
        fcntl.flock(self.notes_lock, fcntl.LOCK_EX)

    def say(self, text: str) -> None:
        """The launcher's message, on a line of its own (it ran into a rank's open line)."""
        self.screen.say(f"{PROG}: {text}", sys.stderr)

    def alive(self) -> list[int]:
        return [r for r in range(len(self.procs)) if r not in self.codes]

    def signal(self, sig: int, ranks: Sequence[int] | None = None) -> None:
        """Send ``sig`` to the process group of each rank (its children included)."""
        for r in self.alive() if ranks is None else ranks:
            try:
                os.killpg(self.procs[r].pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(self, sig: int, _frame: object) -> None:
        if not self.signals:
            self.running_at_signal = len(self.alive())
        self.signals.append(sig)
        self.signal(signal.SIGKILL if len(self.signals) > 1 else sig)

    def spawn(self, cmd: list[str], env: dict[str, str], prefix: bool,
              preexec: Callable[[], None] | None) -> None:
        """Start the next rank. Call for every rank before :meth:`watch`, so that no thread
        of ours is running while ``preexec`` runs in a forked child."""
        pipe = subprocess.PIPE if prefix else None
        self.procs.append(subprocess.Popen(
            cmd, env=env, stdout=pipe, stderr=pipe,
            stdin=None if not self.procs else subprocess.DEVNULL,  # only rank 0 reads stdin
            start_new_session=True,  # own process group, so we can signal its children
            # Safe here: spawn() runs before watch() starts our threads, and preexec only
            # calls prctl/getppid/kill.
            preexec_fn=preexec,  # noqa: PLW1509
        ))

    def watch(self) -> None:
        """Start the threads that copy each rank's output and report its exit."""
        # For the next launcher, should this one be killed with its ranks.
        with contextlib.suppress(OSError), open(os.path.join(self.notes, NOTES_PIDS), "w") as f:
            f.write(" ".join(str(p.pid) for p in self.procs))
        for rank, proc in enumerate(self.procs):
            tag = f"[rank {rank}] ".encode()
            for src, dst in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                if src is not None:
                    self.pumps.setdefault(rank, []).append(
                        self._thread(_output.pump, src, dst, tag, self.screen))
            self._thread(self._wait, rank, proc)

    def peer_failed(self, ranks: Collection[int], timeout: float = 0.5) -> dict[int, int | None]:
        """Those of `ranks` (exited) that ended on an uncaught PeerFailure -- they only report
        another rank's failure -- with the rank it names (None if none), once their output
        has been copied to its end (so ours comes after it)."""
        for r in ranks:
            for t in self.pumps.get(r, ()):
                t.join(timeout)  # a grandchild holding the pipe open: give up
        out: dict[int, int | None] = {}
        for r in ranks:
            try:
                with open(self._mark(r)) as f:
                    text = f.read().strip()
            except OSError:
                continue  # not marked
            out[r] = int(text) if text.isdigit() and int(text) < len(self.procs) else None
        return out

    def marked(self, ranks: Collection[int]) -> list[int]:
        """Those of `ranks` that marked an uncaught PeerFailure (they may still be exiting)."""
        return [r for r in ranks if os.path.exists(self._mark(r))]

    def _mark(self, rank: int) -> str:
        """Where `rank` marks an uncaught PeerFailure (_blame.mark_peer_failures)."""
        return os.path.join(self.notes, str(self.procs[rank].pid))

    def _wait(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.exited.put((rank, proc.wait()))

    def _thread(self, target: Callable[..., None], *args: object) -> threading.Thread:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def next_exit(self, timeout: float) -> tuple[int, int] | None:
        try:
            rank, code = self.exited.get(timeout=timeout)
        except queue.Empty:
            return None
        self.codes[rank] = code
        return rank, code

    def finish(self, grace: float) -> None:
        """Stop whatever is left in the ranks' process groups -- also of ranks that exited:
        their children (a logger's upload, a DataLoader worker) would be orphans -- with
        SIGTERM and up to `grace` seconds to end (they were SIGKILLed at once: found by a
        helper), then SIGKILL; reap everything."""
        every = range(len(self.procs))
        groups = {p.pid for p in self.procs}
        if not self.signals and _running_in(groups):  # a signal had them SIGTERMed already
            self.signal(signal.SIGTERM, ranks=every)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and not self.signals and _running_in(groups):
                time.sleep(0.05)  # (a signal now: SIGKILL at once)
        self.signal(signal.SIGKILL, ranks=every)
        for p in self.procs:
            p.wait()
        n = _remove_segments({p.pid for p in self.procs})
        if n:
            self.say(f"removed {_plural(n, 'shared-memory segment')} that killed ranks left "
                     f"in /dev/shm")
        deadline = time.monotonic() + 2.0  # pipes held open by escaped grandchildren
        for t in self.threads:  # (a new session's): 2 s for all, not each (found by a helper)
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self.notes, ignore_errors=True)
        os.close(self.notes_lock)


def _running_in(groups: set[int]) -> bool:
    """Whether a process of these process groups still runs (a zombie does not: an orphan
    that ended stays one where nothing reaps it, as in a container whose init does not)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{pid}/stat", "rb") as f:
                state, _, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]
            if int(pgrp) in groups and state not in (b"Z", b"X"):
                return True
    return False


NOTES_PREFIX = "ringreduce-run-"  # + mkdtemp's random part
NOTES_LOCK = "lock"  # in the folder, locked by its launcher while it runs
NOTES_PIDS = "pids"  # in the folder: its ranks' pids


def _remove_stale_notes() -> None:
    """Remove this user's notes folders of launchers that are gone (a SIGKILLed one could
    not: found by a helper): those whose lock can be taken -- a lock, not a pid, so that a
    live launcher of another PID namespace sharing /tmp (a container) keeps its folder --
    and that are a minute old (one starting now may not hold its lock yet). With them go the
    shared-memory segments its ranks, now gone, were creating when all were killed at once
    (an OOM or container kill: found by a helper; finish() removes them otherwise)."""
    tmp = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(tmp):
            path = os.path.join(tmp, name)
            try:
                st = os.lstat(path)
                if not name.startswith(NOTES_PREFIX) or st.st_uid != os.getuid() or \
                        time.time() - st.st_mtime < 60:
                    continue
                fd = os.open(os.path.join(path, NOTES_LOCK), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # no lock (yet): not a launcher's, or one starting now
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _remove_segments(_gone(path))
                shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass  # held: its launcher runs
            finally:
                os.close(fd)


def _gone(notes: str) -> set[int]:
    """The pids a notes folder lists (NOTES_PIDS) that no process has now."""
    try:
        with open(os.path.join(notes, NOTES_PIDS)) as f:
            pids = {int(p) for p in f.read().split() if p.isdigit()}
    except (OSError, ValueError):
        return set()
    gone = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            gone.add(pid)
        except OSError:
            pass  # someone else's process now: not ours to judge
    return gone


def _remove_segments(pids: set[int]) -> int:
    """Remove the shared-memory segments named as those of processes `pids` (ringreduce's
    names end in -<creator pid>-<32 hex digits>, csrc/transport/shm/segment.cc). A segment
    is unlinked once every peer has mapped it; a rank killed before then (SIGKILL while a
    group is being created) leaves its name behind. Only our ranks' own, after they ended."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    pat = re.compile(r"rr-.+-(\d+)-[0-9a-f]{32}")
    n = 0
    for name in names:
        m = pat.fullmatch(name)
        if m and int(m.group(1)) in pids:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))
                n += 1
    return n


def _root_cause(failed: list[tuple[int, int]], peer_failed: Collection[int] = ()
                ) -> tuple[int, int]:
    """The failure to blame among ranks that failed on their own: one killed by a signal or
    exiting with a code of its own choosing before one with 1 (an uncaught exception -- what
    the peers of a failed rank raise), and of those, one whose exception was not ringreduce's
    PeerFailure (the rank that raised it only reports another's failure, and may well exit
    first); else the first seen."""
    def specific(event: tuple[int, int]) -> int:
        return 3 if event[1] < 0 else 2 if event[1] != 1 else 0 if event[0] in peer_failed else 1
    return max(failed, key=specific)  # max keeps the first of equals


def _named_culprit(failed: list[tuple[int, int]], reported: dict[int, int | None]
                   ) -> int | None:
    """The rank to blame when every rank that failed only reported another's failure
    (uncaught PeerFailure, exit code 1) and they name one rank that did not fail on its own:
    a frozen rank (found silent, then stopped by the launcher) or one that left early with
    code 0. None otherwise (then _root_cause decides)."""
    if not failed or any(c != 1 or r not in reported for r, c in failed):
        return None
    named = {reported[r] for r, _ in failed}
    if len(named) != 1:
        return None
    culprit = named.pop()
    return culprit if culprit is not None and culprit not in {r for r, _ in failed} else None


def _supervise(job: _Job, grace: float) -> int:
    """Wait for the ranks; stop them all on the first failure (after SETTLE_S, in which
    others may fail on their own too) or signal. Returns the exit code and prints the final
    explanation."""
    failed: list[tuple[int, int]] = []  # ranks that failed on their own, in order seen
    stopped = 0  # ranks still running when they were stopped
    settle: float | None = None  # when ranks still running after a failure get SIGTERM
    settle_end = 0.0  # the latest it may move to (SETTLE_MARKED_S)
    deadline: float | None = None  # when ranks still running get SIGKILL
    sent = "SIGTERM"
    while job.alive():
        if job.signals and deadline is None:  # on_signal already forwarded it
            deadline = time.monotonic() + grace
            sent = _signal_name(job.signals[0])
        waits = [0.2] + [max(0.0, t - time.monotonic()) for t in (settle, deadline) if t]
        event = job.next_exit(min(waits))
        if event is not None and event[1] != 0 and deadline is None and not job.signals:
            failed.append(event)
            job.signal(signal.SIGTERM, ranks=[event[0]])  # its leftover children
            if settle is None:
                now = time.monotonic()
                settle, settle_end = now + SETTLE_S, now + SETTLE_MARKED_S
        if settle is not None and deadline is None and (
                time.monotonic() >= settle or not job.alive()):
            if time.monotonic() < settle_end and job.marked(job.alive()):
                settle = time.monotonic() + 0.05  # a marked rank is exiting: look again
                continue
            stopped = len(job.alive())
            job.signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() >= deadline and job.alive():
            killed = job.alive()
            job.say(f"{_plural(len(killed), 'rank')} still running {grace:g} s after "
                    f"{sent}: sending SIGKILL to rank(s) {', '.join(map(str, killed))}")
            job.signal(signal.SIGKILL)
            deadline = float("inf")
    if failed:
        reported = job.peer_failed([r for r, _ in failed])
        rank, code = _root_cause(failed, reported)
        others = (f"terminated the other {_plural(stopped, 'rank')}" if stopped
                  else "the other ranks had already exited")
        culprit = _named_culprit(failed, reported)
        if culprit is not None:  # it did not fail on its own: it froze, or left early
            end = job.procs[culprit].returncode
            how = ("exited with code 0 before the others were done" if end == 0 else
                   "was still running and was stopped" if end is not None else "is still running")
            rest = stopped - (end != 0)  # the ranks stopped besides it
            names = ", ".join(str(r) for r in sorted(reported))
            job.say(f"rank {culprit} (pid {job.procs[culprit].pid}) failed as rank(s) "
                    f"{names} report (their PeerFailure names it; they exited with code 1): "
                    f"it {how}" + (f"; terminated {_plural(rest, 'other rank')}" if rest else ""))
            return code
        # The others: each on its own, or on the PeerFailure a peer's failure caused (it
        # said "failed on their own" of those too: found by a helper).
        also = "; ".join(f"rank {r} {_describe(c)}" + (
            " on its own" if r not in reported else ", on a PeerFailure" + (
                "" if reported[r] is None else f" naming rank {reported[r]}"))
            for r, c in failed if r != rank)
        also = f" (also: {also})" if also else ""
        job.say(f"rank {rank} (pid {job.procs[rank].pid}) {_describe(code)}{also}; {others}")
        recorded = _recorded(job.notes, rank, code)
        if recorded:
            job.say(f"rank {rank}'s error (recorded by @record): {recorded}")
        return code if code > 0 else 128 - code
    if job.signals:
        sig = job.signals[0]
        job.say(f"received {_signal_name(sig)}; stopped {_plural(job.running_at_signal, 'rank')}")
        return 128 + sig
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``ringreduce-run``; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    opts_argv, program = _split_argv(argv)
    parser = _parser()
    if "-h" in opts_argv or "--help" in opts_argv:
        parser.epilog = _epilog()
    try:
        values = {i + 1 for i, w in enumerate(opts_argv) if w in _OPTS_WITH_VALUE}
        for i, word in enumerate(opts_argv):  # before argparse: "unrecognized arguments"
            name = "" if i in values else word.split("=", 1)[0]  # (-n -1: -1 is a value)
            if not name.startswith("--"):  # -n2: -n; torchrun's -t / -r: refused as --tee's
                name = name[:2] if name.startswith("-") and len(name) > 1 else ""
            if name and name not in parser._option_string_actions:
                import difflib

                close = difflib.get_close_matches(
                    name, [o for o in parser._option_string_actions if o.startswith("--")], 1)
                known = [o for o in parser._option_string_actions if o.startswith(name)]
                raise _UsageError(f"unknown option {name}" + (
                    f" (did you mean {close[0]}?)" if close else "") + (
                    "; options are not abbreviated" if known else
                    "; ringreduce-run takes torchrun's single-host options (see --help): for "
                    "its others (rendezvous, restarts, log files) run torchrun itself, with "
                    "init_process_group(\"ringreduce\")"))
        given = {w.split("=", 1)[0] for w in opts_argv} | {w[:2] for w in opts_argv
                                                            if w.startswith("-n")}
        _check_pet(parser, given)
        opts = parser.parse_args(opts_argv)
        if opts.standalone and not given & {"--master-port", "--master_port"}:
            opts.master_port = None  # torchrun's --standalone: a fresh port, not PET_'s
        cmd = _command(program, opts.no_python)
        if opts.nnodes.strip() not in ("1", "1:1") or opts.node_rank != 0:
            raise _UsageError(
                f"ringreduce-run starts ranks on this host only (--nnodes 1, --node-rank 0; got "
                f"--nnodes {opts.nnodes} --node-rank {opts.node_rank}); across hosts run "
                f"torchrun --nnodes ... (init_process_group(\"ringreduce\") works under it), "
                f"srun or mpirun")
        if not opts.grace_period >= 0:
            raise _UsageError("--grace-period must be a number of seconds >= 0")
    except SystemExit as e:  # argparse: --help, or a usage error it already printed
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except _UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2

    port = opts.master_port or _free_port()
    secret = os.environ.get("RINGREDUCE_SECRET") or secrets.token_hex(16)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or uuid.uuid4().hex
    base = dict(os.environ)
    if "OMP_NUM_THREADS" not in base and opts.nproc > 1:
        # As torchrun: N ranks each starting one OpenMP/torch thread per core oversubscribe
        # the machine N times.
        base["OMP_NUM_THREADS"] = "1"
        print(f"{PROG}: setting OMP_NUM_THREADS=1 for each rank (as torchrun does) to avoid "
              f"overloading the machine; set it yourself to tune it", file=sys.stderr,
              flush=True)
    preexec = parent_death_signal()

    job = _Job()
    previous = {sig: signal.signal(sig, job.on_signal) for sig in _FORWARDED}
    try:
        for rank in range(opts.nproc):
            if job.signals:
                break
            env = _rank_env(base, rank, opts.nproc, opts.master_addr, port, run_id, secret,
                            job.notes)
            try:
                job.spawn(cmd, env, not opts.no_prefix, preexec)
            except OSError as e:
                print(f"{PROG}: cannot start rank {rank} ({' '.join(cmd)}): {e}",
                      file=sys.stderr, flush=True)
                return 1
        job.watch()
        if job.signals:  # a signal arrived while we were starting ranks
            job.signal(job.signals[0])
        return _supervise(job, opts.grace_period)
    finally:
        job.finish(opts.grace_period)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
