"""Whether the TCPStore server this process talks to has closed its side (Linux /proc).

A rank that reaches destroy() long after rank 0 (which hosts the store and stops it when its
farewell gives up waiting) would otherwise find out with a store call, and torch's TCPStore
logs a C++ stack trace ("recvValue failed ... Did the remote server shutdown or crash?")
before raising, in a job where nothing failed. The kernel already knows: the client's
socket to the server is in CLOSE_WAIT once the server closed it. Reading that sends
nothing, so the server (if it is still there) sees no stray connection.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from typing import Any, Callable

_CLOSE_WAIT = "08"  # include/net/tcp_states.h
_LISTEN = "0A"


def find_store(store: Any, pred: Callable[[Any], bool]) -> Any:
    """The first of `store` and the stores under it (PrefixStore.underlying_store) for which
    pred holds, or None."""
    for _ in range(64):
        if pred(store):
            return store
        nxt = getattr(store, "underlying_store", None)
        if nxt is None or nxt is store:
            return None
        store = nxt
    return None


def _store_port(store: Any) -> int | None:
    """The port of the TCPStore under `store` (through PrefixStores), or None."""
    s = find_store(store, lambda s: isinstance(getattr(s, "port", None), int) and s.port > 0)
    return None if s is None else s.port


def _socket_fds(proc: str = "self") -> dict:
    """The sockets of process `proc` (a pid; this process by default): inode -> fd."""
    out = {}
    try:
        for fd in os.listdir(f"/proc/{proc}/fd"):
            try:
                link = os.readlink(f"/proc/{proc}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out[link[8:-1]] = int(fd)
    except OSError:
        pass
    return out


def _ip(hexaddr: str) -> Any:
    """An address as /proc/net/tcp{,6} writes it (host-order 32-bit words), as an
    ipaddress object; IPv4-mapped IPv6 as IPv4."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    return plain_ip(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1]
                                                  for i in range(0, 16, 4))))


def plain_ip(a: Any) -> Any:
    """An ipaddress object, an IPv4-mapped IPv6 one as the IPv4 address it maps (how a
    dual-stack socket shows an IPv4 peer)."""
    return getattr(a, "ipv4_mapped", None) or a


def _own_rows() -> Iterator[tuple[list, int]]:
    """(columns, fd) of each row of /proc/self/net/tcp{,6} that is a socket of this
    process."""
    mine = _socket_fds()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                rows = [cols for cols in map(str.split, f)
                        if len(cols) >= 10 and cols[9] in mine]
        except OSError:
            continue
        yield from ((cols, mine[cols[9]]) for cols in rows)


def _port(endpoint: str) -> int:
    return int(endpoint.rpartition(":")[2], 16)


def _connections(port: int, addrs: Any = None) -> list:
    """(tcp state, fd, socket inode) of this process's TCP connections whose remote port is
    `port` (and remote address one of `addrs`, ipaddress objects, unless None)."""
    return [(cols[3], fd, cols[9]) for cols, fd in _own_rows()
            if _port(cols[2]) == port and (addrs is None or _ip(cols[2].rpartition(":")[0])
                                           in addrs)]


def client_sockets(port: int, addrs: Any = None) -> list:
    """(fd, inode) of this process's connections to `port` at `addrs` (see _connections):
    a store's clients, not its server's accepted sockets (those have it as their local
    port)."""
    return [(fd, inode) for _, fd, inode in _connections(port, addrs)]


def can_tell() -> bool:
    """Whether this process's sockets can be read (/proc/self/net/tcp: serves() and
    server_closed() say False when they cannot tell)."""
    return os.path.exists("/proc/self/net/tcp")


def serves(store: Any) -> bool:
    """True if this process listens on the port of the TCPStore under `store` (it runs that
    store's server) and did not inherit that socket from its parent (a child forked by the
    process serving it); False when it does not or it cannot be told."""
    port = _store_port(store)
    if port is None:
        return False
    mine = {cols[9] for cols, _ in _own_rows() if cols[3] == _LISTEN and _port(cols[1]) == port}
    return bool(mine) and mine.isdisjoint(_socket_fds(str(os.getppid())))


def server_closed(store: Any) -> bool:
    """True if every connection of this process to the store's port is half-closed by the
    server (CLOSE_WAIT) -- it stopped; False when one is still open, or it cannot be told
    (no /proc, not a TCPStore, no connection found)."""
    port = _store_port(store)
    if port is None:
        return False
    states = [c[0] for c in _connections(port)]
    return bool(states) and all(s == _CLOSE_WAIT for s in states)


def store_host(store: Any) -> str | None:
    """The host of the TCPStore under `store` (through PrefixStores), or None (FileStore,
    HashStore, a store without one)."""
    s = find_store(store, lambda s: isinstance(getattr(s, "host", None), str)
                            and bool(s.host))
    return None if s is None else s.host
