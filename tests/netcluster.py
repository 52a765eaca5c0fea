"""An emulated cluster on one Linux machine: each "host" is a network namespace.

Host i is a namespace with address 10.77.0.{i+1}/24 on its ``eth0``; every host's veth
peer is a port of one bridge in the root namespace, so the hosts reach each other and
nothing else. Links can be rate-limited with tc tbf (both directions), cut and restored.
Needs root, ``ip`` and, for rate limits only, ``tc`` (both from iproute2). netem (delay,
loss) is not used: many kernels, these test machines included, ship without sch_netem.

Names are unique per cluster: ``rrn<pid>-<seq>`` then ``b`` (bridge), ``v<i>`` (host i's
veth, root side) or ``h<i>`` (host i's namespace), so two test runs at once never share a
device; the addresses can repeat because each run's hosts only see their own bridge.
Interface names must fit 15 characters, hence the short scheme (at most 99 hosts).

A cluster whose owner died without tearing down (SIGKILL, pytest-timeout's os._exit) is
removed by ``cleanup_stale()``, which the test fixture calls before building a new one:
a cluster is stale when the pid in its name is gone, or is this process's pid but the
cluster is not one of ours (pid reuse).

    from netcluster import Cluster
    with Cluster(4, rate="1gbit") as c:
        subprocess.run(c.exec_prefix(0) + ["ping", "-c1", c.addr(3)], timeout=10)

From a shell (benchmarks): ``python tests/netcluster.py --help``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import final

PREFIX = "rrn"
SUBNET = "10.77.0"  # host i is SUBNET.(i+1); only ever assigned inside our namespaces
MAX_HOSTS = 99  # "rrn" + 7-digit pid + "-" + seq + "v99" = 15 characters, the kernel's limit
_SEQ_CHARS = "0123456789abcdefghijklmnopqrstuvwxy"  # "z" is the availability probe's
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)-([0-9a-z])([bvh])(\d*)$")
_CMD_TIMEOUT = 20.0  # seconds for one ip/tc call; they take milliseconds
_INSTALL_HINT = "install iproute2 (apt-get install iproute2)"

_LIVE: set[str] = set()  # tags of the clusters this process has up


class NetclusterError(RuntimeError):
    """An ip/tc command failed; the message names the command and its stderr."""


def _run(args: Sequence[str], *, check: bool = True,
         timeout: float = _CMD_TIMEOUT) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(list(args), check=False, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise NetclusterError(f"{args[0]} not found: {_INSTALL_HINT}") from e
    except subprocess.TimeoutExpired as e:
        raise NetclusterError(f"`{' '.join(args)}` took over {timeout:.0f} s; is the machine "
                              "overloaded or the netlink socket stuck?") from e
    if check and p.returncode != 0:
        raise NetclusterError(f"`{' '.join(args)}` failed (exit {p.returncode}): "
                              f"{p.stderr.strip() or p.stdout.strip()}")
    return p


# ----------------------------------------------------------------------------- availability


def unavailable() -> str | None:
    """Why no emulated cluster can be built here (a skip reason), or None if one can.
    Probes exactly what Cluster needs: a namespace, a veth pair into it and a bridge."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "needs root for network namespaces (run the tests as root, e.g. in a container)"
    if not shutil.which("ip"):
        return f"the ip command is missing: {_INSTALL_HINT}"
    tag = f"{PREFIX}{os.getpid()}-z"
    ns, veth, br = f"{tag}h0", f"{tag}v0", f"{tag}b"
    steps = [(["ip", "netns", "add", ns], "cannot create network namespaces"),
             (["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
              "cannot create veth pairs (kernel module veth?)"),
             (["ip", "link", "add", br, "type", "bridge"],
              "cannot create bridges (kernel module bridge?)")]
    try:
        for args, what in steps:
            try:
                _run(args)
            except NetclusterError as e:
                return f"{what}: {e}"
        return None
    finally:
        _run(["ip", "netns", "del", ns], check=False)
        _run(["ip", "link", "del", veth], check=False)
        _run(["ip", "link", "del", br], check=False)


def tc_unavailable() -> str | None:
    """Why links cannot be rate-limited here (tc missing), or None."""
    if not shutil.which("tc"):
        return f"the tc command is missing (needed for rate limits): {_INSTALL_HINT}"
    return None


# ----------------------------------------------------------------------------- stale clusters


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _our_names() -> tuple[list[str], list[str]]:
    """(namespaces, root-namespace links) whose names follow our scheme."""
    nss = [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines()
           if line.strip()]
    links = []
    for line in _run(["ip", "-o", "link", "show"]).stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            links.append(parts[1].strip().split("@")[0])
    return ([n for n in nss if _NAME_RE.match(n)], [n for n in links if _NAME_RE.match(n)])


def _is_stale(name: str) -> bool:
    m = _NAME_RE.match(name)
    if not m:
        return False
    pid, tag = int(m.group(1)), f"{PREFIX}{m.group(1)}-{m.group(2)}"
    if pid == os.getpid():
        return tag not in _LIVE
    return not _pid_alive(pid)


def cleanup_stale() -> list[str]:
    """Delete namespaces, veths and bridges left by clusters whose owner is gone; returns
    their names. Never touches a live process's cluster."""
    gone = []
    # Namespaces first: deleting one destroys its veth pair, root side included.
    for name in [n for n in _our_names()[0] if _is_stale(n)]:
        if _run(["ip", "netns", "del", name], check=False).returncode == 0:
            gone.append(name)
    links = sorted((n for n in _our_names()[1] if _is_stale(n)), key=lambda n: n.endswith("b"))
    for name in links:  # veths whose namespace was already gone, then bridges
        if _run(["ip", "link", "del", name], check=False).returncode == 0:
            gone.append(name)
    return gone


# ----------------------------------------------------------------------------- the cluster


def _new_tag() -> str:
    pid = os.getpid()
    taken = set()
    nss, links = _our_names()
    for n in nss + links:
        m = _NAME_RE.match(n)
        if m and int(m.group(1)) == pid:
            taken.add(m.group(2))
    for ch in _SEQ_CHARS:
        tag = f"{PREFIX}{pid}-{ch}"
        if tag not in _LIVE and ch not in taken:
            return tag
    raise NetclusterError(f"process {pid} already has {len(_SEQ_CHARS)} clusters up; "
                          "tear some down (Cluster.down) first")


@final
class Cluster:
    """`hosts` namespaces on one bridge; rate="none" leaves links unshaped, else a tc rate
    such as "1gbit" applied with tbf in both directions. Built on construction; call
    down() (or use it as a context manager) to remove everything it made."""

    def __init__(self, hosts: int, rate: str = "none", *, burst: str = "256kb",
                 latency: str = "50ms"):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts={hosts}: pick 1..{MAX_HOSTS}")
        self.hosts = hosts
        self.tag = _new_tag()
        _LIVE.add(self.tag)  # before the first device exists, so cleanup_stale spares it
        try:
            self._up(rate, burst, latency)
        except BaseException:
            self.down()
            raise

    # Names and addresses.
    @property
    def bridge(self) -> str:
        return f"{self.tag}b"

    def veth(self, host: int) -> str:
        """Host `host`'s link as seen from the root namespace (cut it to partition the host)."""
        return f"{self.tag}v{self._check(host)}"

    def netns(self, host: int) -> str:
        return f"{self.tag}h{self._check(host)}"

    def addr(self, host: int) -> str:
        return f"{SUBNET}.{self._check(host) + 1}"

    def exec_prefix(self, host: int) -> list[str]:
        """Command prefix that runs a program on host `host`."""
        return ["ip", "netns", "exec", self.netns(host)]

    def on(self, host: int, *args: str) -> subprocess.CompletedProcess:
        """Run a command on host `host` (in its namespace); raises NetclusterError on failure."""
        return _run(self.exec_prefix(host) + list(args))

    def prefix(self, per_host: int) -> dict[int, list[str]]:
        """rank -> exec prefix with `per_host` consecutive ranks per host (for run_world)."""
        return {r: self.exec_prefix(r // per_host) for r in range(self.hosts * per_host)}

    def _check(self, host: int) -> int:
        if not 0 <= host < self.hosts:
            raise ValueError(f"host {host} is not in this {self.hosts}-host cluster")
        return host

    # Building and changing links.
    def _up(self, rate: str, burst: str, latency: str) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i in range(self.hosts):
            ns = self.netns(i)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", self.veth(i), "type", "veth", "peer", "name", "eth0",
                  "netns", ns])
            _run(["ip", "link", "set", self.veth(i), "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if rate != "none":
                self.shape(i, rate, burst=burst, latency=latency)

    def shape(self, host: int, rate: str, *, burst: str = "256kb", latency: str = "50ms",
              inbound: bool = True) -> None:
        """Rate-limit host `host`'s traffic out (and in, unless inbound=False) with tbf,
        replacing any earlier limit."""
        why = tc_unavailable()
        if why:
            raise NetclusterError(why)
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        self.on(host, "tc", "qdisc", "replace", "dev", "eth0", *tbf)
        if inbound:  # the root side's egress is the host's ingress
            _run(["tc", "qdisc", "replace", "dev", self.veth(host), *tbf])

    def link(self, host: int, state: str, *more: str) -> None:
        """Cut ("down") or restore ("up") host `host`'s only link, or change its root side
        with `ip link set` settings (`link(1, "mtu", "1000")`)."""
        if not more and state not in ("up", "down"):
            raise ValueError(f"state {state!r}: use 'up' or 'down'")
        _run(["ip", "link", "set", self.veth(host), state, *more])

    def down(self) -> None:
        """Remove every namespace and device of this cluster; safe to call twice. Tries
        every step even when one fails (then raises the first failure at the end)."""
        steps = []
        for i in range(self.hosts):
            steps.append(["ip", "netns", "del", self.netns(i)])
            steps.append(["ip", "link", "del", self.veth(i)])  # gone with the ns, usually
        steps.append(["ip", "link", "del", self.bridge])
        errors = []
        for args in steps:
            try:
                _run(args, check=False)  # "does not exist" is fine: already gone
            except NetclusterError as e:
                errors.append(e)
        _LIVE.discard(self.tag)  # anything left is now stale: cleanup_stale() takes it
        if errors:
            raise errors[0]

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


# ----------------------------------------------------------------------------- CLI


def _cmd_up(a: argparse.Namespace) -> int:
    cleanup_stale()
    stop = {"sig": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stop["sig"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with Cluster(a.hosts, a.rate) as c:
        for i in range(c.hosts):
            print(f"host {i}: {c.addr(i)}  {' '.join(c.exec_prefix(i))} CMD", flush=True)
        print(f"cut host i's link: ip link set {c.tag}v<i> down; this process removes the "
              f"cluster on Ctrl-C, SIGTERM or after {a.hold:.0f} s", flush=True)
        deadline = time.monotonic() + a.hold
        while not stop["sig"] and time.monotonic() < deadline:
            time.sleep(0.2)
    return 0


def _cmd_run(a: argparse.Namespace) -> int:
    """Start a.cmd once per rank inside its host, torchrun-style environment, and wait."""
    import socket

    cmd = a.cmd
    if not cmd:
        print("netcluster run: give the command after --, e.g. run 2 -- python3 job.py",
              file=sys.stderr)
        return 2
    cleanup_stale()
    with socket.socket() as s:  # any free port; the rank-0 host's namespace has all free
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = a.hosts * a.per_host
    with Cluster(a.hosts, a.rate) as c:
        procs = []
        try:
            for r in range(world):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world),
                           LOCAL_RANK=str(r % a.per_host), LOCAL_WORLD_SIZE=str(a.per_host),
                           MASTER_ADDR=c.addr(0), MASTER_PORT=str(port),
                           GLOO_SOCKET_IFNAME="eth0")
                procs.append(subprocess.Popen(c.exec_prefix(r // a.per_host) + cmd, env=env,
                                              stdout=None if r == 0 else subprocess.DEVNULL))
            deadline = time.monotonic() + a.timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)
            late = [r for r, p in enumerate(procs) if p.poll() is None]
            if late:
                print(f"netcluster run: rank(s) {late} still running after {a.timeout:.0f} s; "
                      "killed (raise --timeout for longer jobs)", file=sys.stderr)
                return 124
            return max(abs(p.returncode) for p in procs)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python tests/netcluster.py",
        description="Emulated cluster on this machine (root): one network namespace per "
                    f"host, addresses {SUBNET}.1.., one bridge, optional tbf rate limits.",
        epilog="example: python tests/netcluster.py run 4 1gbit -- python -m ringreduce.bench "
               "-b 1M -e 64M -f 4 --compare gloo --json out.json")
    sub = p.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up", help="build a cluster, print how to use it, hold it until "
                        "Ctrl-C/SIGTERM or --hold seconds, then remove it")
    run = sub.add_parser("run", help="build a cluster, run the command after -- once per rank "
                         "inside its host (RANK, WORLD_SIZE, MASTER_ADDR, ... set), remove it")
    for s in (up, run):
        s.add_argument("hosts", type=int)
        s.add_argument("rate", nargs="?", default="none", help='tc rate such as "1gbit", '
                       'or "none" (default)')
    up.add_argument("--hold", type=float, default=3600.0, metavar="S")
    run.add_argument("--per-host", type=int, default=1, metavar="K", help="ranks per host")
    run.add_argument("--timeout", type=float, default=1800.0, metavar="S")
    sub.add_parser("cleanup", help="remove clusters whose owning process is gone")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # run's CMD: everything after --
    a = p.parse_args(argv[:cut])
    a.cmd = argv[cut + 1:]
    why = unavailable()
    if why:
        print(f"netcluster: {why}", file=sys.stderr)
        return 2
    if a.what == "cleanup":
        for name in cleanup_stale():
            print(f"removed {name}")
        return 0
    return _cmd_up(a) if a.what == "up" else _cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
