"""The one spawn helper of the test suite: run a function on N fresh ranks and collect results.

    from _spawn import run_world
    results = run_world(3, workers.matrix, ["allreduce"], timeout=60)

Each rank is a process of its own (a new session, so the whole process group can be killed)
with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT / RINGREDUCE_SECRET set:
forked from a server that has imported torch once (tests/_zygote.py), or a fresh
``python -c`` where that server cannot serve the launch's environment or a rank_prefix wraps
the command.
The child imports the target by "module:function" name (tests/ is on PYTHONPATH), calls
``ringreduce.init()``, runs ``target(rank, world, *args)``, calls ``ringreduce.destroy()``
and writes its JSON return value -- or its exception (type, message, traceback) -- to a
per-rank result file. Arguments and return values must be JSON-serialisable.

Nothing can hang the suite: the parent kills every child's process group at the hard
timeout and always reaps it (try/finally, also on KeyboardInterrupt). Should the parent die
without running its finally (pytest-timeout's thread method calls os._exit), children die
with it (PR_SET_PDEATHSIG) and each child also stops itself shortly after the timeout
(faulthandler, which first prints every thread's stack to its stderr).

``run_world`` raises AssertionError listing every rank's exception and stdout/stderr tail
when any rank failed or timed out; ``run_world_raw`` returns per-rank outcomes instead, for
tests that expect ranks to die.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

import _zygote

TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parent

Target = Union[str, Callable[..., Any]]

# Extra seconds the parent gives a child past `timeout` before SIGKILL (the child's own
# faulthandler watchdog fires at `timeout` and prints its stacks first).
_GRACE_S = 3.0
_TAIL_CHARS = 3000


# Ports free_port() hands out: below the kernel's ephemeral range (32768-60999 by default,
# where every listener bound to port 0 -- our ranks', the launcher's -- gets its port), one
# block per pytest-xdist worker, taken in turn. A port picked by binding port 0 could be
# taken by a listener of a test on another worker before this test's store bound it (or be
# handed to two tests at once); a block of its own is reused only by this worker's later
# tests, long after. Each pytest session running at once on the host has a range of its own
# (_xdist_locks.PORT_SLOT_ENV), split into the blocks of its workers.
_PORT_BASE, _PORT_SPAN = 10000, 20000
_next_port = [0]


def _port_block() -> tuple[int, int]:
    """(first port, length) of this process's block."""
    from _xdist_locks import PORT_SLOT_ENV, PORT_SLOTS

    slot = int(os.environ.get(PORT_SLOT_ENV, "0")) % PORT_SLOTS
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) % workers if worker[2:].isdigit() else 0
    span = _PORT_SPAN // PORT_SLOTS
    length = span // workers
    return _PORT_BASE + slot * span + index * length, length


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other test of this run, nor of
    another pytest session running at the same time, will be given (see _PORT_BASE)."""
    first, length = _port_block()
    for _ in range(length):
        port = first + _next_port[0] % length
        _next_port[0] = (_next_port[0] + 1) % length
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # something else of this host has it: the next one
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + length - 1}")


@dataclass
class RankOutcome:
    """What one rank did: its return value, or its exception, or how it died."""

    rank: int
    pid: int
    returncode: int | None  # None: still running when killed (then timed_out is True)
    timed_out: bool
    has_result: bool  # the child wrote a result file
    value: Any = None  # target's return value (JSON), when it returned
    exc_type: str | None = None  # e.g. "PeerFailure", when the target (or init) raised
    exc_msg: str | None = None
    traceback: str | None = None
    destroy_error: str | None = None  # rr.destroy() raised after the target finished
    stdout: str = ""
    stderr: str = ""
    elapsed: float = 0.0  # seconds from spawn to exit (or kill)

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out and self.has_result
                and self.exc_type is None and self.destroy_error is None)

    def describe(self) -> str:
        if self.timed_out:
            state = "TIMED OUT (killed)" + (" after its target returned" if self.has_result else "")
        elif not self.has_result:
            state = f"died with exit code {self.returncode} before reporting a result"
        elif self.exc_type is not None:
            state = f"raised {self.exc_type}: {self.exc_msg}"
        elif self.destroy_error is not None:
            state = f"destroy() raised {self.destroy_error}"
        elif self.returncode != 0:
            state = f"returned but exited with code {self.returncode}"
        else:
            state = "ok"
        parts = [f"--- rank {self.rank}: {state} ({self.elapsed:.1f} s)"]
        if self.traceback:
            parts.append("traceback:\n" + _tail(self.traceback))
        if self.stdout.strip():
            parts.append("stdout tail:\n" + _tail(self.stdout))
        if self.stderr.strip():
            parts.append("stderr tail:\n" + _tail(self.stderr))
        return "\n".join(parts)


def _tail(text: str, n: int = _TAIL_CHARS) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _target_name(target: Target) -> str:
    if isinstance(target, str):
        if ":" not in target:
            raise ValueError(f"target {target!r} must be 'module:function'")
        return target
    mod, qual = target.__module__, target.__qualname__
    if "<" in qual or "." in qual:
        raise ValueError(f"target {qual} must be a module-level function (it is imported by name)")
    return f"{mod}:{qual}"


def run_world_raw(world_size: int, target: Target, *args: Any, timeout: float = 60,
                  env: Mapping[str, str] | None = None,
                  rank_env: Mapping[int, Mapping[str, str]] | None = None,
                  init: bool = True, master_addr: str = "127.0.0.1",
                  rank_prefix: Mapping[int, list] | None = None,
                  expendable: Collection[int] = ()) -> list[RankOutcome]:
    """Run ``target(rank, world_size, *args)`` on `world_size` fresh processes.

    env: extra environment for every rank (e.g. RINGREDUCE_SEGMENT_BYTES); rank_env: extra
    environment per rank, applied after env. init=False leaves rr.init()/destroy() to the
    target. master_addr and rank_prefix place ranks elsewhere, e.g. in network namespaces:
    rank_prefix={1: ["ip", "netns", "exec", "rr1"]}. expendable: ranks killed as soon as
    every other rank has ended (a victim left stopped or hung on purpose). Returns one
    RankOutcome per rank, in rank order; never raises for rank failures.
    """
    name = _target_name(target)
    payload = json.dumps(list(args))  # fail here, not in the child, on non-JSON args
    port = free_port()
    secret = os.urandom(16).hex()
    tmp = Path(tempfile.mkdtemp(prefix=f"rr_world{world_size}_"))
    procs: list[subprocess.Popen | _zygote.Forked | None] = [None] * world_size
    files: list[tuple[Any, Any]] = []
    start = time.monotonic()
    ended: dict[int, float] = {}
    timed_out: set[int] = set()
    try:
        (tmp / "args.json").write_text(payload)
        pythonpath = os.pathsep.join(
            [str(TESTS_DIR), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        for rank in range(world_size):
            e = dict(os.environ)
            # Launcher variables of an outer job would confuse rank detection.
            for k in list(e):
                if k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "TORCHELASTIC_",
                                 "GROUP_RANK", "LOCAL_WORLD_SIZE", "RINGREDUCE_")) and \
                        k != "RINGREDUCE_DEBUG":  # keep: handy when a test fails
                    del e[k]
            e.update({
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(port),
                "RINGREDUCE_SECRET": secret,
                "PYTHONPATH": pythonpath,
                "PYTHONUNBUFFERED": "1",
                "PYTHONFAULTHANDLER": "1",
                "RR_SPAWN_TARGET": name,
                "RR_SPAWN_ARGS": str(tmp / "args.json"),
                "RR_SPAWN_RESULT": str(tmp / f"result_{rank}.json"),
                "RR_SPAWN_INIT": "1" if init else "0",
                "RR_SPAWN_TIMEOUT": str(float(timeout)),
                "RR_SPAWN_PARENT": str(os.getpid()),
                "OMP_NUM_THREADS": "1",
            })
            e.update(env or {})
            e.update((rank_env or {}).get(rank, {}))
            out = open(tmp / f"stdout_{rank}.txt", "w+b")  # noqa: SIM115 - closed in finally
            err = open(tmp / f"stderr_{rank}.txt", "w+b")  # noqa: SIM115
            files.append((out, err))
            forked = None if rank in (rank_prefix or {}) else _zygote.spawn(
                e, str(ROOT), tmp / f"stdout_{rank}.txt", tmp / f"stderr_{rank}.txt",
                tmp / f"status_{rank}")
            procs[rank] = forked or subprocess.Popen(
                list((rank_prefix or {}).get(rank, []))
                + [sys.executable, "-c", "import _spawn; _spawn._child_main()"],
                env=e, cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True)
        deadline = start + timeout + _GRACE_S
        while len(ended) < world_size:
            for rank, p in enumerate(procs):
                if rank not in ended and p is not None and p.poll() is not None:
                    ended[rank] = time.monotonic() - start
            if len(ended) == world_size:
                break
            if expendable and all(r in ended for r in range(world_size) if r not in expendable):
                for rank in expendable:
                    p = procs[rank]
                    if rank not in ended and p is not None:
                        _kill_group(p)
                        ended[rank] = time.monotonic() - start
                continue
            if time.monotonic() > deadline:
                for rank, p in enumerate(procs):
                    if rank not in ended:
                        timed_out.add(rank)
                        ended[rank] = time.monotonic() - start
                break
            time.sleep(0.02)
    finally:
        # Kill and reap whatever is still running, whatever happened above.
        for p in procs:
            if p is not None and p.poll() is None:
                _kill_group(p)
        for p in procs:
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL ignored?
                    pass
        for out, err in files:
            out.close()
            err.close()

    outcomes = []
    for rank, p in enumerate(procs):
        assert p is not None
        o = RankOutcome(rank=rank, pid=p.pid, returncode=p.returncode, timed_out=rank in timed_out,
                        has_result=False, elapsed=ended.get(rank, time.monotonic() - start))
        o.stdout = (tmp / f"stdout_{rank}.txt").read_text(errors="replace")
        o.stderr = (tmp / f"stderr_{rank}.txt").read_text(errors="replace")
        if "Timeout (" in o.stderr and "most recent call first" in o.stderr:
            o.timed_out = True  # the child's own faulthandler watchdog fired
        rfile = tmp / f"result_{rank}.json"
        if rfile.exists():
            try:
                data = json.loads(rfile.read_text())
            except ValueError as e:
                o.stderr += f"\n[spawn] unreadable result file: {e}"
            else:
                o.has_result = True
                o.value = data.get("value")
                o.exc_type = data.get("exc_type")
                o.exc_msg = data.get("exc_msg")
                o.traceback = data.get("traceback")
                o.destroy_error = data.get("destroy_error")
        outcomes.append(o)
    _rmtree(tmp)
    return outcomes


def run_world(world_size: int, target: Target, *args: Any, timeout: float = 60,
              env: Mapping[str, str] | None = None,
              rank_env: Mapping[int, Mapping[str, str]] | None = None,
              init: bool = True, master_addr: str = "127.0.0.1",
              rank_prefix: Mapping[int, list] | None = None) -> list[Any]:
    """Like run_world_raw, but return each rank's value (rank order) and raise
    AssertionError with every rank's story if any rank raised, died or timed out."""
    outcomes = run_world_raw(world_size, target, *args, timeout=timeout, env=env,
                             rank_env=rank_env, init=init, master_addr=master_addr,
                             rank_prefix=rank_prefix)
    if not all(o.ok for o in outcomes):
        bad = [o.rank for o in outcomes if not o.ok]
        raise AssertionError(
            f"{_target_name(target)} on world size {world_size}: rank(s) {bad} failed\n"
            + "\n".join(o.describe() for o in outcomes))
    return [o.value for o in outcomes]


