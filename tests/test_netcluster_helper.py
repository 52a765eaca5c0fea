"""The emulated-cluster helper itself (tests/netcluster.py): hosts reach each other, a cut
link cuts, two clusters at once do not collide, a crashed owner's cluster is cleaned up and
the skip reasons say what to do. Root-only parts skip like test_netcluster.py."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from netcluster import Cluster, cleanup_stale, unavailable

TESTS = Path(__file__).resolve().parent
_REASON = unavailable()
_skip_netns = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def needs_netns(f: Callable[[], None]) -> Callable[[], None]:
    """Marked `netns` (deselect with -m "not netns") and skipped where namespaces cannot be."""
    return pytest.mark.netns(_skip_netns(f))

# Host `dst` listens (and says so), host `src` connects and sends a byte within `patience`
# seconds; the server exits 0 once the byte arrived.
_SERVER = ("import socket,sys;s=socket.socket();s.settimeout(30);"
           "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((sys.argv[1],7777));"
           "s.listen();print('L',flush=True);c,_=s.accept();c.settimeout(10);"
           "sys.exit(0 if c.recv(1)==b'x' else 1)")
_CLIENT = ("import socket,sys,time\nend=time.monotonic()+float(sys.argv[2])\nwhile True:\n"
           " try:\n  socket.create_connection((sys.argv[1],7777),timeout=1).sendall(b'x');break\n"
           " except OSError:\n  time.sleep(0.05)\n  if time.monotonic()>end: sys.exit(1)")


def _talk(c: Cluster, src: int, dst: int, patience: float = 10.0) -> bool:
    """Can host `src` open a TCP connection to host `dst`? The client starts only once the
    server listens, so a loaded machine cannot turn a slow start into "unreachable"."""
    srv = subprocess.Popen(c.exec_prefix(dst) + [sys.executable, "-c", _SERVER, c.addr(dst)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert srv.stdout is not None
        ready, _, _ = select.select([srv.stdout], [], [], 30)
        assert ready and srv.stdout.readline().strip() == "L", "test server never listened"
        cli = subprocess.run(c.exec_prefix(src) + [sys.executable, "-c", _CLIENT, c.addr(dst),
                                                   str(patience)],
                             stderr=subprocess.DEVNULL, timeout=patience + 30, check=False)
        return cli.returncode == 0 and srv.wait(timeout=20) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait(timeout=10)
        if srv.stdout is not None:
            srv.stdout.close()


def _ours() -> tuple[set[str], set[str]]:
    nss = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20,
                         check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           timeout=20, check=True).stdout
    return ({ln.split()[0] for ln in nss.splitlines() if ln.strip()},
            {ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()})


@needs_netns
@pytest.mark.timeout(60)
def test_two_clusters_at_once_then_nothing_left() -> None:
    with Cluster(2) as a, Cluster(2) as b:
        assert a.tag != b.tag and a.addr(1) == b.addr(1)  # same addresses, separate bridges
        assert _talk(a, 0, 1) and _talk(b, 1, 0)
        a.link(1, "down")
        assert not _talk(a, 0, 1, patience=2), "host 1 still reachable after its link was cut"
        assert _talk(b, 0, 1), "cutting a link of one cluster affected the other"
        a.link(1, "up")
        assert _talk(a, 0, 1)
    nss, links = _ours()
    left = {n for n in nss | links if n.startswith((a.tag, b.tag))}
    assert not left, f"left behind: {sorted(left)}"


@needs_netns
@pytest.mark.timeout(60)
def test_crashed_owner_is_cleaned_up_and_live_clusters_are_not() -> None:
    code = ("import os,sys;sys.path.insert(0,sys.argv[1]);import netcluster as n;"
            "c=n.Cluster(2,'none');print(c.tag,flush=True);os.kill(os.getpid(),9)")
    p = subprocess.run([sys.executable, "-c", code, str(TESTS)], capture_output=True,
                       text=True, timeout=30, check=False)
    assert p.returncode == -signal.SIGKILL, p.stderr
    dead = p.stdout.strip()
    with Cluster(1) as mine:
        # A test run beside this one may clean the dead cluster up first (its fixture calls
        # cleanup_stale too), so assert the state afterwards, not who removed it.
        gone = cleanup_stale()
        assert mine.tag not in "".join(gone)
        nss, links = _ours()
        assert not {n for n in nss | links if n.startswith(dead)}
        assert mine.netns(0) in nss and mine.bridge in links


def test_skip_reasons_say_what_to_do() -> None:
    # unavailable() where `ip` cannot be found, and (when root) after dropping to nobody.
    code = ("import os,sys;sys.path.insert(0,sys.argv[1]);import netcluster as n\n"
            "if sys.argv[2]=='drop': os.setgid(65534);os.setuid(65534)\n"
            "print(n.unavailable())")

    def reason(how: str, **env: str) -> str:
        return subprocess.run([sys.executable, "-c", code, str(TESTS), how], capture_output=True,
                              text=True, timeout=30, check=True,
                              env=dict(os.environ, **env)).stdout

    if os.geteuid() != 0:
        assert "needs root" in reason("keep")
        return
    assert "apt-get install iproute2" in reason("keep", PATH="/nonexistent")
    assert "needs root" in reason("drop")
