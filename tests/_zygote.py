"""A fork server for the suite's ranks: one process imports numpy and torch once (2-4
CPU-seconds per fresh interpreter on a small CI machine, most of a short test's cost) and
forks every rank that run_world_raw starts from it.

A forked rank is what a fresh ``python -c "import _spawn; _spawn._child_main()"`` would be:
its own session, stdin from /dev/null, stdout and stderr on the launch's files, the working
directory and the whole environment of the request (os.environ is replaced, so C getenv sees
it), then ``_spawn._child_main()``. ringreduce itself is never imported by the server (the
server sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 for its own import of torch), so every
RINGREDUCE_* variable is read fresh by each rank, as are the launch variables. A launch whose
environment differs from the server's in anything else -- a variable torch or Python might
read at start-up (LD_PRELOAD, PYTHONPATH, TORCH_*, OMP_NUM_THREADS ...) -- is not served: the
caller starts a fresh interpreter as before. ``RR_SPAWN_FORK=0`` turns the server off.

The server is the ranks' parent: it reaps them and writes each exit status (as
subprocess.Popen.returncode reports it: -N for signal N) to the launch's status file; Forked
offers the part of Popen that run_world_raw uses. The server dies with the test process
(PR_SET_PDEATHSIG, and EOF on its request pipe), and its ranks die with it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

# Read by each rank after the fork, so they may differ from launch to launch.
_PER_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_PER_LAUNCH_PREFIXES = ("RINGREDUCE_", "RR_SPAWN_")


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k not in _PER_LAUNCH and not k.startswith(_PER_LAUNCH_PREFIXES)}


class Forked:
    """The part of subprocess.Popen that run_world_raw uses, for a rank the server forked."""

    def __init__(self, pid: int, status: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status = status

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                text = self._status.read_text()
            except FileNotFoundError:
                return None
            self.returncode = int(text)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"forked rank {self.pid}", timeout or 0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)


class _Server:
    def __init__(self, env: Mapping[str, str], cwd: str) -> None:
        self.startup = _startup_env(env)
        self.cwd = cwd
        senv = dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0", RR_SPAWN_PARENT=str(os.getpid()))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import _zygote; _zygote._server_main()"], env=senv, cwd=cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.ready = self._reply(timeout=120) == "ready"

    def _reply(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().decode().strip() if r else ""

    def fork(self, env: Mapping[str, str], out: Path, err: Path, status: Path) -> Forked | None:
        assert self.proc.stdin is not None
        req = {"env": dict(env, RR_SPAWN_PARENT=str(self.proc.pid)), "cwd": self.cwd,
               "out": str(out), "err": str(err), "status": str(status)}
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        reply = self._reply(timeout=30)
        return Forked(int(reply), status) if reply.isdigit() else None

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()


_LOCK = threading.Lock()
_SERVER: list[_Server] = []


def spawn(env: Mapping[str, str], cwd: str, out: Path, err: Path,
          status: Path) -> Forked | None:
    """Fork a rank with this environment from the server (started on first use), or None
    when the server cannot serve it (the caller then starts a fresh interpreter)."""
    if os.environ.get("RR_SPAWN_FORK", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    with _LOCK:
        if _SERVER and _SERVER[0].proc.poll() is not None:
            _SERVER.pop()  # it died: start another
        if not _SERVER:
            _SERVER.append(_Server(env, cwd))
        server = _SERVER[0]
        if not server.ready or server.cwd != cwd or server.startup != _startup_env(env):
            return None
        return server.fork(env, out, err, status)


# ----------------------------------------------------------------------------- server side


def _server_main() -> None:
    import _spawn

    _spawn._die_with_parent()
    import numpy  # noqa: F401 - the point: imported once, shared by every fork
    import torch.distributed  # noqa: F401

    if "ringreduce" in sys.modules:  # ranks must read RINGREDUCE_* themselves
        os._exit(3)
    os.write(1, b"ready\n")
    statuses: dict[int, str] = {}
    buf = b""
    while True:
        r, _, _ = select.select([0], [], [], 0.02)
        if r:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the test process is gone
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _rank_main(req)  # never returns
                statuses[pid] = req["status"]
                os.write(1, f"{pid}\n".encode())
        _reap(statuses)
    for pid in statuses:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


def _reap(statuses: dict[int, str]) -> None:
    while statuses:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = statuses.pop(pid, None)
        if path is not None:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(os.waitstatus_to_exitcode(st)))
            os.replace(tmp, path)


def _rank_main(req: dict) -> None:
    try:
        os.setsid()
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY),
                                (2, req["err"], os.O_WRONLY)):
            new = os.open(path, flags)
            os.dup2(new, fd)
            os.close(new)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import _spawn

        _spawn._child_main()  # ends in os._exit
    except BaseException:  # noqa: BLE001 - report, never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)