def run_command(cmd: list, timeout: float, env: Mapping[str, str] | None = None
                ) -> tuple[int, str]:
    """Run `cmd` in its own session (stdout and stderr together); on the timeout the whole
    session is killed -- ranks and their children too -- and the output so far returned
    with rc -9."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=None if env is None else dict(env), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, _ = p.communicate()
    finally:
        if p.poll() is None:
            _kill_group(p)
            p.wait()
    return p.returncode, out


def stay_until(store: Any, key: str, count: int, rank: int, world: int,
               secs: float = 60) -> None:
    """Rank side: wait (at most `secs`) until the store's counter `key` reaches `count`,
    then leave together -- rank 0 last, since it serves the store. For tests whose ranks
    must outlive another rank's failure (an exit would end the others' waits sooner)."""
    deadline = time.monotonic() + secs
    while store.add(key, 0) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    store.add("passed", 1)
    while rank == 0 and store.add("passed", 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)


def raise_flag(name: str) -> None:
    """Rank side: raise a flag that every rank of this launch can see (a file in the launch's
    directory; no communicator needed, so usable after a failure or an abort)."""
    open(os.path.join(os.path.dirname(os.environ["RR_SPAWN_ARGS"]), f"flag_{name}"), "a").close()


def victim_after_the_others(rank: int, victim: int, ranks: Collection[int], step: str) -> bool:
    """Rank side: every rank of `ranks` but the victim says it is past `step` (a flag); the
    victim waits (at most 20 s) for all of them. True on the victim, which may now die
    without failing a step the others had not finished (a tree leaf is out of a collective
    before its sibling)."""
    if rank != victim:
        raise_flag(f"{step}{rank}")
        return False
    await_flags([f"{step}{r}" for r in ranks if r != victim], 20.0)
    return True


def proc_state(pid: int) -> str | None:
    """Process `pid`'s state letter as /proc says (R, S, T, Z, ...); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def await_flags(names: Collection[str], secs: float) -> bool:
    """Rank side: wait (at most `secs`) until every flag in `names` is raised. For a rank that
    must stay alive until others have seen something, instead of a fixed sleep."""
    where = os.path.dirname(os.environ["RR_SPAWN_ARGS"])
    deadline = time.monotonic() + secs
    while not all(os.path.exists(os.path.join(where, f"flag_{n}")) for n in names):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _kill_group(p: subprocess.Popen | _zygote.Forked) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # start_new_session: pgid == pid
    except (ProcessLookupError, PermissionError):
        try:
            p.kill()
        except ProcessLookupError:
            pass


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------- child side


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent dies, so nothing outlives the test run."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001, S110 - best effort; the watchdog still applies
        pass
    if str(os.getppid()) != os.environ.get("RR_SPAWN_PARENT"):  # parent gone before prctl
        os._exit(1)


