"""What this process tells its peers through the rendezvous store: the interface address
to listen on (and bounded name resolution) and the host identity.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import threading
from collections.abc import Sequence

# --------------------------------------------------------------------------- addresses

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def _interface_names() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):
        return []


def _ipv4_from_ip_command(ifname: str) -> str | None:
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show", "dev", ifname],
                             capture_output=True, text=True, timeout=5, check=True).stdout
        for link in json.loads(out or "[]"):
            for info in link.get("addr_info", []):
                if info.get("family") == "inet" and info.get("local"):
                    return str(info["local"])
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return None


def _ioctl_ipv4(ifname: str) -> str:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("256s", ifname.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])


def _with_address(name: str) -> str:
    """"eth0 (10.0.0.2)", or "ifb0 (no IPv4 address)": what the hint lists."""
    try:
        return f"{name} ({_ioctl_ipv4(name)})"
    except (OSError, ImportError):
        return f"{name} (no IPv4 address)"


def _hint(names: list[str]) -> str:
    """What a refusal says after its reason: every interface, with its address (one socket
    per interface)."""
    return (f"available interfaces: {', '.join(map(_with_address, names)) or 'none found'}. "
            "Set RINGREDUCE_SOCKET_IFNAME to one with an address (names or prefixes, as "
            "NCCL_SOCKET_IFNAME; a comma-separated list tries each in turn), or unset it to use "
            "the interface that routes to MASTER_ADDR")


def _interface_ipv4(ifname: str, names: list[str]) -> str:
    """`ifname`'s IPv4 address; ValueError saying why there is none (without _hint)."""
    try:
        return _ioctl_ipv4(ifname)
    except OSError as e:
        if e.errno == errno.ENODEV or (names and ifname not in names):
            raise ValueError(f"network interface {ifname!r} does not exist") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ValueError(f"network interface {ifname!r} has no IPv4 address") from None
    except ImportError:
        pass
    addr = _ipv4_from_ip_command(ifname)
    if addr is None:
        raise ValueError(f"cannot find an IPv4 address for interface {ifname!r}")
    return addr


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1", "") or host.startswith("127.")


def resolve(host: str, port: int, timeout: float, what: str) -> list:
    """socket.getaddrinfo(host, port, SOCK_DGRAM) with a deadline: a numeric address is
    parsed at once (no lookup); a name is looked up on a helper thread, and after `timeout`
    seconds this gives up (getaddrinfo has no timeout of its own, and an unreachable DNS
    server blocks it for minutes). Raises ValueError (no such name) or CollectiveTimeout."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM,
                                  flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass  # a name: look it up
    found: list = []
    failed: list[OSError] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM))
        except OSError as e:
            failed.append(e)

    t = threading.Thread(target=lookup, name="ringreduce-resolve", daemon=True)
    t.start()
    t.join(timeout)
    if failed:
        raise ValueError(f"cannot resolve {what}={host!r} ({failed[0]}); set {what} to an "
                         "address every rank can reach")
    if not found:
        from .._C import CollectiveTimeout

        raise CollectiveTimeout(
            f"resolving {what}={host!r} took longer than {timeout:g} s (is the DNS server "
            f"reachable? use a numeric address, or fix /etc/hosts or resolv.conf)")
    return found[0]


def _route_source(master_addr: str, timeout: float) -> str:
    infos = resolve(master_addr, 9, timeout, "MASTER_ADDR")
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # prefer IPv4
    last: OSError | None = None
    for family, _, _, _, sockaddr in infos:
        try:
            # connect() on UDP only picks the route and source address; nothing is sent.
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)
                return str(s.getsockname()[0])
        except OSError as e:
            last = e
    raise ValueError(f"no route to MASTER_ADDR={master_addr!r} ({last}); set "
                     "RINGREDUCE_SOCKET_IFNAME to the interface peers should use")


def _natural(name: str) -> list:
    """Sort key: eth2 before eth10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _ifname_groups(spec: str, names: list[str]) -> tuple[list[list[str]], bool]:
    """RINGREDUCE_SOCKET_IFNAME read as NCCL reads NCCL_SOCKET_IFNAME: a comma-separated
    list of prefixes ("eth" matches eth0, eth1), "=name" for one exact name, and a leading
    "^" to exclude what the list matches instead ("^docker,lo"). Returns the interfaces to
    try, one group per entry in the list's order (the exact name first, then the other
    names it prefixes, eth2 before eth10; the exact name also when nothing else matched,
    or this host cannot list its interfaces, so that its refusal says it does not exist) --
    with "^", one group of every interface not excluded --, and whether `spec` excludes."""
    exclude = spec.startswith("^")
    items = [i.strip() for i in (spec[1:] if exclude else spec).split(",") if i.strip()]

    def hit(item: str, name: str) -> bool:
        return name == item[1:] if item.startswith("=") else name.startswith(item)
    if exclude:
        rest = [n for n in names if not any(hit(i, n) for i in items)]
        return ([rest] if rest else []), True
    groups: list[list[str]] = []
    seen: set[str] = set()
    for item in items:
        exact = item.removeprefix("=")
        more = sorted((n for n in names if n != exact and hit(item, n)), key=_natural)
        group = [n for n in ([exact] if exact in names or not more else []) + more
                 if n and n not in seen]
        seen.update(group)
        if group:
            groups.append(group)
    return groups, False


