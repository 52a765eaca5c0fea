"""What machine and software a benchmark ran on, recorded in every JSON it writes.

Numbers from this project are only comparable with the machine beside them: the processor
as ``lscpu`` names it, the CPUs this process may use (affinity), memory, kernel, and the
versions of everything measured. Reading it costs a few milliseconds; nothing here fails.
"""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any


def _lscpu() -> dict[str, str]:
    """``lscpu``'s key: value lines (empty where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=5,
                             env=dict(os.environ, LC_ALL="C")).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    pairs = (line.split(":", 1) for line in out.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _cpuinfo_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo(key: str) -> int:
    """/proc/meminfo's `key` in bytes, or 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_bytes() -> int:
    """This machine's memory (MemTotal), or 0 when unknown."""
    return _meminfo("MemTotal")


def available_bytes() -> int:
    """Memory the benchmark's buffers can have now: MemAvailable (MemTotal on kernels
    without it), or this process's cgroup memory limit where that is lower (a container's,
    a Slurm job's); 0 when unknown."""
    from .._cpus import cgroup_memory_limit

    avail = _meminfo("MemAvailable") or _meminfo("MemTotal")
    limit = cgroup_memory_limit()
    return min(avail, limit) if avail and limit else avail or limit or 0


def _mem_gib() -> float | None:
    total = memory_bytes()
    return round(total / 2**30, 1) if total else None


def _git_commit() -> str | None:
    """The checkout's commit (with '+dirty' when tracked code has changes), if run from one."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              check=False, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        # Benchmark outputs (bench/*.json, *.png) do not count: a run rewrites them.
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "-uno", "--", ".",
                                ":(exclude)bench/*.json", ":(exclude)bench/*.png"],
                               check=False, capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001 - absent or broken: record that it is not there
        return None


def describe() -> dict[str, Any]:
    """The machine and software of this process, for a benchmark's JSON ``machine`` field."""
    from .._cpus import usable_cpus

    cpu = _lscpu()
    return {
        "cpu_model": cpu.get("Model name") or _cpuinfo_model(),
        "cpu_vendor": cpu.get("Vendor ID"),
        "cpus": os.cpu_count(),
        "cpus_usable": usable_cpus(),  # affinity mask and cgroup CPU quota
        "hypervisor": cpu.get("Hypervisor vendor"),
        "memory_gib": _mem_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "ringreduce": _version("ringreduce"),
        "ringreduce_commit": _git_commit(),
    }