def _write_result(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as e:
        text = json.dumps({"exc_type": "TypeError",
                           "exc_msg": f"target returned a value that is not JSON: {e}",
                           "traceback": None})
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _child_main() -> None:
    import faulthandler
    import importlib
    import traceback

    _die_with_parent()
    faulthandler.dump_traceback_later(float(os.environ["RR_SPAWN_TIMEOUT"]), exit=True)
    result_path = os.environ["RR_SPAWN_RESULT"]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    do_init = os.environ.get("RR_SPAWN_INIT", "1") == "1"
    data: dict[str, Any] = {}
    rr = None
    try:
        with open(os.environ["RR_SPAWN_ARGS"]) as f:
            args = json.load(f)
        mod_name, fn_name = os.environ["RR_SPAWN_TARGET"].split(":", 1)
        fn = getattr(importlib.import_module(mod_name), fn_name)
        import ringreduce as rr

        if do_init:
            rr.init()
        data["value"] = fn(rank, world, *args)
    except BaseException as e:  # noqa: BLE001 - everything is reported to the parent
        data["exc_type"] = type(e).__name__
        data["exc_msg"] = str(e)
        data["traceback"] = traceback.format_exc()
    # Report before destroy() so a hang there still leaves the target's outcome behind.
    _write_result(result_path, data)
    if rr is not None and do_init:
        try:
            rr.destroy()
        except BaseException as e:  # noqa: BLE001
            data["destroy_error"] = f"{type(e).__name__}: {e}"
            _write_result(result_path, data)
    sys.stdout.flush()
    sys.stderr.flush()
    faulthandler.cancel_dump_traceback_later()
    # Skip interpreter teardown (torch's atexit handlers and a TCPStore server on rank 0 can
    # take seconds); everything that matters is on disk.
    os._exit(0)
