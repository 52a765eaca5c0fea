"""How many CPUs this process may actually run on (and the memory its cgroup allows).

``os.cpu_count()`` counts the machine's CPUs. A rank started under ``taskset``/``numactl``
(affinity mask) or in a container with a CPU limit (cgroup quota) gets fewer, and spinning
while waiting then steals the very core a peer needs. Everything that decides whether to spin
or whether ranks are oversubscribed asks :func:`usable_cpus` instead.

Standard library only, and no other ringreduce import, so the launcher and tests can use it
before the C++ extension is built.
"""

from __future__ import annotations

import math
import os
from typing import Callable

__all__ = ["cgroup_cpu_limit", "cgroup_memory_limit", "usable_cpus"]

_CGROUP_ROOT = "/sys/fs/cgroup"
_PROC_CGROUP = "/proc/self/cgroup"


def usable_cpus(cgroup_root: str = _CGROUP_ROOT, proc_cgroup: str = _PROC_CGROUP) -> int:
    """CPUs this process may use: the affinity mask's size, further capped by the cgroup CPU
    quota (rounded up: 1.5 CPUs of quota keep two cores partly busy), at least 1.

    The arguments exist for tests (fake cgroup trees); callers use the defaults.
    """
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cgroup_root, proc_cgroup)
    if limit is not None:
        n = min(n, math.ceil(limit))
    return max(1, n)


def cgroup_cpu_limit(cgroup_root: str = _CGROUP_ROOT,
                     proc_cgroup: str = _PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period), or None when there
    is none or it cannot be read.

    cgroup v2: ``cpu.max`` ("max 100000" = no limit, "50000 100000" = half a CPU); v1:
    ``cpu.cfs_quota_us`` (-1 = no limit) / ``cpu.cfs_period_us``. An ancestor's quota also
    binds, so the smallest on the way from this cgroup up to the mount root wins. When our
    cgroup's directory is not visible (a container shows the host's path), the mount root
    (the container's own cgroup) is read instead.
    """
    return _cgroup_limit(cgroup_root, proc_cgroup, "cpu", ["cpu,cpuacct", "cpu"], _read_v2,
                         _read_v1)


def cgroup_memory_limit(cgroup_root: str = _CGROUP_ROOT,
                        proc_cgroup: str = _PROC_CGROUP) -> int | None:
    """The memory limit of this process's cgroup in bytes (the smallest up to the mount
    root, as for the CPU quota), or None when there is none or it cannot be read: v2's
    ``memory.max`` ("max" = none), v1's ``memory.limit_in_bytes`` (a huge number = none)."""
    limit = _cgroup_limit(cgroup_root, proc_cgroup, "memory", ["memory"],
                          lambda d: _read_bytes(os.path.join(d, "memory.max")),
                          lambda d: _read_bytes(os.path.join(d, "memory.limit_in_bytes")))
    return None if limit is None else int(limit)


def _cgroup_limit(cgroup_root: str, proc_cgroup: str, controller: str, v1_mounts: list[str],
                  read_v2: Callable[[str], float | None],
                  read_v1: Callable[[str], float | None]) -> float | None:
    """The smallest limit read on the way up from this process's cgroup of `controller`."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":  # v2 unified hierarchy
            limits += _walk(cgroup_root, path, read_v2)
        elif controller in controllers.split(","):  # v1, e.g. "cpu,cpuacct"
            for mount in dict.fromkeys([controllers, *v1_mounts]):
                base = os.path.join(cgroup_root, mount)
                if os.path.isdir(base):
                    limits += _walk(base, path, read_v1)
                    break
    return min(limits) if limits else None


def _walk(base: str, path: str, read: Callable[[str], float | None]) -> list[float]:
    """Quotas found from base/path up to base (at base alone if base/path is missing)."""
    base = os.path.normpath(base)
    rel = os.path.normpath(path.strip("/")) if path.strip("/") else ""
    d = os.path.join(base, rel) if rel and not rel.startswith("..") else base
    if not os.path.isdir(d):
        d = base
    found = []
    while True:
        q = read(d)
        if q is not None:
            found.append(q)
        if d == base:
            return found
        d = os.path.dirname(d)


def _read_v2(d: str) -> float | None:
    text = _read(os.path.join(d, "cpu.max"))
    if text is None:
        return None
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = float(parts[0])
        period = float(parts[1]) if len(parts) > 1 else 100000.0
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read_v1(d: str) -> float | None:
    quota_s = _read(os.path.join(d, "cpu.cfs_quota_us"))
    period_s = _read(os.path.join(d, "cpu.cfs_period_us"))
    if quota_s is None or period_s is None:
        return None
    try:
        quota, period = float(quota_s), float(period_s)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read_bytes(path: str) -> float | None:
    text = _read(path)
    try:
        value = int(text) if text is not None else 0  # v2's "max" is a ValueError
    except ValueError:
        return None
    return float(value) if 0 < value < 1 << 60 else None  # v1: 2^63 - 4096 for none


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None
