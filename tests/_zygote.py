"""A fork server for the suite's ranks: one process imports numpy and torch once (2-4
CPU-seconds per fresh interpreter on a small CI machine, most of a short test's cost) and
forks every rank that run_world_raw starts from it.

A forked rank is what a fresh ``python -c "import _spawn; _spawn._child_main()"`` would be:
its own session, stdin from /dev/null, stdout and stderr on the launch's files, the working
directory and the whole environment of the request (os.environ is replaced, so C getenv sees
it), then ``_spawn._child_main()``. ringreduce itself is never imported by the server (the
server sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 for its own import of torch), so every
RINGREDUCE_* variable is read fresh by each rank, as are the launch variables. Launches are
grouped by the rest of their environment (what torch or Python might read at start-up:
PYTHONPATH, TORCH_*, OMP_NUM_THREADS ...): one server per such environment, at most four at
once; a launch with LD_PRELOAD (the ASan test) is not served, nor a rank with a rank_prefix:
the caller starts a fresh interpreter for those, as before. ``RR_SPAWN_FORK=0`` turns the
server off. Forked ranks share the server's string-hash seed, which fresh interpreters each
drew anew.

The server is the ranks' parent: it reaps them and writes each exit status (as
subprocess.Popen.returncode reports it: -N for signal N) to the launch's status file; Forked
offers the part of Popen that run_world_raw uses. The server ends when its request pipe
closes (the test process ended, however), killing its ranks; ranks also die with it
(PR_SET_PDEATHSIG, set by _spawn._child_main).
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
_PER_LAUNCH_PREFIXES = ("RINGREDUCE_", "RR_SPAWN_", "PYTEST_")  # PYTEST_CURRENT_TEST changes
_MAX_SERVERS = 4  # start-up environments served at once (the oldest server goes first)


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k not in _PER_LAUNCH and not k.startswith(_PER_LAUNCH_PREFIXES)}


class Forked:
    """The part of subprocess.Popen that run_world_raw uses, for a rank the server forked."""

    def __init__(self, pid: int, status: Path, server: subprocess.Popen) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status = status
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int(self._status.read_text())
            except FileNotFoundError:
                # A server that died took its ranks along (they die with it) and can no
                # longer report them: a rank that is gone was killed.
                if self._server.poll() is not None and not os.path.exists(f"/proc/{self.pid}"):
                    self.returncode = -signal.SIGKILL
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
        self.cwd = cwd
        self.serial = 0
        senv = dict(env, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import _zygote; _zygote._server_main()"], env=senv, cwd=cwd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.ready = self._reply(timeout=120) == "ready"
        if not self.ready:
            self.close()

    def _reply(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().decode().strip() if r else ""

    def fork(self, env: Mapping[str, str], out: Path, err: Path, status: Path) -> Forked | None:
        """The forked rank, or None (the server could not fork it; the caller starts a fresh
        interpreter). A reply out of step closes the server: its next replies could not be
        trusted."""
        assert self.proc.stdin is not None
        self.serial += 1
        req = {"id": self.serial, "env": dict(env, RR_SPAWN_PARENT=str(self.proc.pid)),
               "cwd": self.cwd, "out": str(out), "err": str(err), "status": str(status)}
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
            reply = self._reply(timeout=30).split()
        except BaseException:
            self.close()  # a fork may have happened: its rank dies with the server
            raise
        if len(reply) == 2 and reply[0] == str(self.serial) and reply[1].isdigit():
            return Forked(int(reply[1]), status, self.proc)
        if reply != [str(self.serial), "ERR"]:
            self.close()
        return None

    def close(self) -> None:
        self.ready = False
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


_LOCK = threading.Lock()
_SERVERS: dict[tuple, _Server] = {}  # start-up environment -> its server, oldest first


def spawn(env: Mapping[str, str], cwd: str, out: Path, err: Path,
          status: Path) -> Forked | None:
    """Fork a rank with this environment from the server for its start-up environment
    (started on first use), or None when no server can serve it (the caller then starts a
    fresh interpreter)."""
    if os.environ.get("RR_SPAWN_FORK", "1") == "0" or not sys.platform.startswith("linux") \
            or "LD_PRELOAD" in env:
        return None
    key = (cwd, tuple(sorted(_startup_env(env).items())))
    with _LOCK:
        server = _SERVERS.get(key)
        if server is not None and (not server.ready or server.proc.poll() is not None):
            server.close()
            del _SERVERS[key]  # it died: start another
            server = None
        if server is None:
            while len(_SERVERS) >= _MAX_SERVERS:
                _SERVERS.pop(next(iter(_SERVERS))).close()
            server = _SERVERS[key] = _Server(env, cwd)
        return server.fork(env, out, err, status) if server.ready else None


# ----------------------------------------------------------------------------- server side


def _server_main() -> None:
    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started the server ends (a
    # test running run_world in a thread). EOF on the request pipe says the test process is
    # gone, however it ended.
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
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                _serve(json.loads(line), statuses)
        _reap(statuses)
    for pid in statuses:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)


def _serve(req: dict, statuses: dict[int, str]) -> None:
    try:
        pid = os.fork()
    except OSError:
        os.write(1, f"{req['id']} ERR\n".encode())
        return
    if pid == 0:
        _rank_main(req)  # never returns
    statuses[pid] = req["status"]
    os.write(1, f"{req['id']} {pid}\n".encode())


def _reap(statuses: dict[int, str]) -> None:
    while statuses:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = statuses.pop(pid, None)
        if path is None:
            continue
        try:
            with open(path + ".tmp", "w") as f:
                f.write(str(os.waitstatus_to_exitcode(st)))
            os.replace(path + ".tmp", path)
        except OSError:  # the launch gave up on this rank and removed its directory
            pass


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
