"""Whether this host has a route to the store's address, found out before torch's TCPStore
constructor is called.

torch's constructor retries an address it has no route to in C++ until its timeout and
overshoots it (10 s became 19-25 s): init() stops waiting at its own deadline, but the
helper thread stays inside C++ -- and when the failing program then exits, the thread coming
back while the interpreter finalizes aborts the process ("terminate called without an active
exception", SIGABRT; found by a helper with an unroutable MASTER_ADDR, 3 runs in 7). The
route is looked up by connecting a UDP socket, which sends nothing: a rank calls the
constructor only once a route exists, and rank 0 (which hosts the store there) fails at once
without one. The store's server sees no extra connection (a torch TCPStore server slows
down under bursts of them).
"""

from __future__ import annotations

import errno
import socket
import time

_NO_ROUTE = (errno.ENETUNREACH, errno.EHOSTUNREACH)


def no_route(host: str, port: int) -> str | None:
    """Why this host has no route to any address of host:port (strerror), else None (a route
    to one of them, or a question the lookup cannot answer: torch then tries)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError:
        return None  # (a name that does not resolve is reported before this)
    why = None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(addr)
            return None
        except OSError as e:
            if e.errno not in _NO_ROUTE:
                return None
            why = e.strerror
    return why


def wait_routable(host: str, port: int, deadline: float) -> bool:
    """Whether this host has a route to host:port before `deadline` (monotonic; an interface
    may come up meanwhile)."""
    pause = 0.05
    while no_route(host, port) is not None:
        if time.monotonic() + pause >= deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.5)
    return True


def why_unreachable(host: str, port: int) -> str:
    """Why a TCPStore could not be reached, from one plain connect (torch's constructor only
    times out, after retrying): the name, nothing listening, no answer, or a program that
    accepts and never speaks the store's protocol."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return "something accepted the connection but never answered like a torch TCPStore"
    except socket.gaierror as e:
        return f"the name {host!r} does not resolve ({e.strerror or e})"
    except ConnectionRefusedError:
        return "nothing listens there (connection refused)"
    except TimeoutError:
        return "a connection attempt gets no answer (a firewall, or an address not routed here)"
    except OSError as e:
        return f"cannot connect: {e.strerror or e}"
