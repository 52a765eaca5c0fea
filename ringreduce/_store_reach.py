"""Whether the store's address can be reached, found out in Python before torch's TCPStore
constructor is called.

torch's constructor retries an unreachable address (no route, nothing listening yet) in C++
until its timeout and overshoots it (10 s became 19-25 s): init() stops waiting at its own
deadline, but the helper thread stays inside C++ -- and when the failing program then exits,
the thread coming back while the interpreter finalizes aborts the process ("terminate called
without an active exception", SIGABRT; found by a helper with an unroutable MASTER_ADDR,
3 runs in 7). Connect attempts made here are plain sockets with short timeouts: a rank only
calls the constructor once something listens there, and rank 0 fails at once on an address
its host has no route to (it hosts the store there).
"""

from __future__ import annotations

import errno
import socket
import time

_NO_ROUTE = (errno.ENETUNREACH, errno.EHOSTUNREACH)


def wait_listening(host: str, port: int, deadline: float) -> bool:
    """Whether something accepts connections at host:port before `deadline` (monotonic)."""
    pause = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(2.0, left))):
                return True
        except OSError:
            if time.monotonic() + pause >= deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.5)


def no_route(host: str, port: int) -> str | None:
    """Rank 0, before it starts the store: why its host cannot reach host:port at all (the
    kernel has no route: MASTER_ADDR is not an address of rank 0's host), else None."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return None
    except OSError as e:
        return e.strerror if e.errno in _NO_ROUTE else None


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