def select_interface_address(master_addr: str | None, ifname: str | None,
                             timeout: float = 30.0) -> str:
    """The local address this rank should listen on and advertise to its peers.

    With ``ifname`` (RINGREDUCE_SOCKET_IFNAME, as NCCL_SOCKET_IFNAME: _ifname_groups) the
    IPv4 address of an interface it names, its entries tried in turn; where one entry (a
    prefix, or the rest after "^" exclusions) matches several interfaces with an address,
    the one that routes to ``master_addr``, else the first (after "^": the first that is
    not loopback). Otherwise the address of the interface that routes to ``master_addr``,
    or ``"127.0.0.1"`` when ``master_addr`` is unset or a loopback name (``"::1"`` for
    ``::1``). Raises ValueError, listing the available interfaces, when none fits.
    Always returns a numeric address (the C++ core then needs no name lookup); looking up a
    MASTER_ADDR name takes at most ``timeout`` seconds (CollectiveTimeout after that).
    """
    if ifname:
        available = _interface_names()
        groups, exclude = _ifname_groups(ifname.strip(), available)
        if not groups:
            if not exclude:
                why = "names no interface"
            elif available:
                why = "excludes every interface"
            else:
                why = ("needs this host's list of interfaces, which it cannot read: name "
                       "the interface")
            raise ValueError(f"RINGREDUCE_SOCKET_IFNAME={ifname!r} {why}; set it to one or a "
                             f"comma-separated list of names or prefixes (available: "
                             f"{', '.join(available) or 'none found'}), or unset it")
        errors: list[str] = []
        for group in groups:
            found: list[str] = []
            for name in group:
                try:
                    found.append(_interface_ipv4(name, available))
                except ValueError as e:
                    errors.append(str(e))
            if len(found) > 1 and master_addr is not None and not _is_loopback(
                    master_addr.strip()):
                try:
                    route = _route_source(master_addr.strip(), timeout)
                    if route in found:
                        return route
                except ValueError:
                    pass  # no route from here: as without MASTER_ADDR
            if found:
                return next((a for a in found if not _is_loopback(a)), found[0]) \
                    if exclude else found[0]
        raise ValueError("; ".join(errors) + "; " + _hint(available))
    if master_addr is not None and master_addr.strip().strip("[]") == "::1":
        return "::1"  # as given: a host may have no IPv4 loopback (found by a helper)
    if master_addr is None or _is_loopback(master_addr.strip()):
        return _loopback()
    return _route_source(master_addr.strip(), timeout)


def _loopback() -> str:
    """127.0.0.1, or ::1 on a host without IPv4 loopback (where "localhost" is ::1 only:
    listening on 127.0.0.1 failed, and RINGREDUCE_SOCKET_IFNAME takes IPv4 only; a helper)."""
    for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr, 0))
            return addr
        except OSError:
            continue
    return "127.0.0.1"


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def host_identity() -> str:
    """A short string equal for two processes exactly when they can share memory.

    Hostname plus a digest of the kernel boot id (two containers or machines with the same
    hostname differ), the IPC namespace and the device of /dev/shm (containers on one kernel
    with private /dev/shm differ) and the network namespace. Used to decide which peers may use the shm transport.
    """
    facts: Sequence[str] = (
        _read_text("/proc/sys/kernel/random/boot_id"),
        _safe_readlink("/proc/self/ns/ipc"),
        # Separate network namespaces (containers, emulated clusters) count as separate hosts.
        _safe_readlink("/proc/self/ns/net"),
        _shm_device(),
    )
    digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:12]
    # Last, the network alone (kernel and namespace): whether one reaches the other's
    # loopback addresses (containers sharing the host's network but not its /dev/shm do).
    net = hashlib.sha256(f"{facts[0]}\n{facts[2]}".encode()).hexdigest()[:8]
    return f"{socket.gethostname()}/{digest}/{net}"


def unreachable_loopback(addrs: Sequence[str], hosts: Sequence[str]) -> list[tuple[int, list]]:
    """(rank, ranks that cannot reach it) for each rank that published a loopback address
    (host:port or [host]:port) while ranks of another network (host_identity's last part)
    take part: they would dial their own host."""
    nets = [h.rpartition("/")[2] for h in hosts]
    out = []
    for r, a in enumerate(addrs):
        if _is_loopback(a.rpartition(":")[0].strip("[]")):
            away = [p for p, n in enumerate(nets) if n != nets[r]]
            if away:
                out.append((r, away))
    return out


def _safe_readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _shm_device() -> str:
    try:
        return str(os.stat("/dev/shm").st_dev)
    except OSError:
        return ""
