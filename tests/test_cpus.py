"""usable_cpus(): the affinity mask and the cgroup CPU quota (v2 cpu.max, v1 cfs files) limit
how many CPUs a rank may use; init spins only when every local rank can have one of them.

The parser tests load ringreduce/_cpus.py from its file (no extension needed) and point it
at fake cgroup trees."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _spawn import ROOT, run_world_raw

_spec = importlib.util.spec_from_file_location("_ringreduce_cpus_under_test",
                                               ROOT / "ringreduce" / "_cpus.py")
cpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpus)

AFFINITY = len(os.sched_getaffinity(0))


def _tree(tmp: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """A fake /sys/fs/cgroup (files relative to it) and /proc/self/cgroup; returns both paths."""
    root = tmp / "cgroup"
    root.mkdir()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    proc = tmp / "proc_self_cgroup"
    proc.write_text(proc_cgroup)
    return str(root), str(proc)


def _both(tmp: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[float | None, int]:
    root, proc = _tree(tmp, proc_cgroup, files)
    return cpus.cgroup_cpu_limit(root, proc), cpus.usable_cpus(root, proc)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cpu_max,limit,usable", [
    ("max 100000", None, AFFINITY),       # no quota: the affinity mask decides
    ("50000 100000", 0.5, 1),             # half a CPU still runs: at least 1
    ("150000 100000", 1.5, min(AFFINITY, 2)),  # rounded up
    ("100000 100000", 1.0, 1),
    ("max", None, AFFINITY),
])
def test_cgroup_v2_cpu_max(tmp_path: Path, cpu_max: str, limit: float | None,
                           usable: int) -> None:
    got = _both(tmp_path, "0::/job/rank0\n", {"cgroup.controllers": "cpu io",
                                               "job/rank0/cpu.max": cpu_max})
    assert got == (limit, usable)


@pytest.mark.timeout(30)
def test_cgroup_v2_ancestor_quota_binds(tmp_path: Path) -> None:
    # The job's slice is limited to one CPU; the rank's own cgroup sets no limit.
    got = _both(tmp_path, "0::/job/rank0\n", {"job/cpu.max": "100000 100000",
                                               "job/rank0/cpu.max": "max 100000"})
    assert got == (1.0, 1)


@pytest.mark.timeout(30)
def test_cgroup_v2_path_not_visible_reads_the_mount_root(tmp_path: Path) -> None:
    # In a container /proc/self/cgroup may name the host's path; the mount root is ours.
    got = _both(tmp_path, "0::/system.slice/docker-abc.scope\n", {"cpu.max": "50000 100000"})
    assert got == (0.5, 1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mount", ["cpu,cpuacct", "cpu"])
@pytest.mark.parametrize("quota,limit,usable", [
    ("-1", None, AFFINITY), ("50000", 0.5, 1), ("150000", 1.5, min(AFFINITY, 2))])
def test_cgroup_v1_cfs_quota(tmp_path: Path, mount: str, quota: str, limit: float | None,
                             usable: int) -> None:
    proc = "12:memory:/job\n4:cpu,cpuacct:/job\n0::/\n"
    got = _both(tmp_path, proc, {f"{mount}/job/cpu.cfs_quota_us": quota,
                                 f"{mount}/job/cpu.cfs_period_us": "100000",
                                 "memory/job/cpu.cfs_quota_us": "1000"})  # not the cpu controller
    assert got == (limit, usable)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("proc_cgroup,files", [
    (None, {}),                                    # no /proc/self/cgroup at all
    ("0::/job\n", {}),                             # no cpu.max (controller not enabled)
    ("0::/job\n", {"job/cpu.max": "lots 100000"}),  # unreadable content
    ("0::/job\n", {"job/cpu.max": "50000 0"}),
    ("4:cpu,cpuacct:/job\n", {"cpu,cpuacct/job/cpu.cfs_quota_us": "50000"}),  # no period
    ("4:cpu,cpuacct:/job\n", {}),                  # no v1 mount
])
def test_missing_or_odd_files_mean_no_limit(tmp_path: Path, proc_cgroup: str | None,
                                            files: dict[str, str]) -> None:
    root, proc = _tree(tmp_path, proc_cgroup or "", files)
    if proc_cgroup is None:
        os.unlink(proc)
    assert cpus.cgroup_cpu_limit(root, proc) is None
    assert cpus.usable_cpus(root, proc) == AFFINITY


@pytest.mark.timeout(30)
@pytest.mark.parametrize("proc_cgroup,files,limit", [
    # v2: the smallest memory.max from this cgroup up ("max" = none)
    ("0::/job/rank0\n", {"job/memory.max": "8589934592", "job/rank0/memory.max": "max"},
     8 << 30),
    ("0::/job/rank0\n", {"job/rank0/memory.max": "max"}, None),
    # v1 (the memory line of several; 2^63 - 4096 is no limit), the container's root
    ("4:memory:/process_api/x\n0::/\n",
     {"memory/memory.limit_in_bytes": "9223372036854771712",
      "memory/process_api/x/memory.limit_in_bytes": "1073741824"}, 1 << 30),
    ("4:memory:/not/visible\n", {"memory/memory.limit_in_bytes": "2147483648"}, 2 << 30),
    ("4:memory:/process_api/x\n",
     {"memory/process_api/x/memory.limit_in_bytes": "9223372036854771712"}, None),
    ("4:memory:/x\n", {"memory/x/memory.limit_in_bytes": "junk"}, None),
])
def test_cgroup_memory_limit(tmp_path: Path, proc_cgroup: str, files: dict[str, str],
                             limit: int | None) -> None:
    """ringreduce-bench's -e guard: a container's or a job's memory limit (smallest on the
    way up), none for v2's "max" and v1's huge "no limit" number."""
    root, proc = _tree(tmp_path, proc_cgroup, files)
    assert cpus.cgroup_memory_limit(root, proc) == limit


@pytest.mark.timeout(30)
def test_affinity_mask_is_honoured() -> None:
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); os.sched_setaffinity(0, {min("
            "os.sched_getaffinity(0))}); import _cpus; print(_cpus.usable_cpus())")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "ringreduce")],
                         capture_output=True, text=True, timeout=20, check=True)
    assert out.stdout.strip() == "1"


@pytest.mark.timeout(90)
def test_two_ranks_pinned_to_one_cpu_never_spin() -> None:
    if shutil.which("taskset") is None:
        pytest.skip("needs taskset (util-linux)")
    cpu = str(min(os.sched_getaffinity(0)))
    outs = run_world_raw(2, "shm_workers:spin_choice", timeout=60,
                         env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_DEBUG": "DEBUG"},
                         rank_prefix={r: ["taskset", "-c", cpu] for r in (0, 1)})
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    for o in outs:
        assert o.value["affinity"] == [int(cpu)], o.value
        assert o.value["spin_us"] == 0.0, o.value
        assert "2 local ranks, 1 usable CPUs: waits never spin" in o.stderr, o.describe()
        assert "waits spin 0 us" in o.stderr, o.describe()  # shared memory's too


@pytest.mark.timeout(90)
def test_two_ranks_with_two_cpus_spin() -> None:
    if cpus.usable_cpus() < 2:
        pytest.skip("needs 2 usable CPUs")
    outs = run_world_raw(2, "shm_workers:spin_choice", timeout=60,
                         env={"RINGREDUCE_TRANSPORT": "shm", "RINGREDUCE_DEBUG": "DEBUG"})
    assert all(o.ok for o in outs), "\n".join(o.describe() for o in outs)
    assert [o.value["spin_us"] for o in outs] == [1000.0] * 2
    assert all("waits spin 1000 us" in o.stderr for o in outs), outs[0].describe()
