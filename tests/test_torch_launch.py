"""How torch starts the backend, as the frameworks do it (issue #12, launch paths):

* the backend exists in a process that never imports ringreduce (torch's ``torch.backends``
  entry point loads it; with TORCH_DEVICE_BACKEND_AUTOLOAD=0 it does not, which shows the
  entry point is what did it);
* rank and world size passed by torch win over the environment: Lightning's launcher sets
  WORLD_SIZE and LOCAL_RANK but never RANK, torch's own test suite sets nothing;
* with no MASTER_ADDR, ranks listen on the interface that routes to the store's host
  (``init_method="tcp://host:port"``), checked across emulated hosts (network namespaces).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

import pytest
from _spawn import free_port, run_command
from netcluster import Cluster, cleanup_stale, unavailable

SCRIPT = Path(__file__).resolve().parent / "scripts" / "plain_torch_job.py"


def _env(extra: dict | None = None) -> dict:
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("RINGREDUCE_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_"))}
    e.update(OMP_NUM_THREADS="1", RINGREDUCE_CONNECT_TIMEOUT="30", **(extra or {}))
    return e


def _run(world: int, init_method: str, mode: str, prefixes: list | None = None,
         env: dict | None = None, timeout: float = 90) -> list[dict]:
    """Run the job's ranks; every one must exit 0. Children are always killed and reaped."""
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for r in range(world):
                cmd = list((prefixes or [[]] * world)[r]) + [
                    sys.executable, str(SCRIPT), str(r), str(world), init_method, mode]
                out = open(Path(tmp) / f"{r}.txt", "w+")  # noqa: SIM115 - closed below
                procs.append((subprocess.Popen(cmd, env=_env(env), stdout=out,
                                               stderr=subprocess.STDOUT, cwd=tmp,
                                               start_new_session=True), out))
            for p, _ in procs:
                p.wait(timeout=timeout)
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                p.wait()
        texts = []
        for p, out in procs:
            out.seek(0)
            texts.append((p.returncode, out.read()))
            out.close()
    bad = [f"rank {r} exited {rc}:\n{t[-3000:]}" for r, (rc, t) in enumerate(texts) if rc]
    assert not bad, "\n".join(bad)
    return [json.loads(t.strip().splitlines()[-1]) for _, t in texts]


def _check(results: list[dict], world: int) -> None:
    for r, res in enumerate(results):
        assert res["rank"] == r and res["allreduce_ok"], res
        assert res["gathered"] == list(range(world)), res
        if r in (0, world - 1):
            assert res["sub"] == (float(world - 1) if world > 1 else 0.0), res
        assert res["imported_by_user"] is False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world,mode", [(2, "lightning"), (3, "lightning"), (2, "bare")])
def test_backend_without_import_and_without_rank_variables(world: int, mode: str) -> None:
    init = f"tcp://127.0.0.1:{free_port()}"
    _check(_run(world, init, mode), world)


@pytest.mark.timeout(120)
def test_file_init_method() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _check(_run(2, f"file://{tmp}/store", "bare"), 2)


@pytest.mark.timeout(60)
def test_autoload_is_what_registers_it() -> None:
    code = ("import torch.distributed as dist, sys\n"
            "print('RINGREDUCE' in dist.Backend._plugins, 'ringreduce' in sys.modules)\n")
    on = subprocess.run([sys.executable, "-c", code], env=_env(), check=False,
                        capture_output=True, text=True, timeout=50)
    off = subprocess.run([sys.executable, "-c", code],
                         env=_env({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
                         capture_output=True, text=True, timeout=50, check=False)
    assert on.stdout.split() == ["True", "True"], on.stdout + on.stderr
    assert off.stdout.split() == ["False", "False"], off.stdout + off.stderr


@pytest.mark.timeout(60)
def test_a_ringreduce_that_fails_to_import_does_not_break_import_torch(tmp_path) -> None:
    """A `ringreduce` that cannot be imported -- a source tree without its compiled _C
    shadowing the installed package from the current directory, numpy missing -- costs a
    warning at `import torch`, not torch itself (found by a helper: loading the entry point
    imported ringreduce outside the hook's try)."""
    (tmp_path / "ringreduce").mkdir()
    (tmp_path / "ringreduce" / "__init__.py").write_text("raise ImportError('no _C here')\n")
    p = subprocess.run([sys.executable, "-c", "import torch; print('imported')"], env=_env(),
                       cwd=tmp_path, capture_output=True, text=True, timeout=50, check=False)
    assert p.returncode == 0 and p.stdout.strip() == "imported", p.stdout + p.stderr
    assert "could not register the torch.distributed backend" in p.stderr, p.stderr
    assert "no _C here" in p.stderr, p.stderr


_COMPAT_ENTRIES = """\
import json, runpy, sys, warnings
import setuptools
from setuptools.dist import Distribution
kw = {}
setuptools.setup = lambda **k: kw.update(k)
runpy.run_path(sys.argv[1] + "/setup.py", run_name="setup_under_test")
cmd = kw["cmdclass"]["editable_wheel"](Distribution(
    {"name": "ringreduce", "packages": kw["packages"], "package_dir": kw["package_dir"]}))
cmd.mode, cmd.package_dir, cmd.project_dir = "compat", kw["package_dir"], sys.argv[1]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # setuptools: compat mode is transitional
    strategy = cmd._select_strategy("ringreduce-0", "py3-none-any", "b")
print(json.dumps([str(p) for p in strategy.path_entries]))
"""


def _compat_pth_entries() -> list[str]:
    """The folders a compat editable install's .pth names: setup.py's own editable_wheel
    command, asked without installing anything (in a process of its own: setup.py patches
    the compiler globally)."""
    root = str(Path(__file__).resolve().parent.parent)
    p = subprocess.run([sys.executable, "-c", _COMPAT_ENTRIES, root], env=_env(),
                       cwd=root, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(90)
def test_a_compat_editable_install_keeps_import_torch_working(tmp_path) -> None:
    """`pip install -e . --config-settings editable_mode=compat` is a .pth of folders;
    setuptools' named only the project's root, where the top-level packages of torch's entry
    point and of ringreduce-run are not: `import torch` raised "Failed to load the backend
    extension: ringreduce" (found by hand). Here sys.path holds what that .pth gives, and
    nothing of this checkout's own install."""
    entries = _compat_pth_entries()
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
            f"sys.path += {entries!r}\n"
            "import torch.distributed as dist, _ringreduce_run\n"
            "print('RINGREDUCE' in dist.Backend._plugins, callable(_ringreduce_run.main))\n")
    p = subprocess.run([sys.executable, "-c", code], env=_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0 and p.stdout.split() == ["True", "True"], p.stdout + p.stderr


@pytest.mark.timeout(60)
def test_the_old_entry_point_name_still_imports(tmp_path) -> None:
    """Editable installs made before the entry point moved still name
    ringreduce._autoload:register and map only `ringreduce`: the module must import from
    the package alone (it imported _ringreduce_autoload, which such an install lacks: every
    `import torch` failed; a reviewer)."""
    root = str(Path(__file__).resolve().parent.parent)
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
            f"sys.path.insert(0, {root!r})\n"
            "from ringreduce._autoload import register\n"
            "print(register.__module__)\n")
    # (torch's own loading of the current entry point is not what is tested here)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                       env=_env({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
                       capture_output=True, text=True, timeout=50, check=False)
    assert p.returncode == 0 and p.stdout.split() == [
        "ringreduce._toplevel._ringreduce_autoload"], p.stdout + p.stderr


@pytest.mark.timeout(90)
def test_bad_tunable_breaks_neither_torch_nor_the_launcher() -> None:
    """`import torch` imports ringreduce (the entry point): a bad RINGREDUCE_* value must not
    break it, nor torch code that never uses ringreduce, nor `ringreduce-run --help`; it is
    reported, naming the variable, where ringreduce starts."""
    bad = _env({"RINGREDUCE_TIMEOUT": "abc", "RINGREDUCE_DEBUG": "verbose"})
    code = ("import torch.distributed as dist\n"
            "print('RINGREDUCE' in dist.Backend._plugins)\n")
    r = subprocess.run([sys.executable, "-c", code], env=bad, check=False,
                       capture_output=True, text=True, timeout=50)
    assert r.returncode == 0 and r.stdout.split() == ["True"], r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ringreduce.run", "--help"], env=bad,
                       check=False, capture_output=True, text=True, timeout=50)
    assert r.returncode == 0 and "RINGREDUCE_TIMEOUT" in r.stdout, r.stdout + r.stderr
    code = ("import ringreduce as rr\n"
            "try:\n    rr.init(rank=0, world_size=1)\n"
            "except ValueError as e:\n    print('ValueError', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=bad, check=False,
                       capture_output=True, text=True, timeout=50)
    assert r.stdout.startswith("ValueError") and "RINGREDUCE_" in r.stdout, r.stdout + r.stderr


_NETNS = unavailable()


@pytest.mark.netns
@pytest.mark.skipif(_NETNS is not None, reason=_NETNS or "")
@pytest.mark.timeout(150)
def test_init_method_address_across_hosts() -> None:
    """No MASTER_ADDR anywhere: each rank must listen on its namespace's address (found from
    the store's host), or the others could not connect to it."""
    cleanup_stale()
    with Cluster(3) as c:
        init = f"tcp://{c.addr(0)}:{free_port()}"
        _check(_run(3, init, "lightning", [c.exec_prefix(h) for h in range(3)]), 3)


@pytest.mark.timeout(120)
def test_fallback_without_a_compiler(tmp_path) -> None:
    """No compiler and an empty cache: one warning saying what is lost, then the Python
    process group runs the collectives."""
    code = (
        "import warnings, torch, torch.distributed as dist\n"
        "warnings.simplefilter('always')\n"
        "dist.init_process_group('ringreduce', store=dist.HashStore(), rank=0, world_size=1)\n"
        "from ringreduce import backend\n"
        "t = torch.arange(5.0); dist.all_reduce(t)\n"
        "print(type(dist.group.WORLD).__name__, t.tolist())\n"
        "dist.destroy_process_group()\n")
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                       text=True, timeout=100,
                       env=_env({"XDG_CACHE_HOME": str(tmp_path), "CXX": "/bin/false"}))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split("\n")[0] == "ProcessGroupRingReduce [0.0, 1.0, 2.0, 3.0, 4.0]"
    assert "c10d backend adapter is unavailable" in p.stderr
    assert "no DeviceMesh/FSDP2" in p.stderr


def test_adapter_for_another_torch_is_refused() -> None:
    from ringreduce import _c10d_build

    why = _c10d_build.mismatch("2.12.0", "2.13.0", Path("/c/x/lib.so"))
    assert why is not None and "built for torch 2.12.0" in why and "delete /c/x" in why
    assert _c10d_build.mismatch("2.13.0", "2.13.0", Path("/c/x/lib.so")) is None


@pytest.mark.parametrize("guard, std", [("201703L", "c++17"), ("202002L", "c++20"),
                                        ("202302L", "c++23"), (None, "c++20")])
def test_adapter_is_compiled_with_the_standard_atens_header_asks_for(
        tmp_path: Path, guard: str | None, std: str) -> None:
    """torch 2.14's ATen.h refuses anything below C++20: the adapter, compiled as C++17,
    failed and the backend fell back to its Python process group (29 failed, 76 errors in the
    suite on torch 2.14.1)."""
    from ringreduce import _c10d_build

    (tmp_path / "inc" / "ATen").mkdir(parents=True)
    if guard is not None:  # (none found: torch's own cpp_extension's C++20)
        (tmp_path / "inc" / "ATen" / "ATen.h").write_text(
            f"#if !defined(_MSC_VER) && __cplusplus < {guard}\n#error C++ too old\n#endif\n")

    class FakeExt:
        @staticmethod
        def include_paths() -> list[str]:
            return [str(tmp_path / "none"), str(tmp_path / "inc")]

    assert _c10d_build._cxx_std(FakeExt) == std


def test_adapter_cache_falls_back_to_a_private_temp_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME read-only or missing: the adapter went nowhere and the backend fell back to its
    Python process group (no DeviceMesh/FSDP2; found by a helper). It goes to a folder of
    this user's under the temp folder now -- never one others may write."""
    import torch

    from ringreduce import _c10d_build

    monkeypatch.setenv("XDG_CACHE_HOME", "/dev/null/cache")  # cannot be made
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    src = _c10d_build._source()
    key = _c10d_build._key(src, torch)
    name = f"ringreduce_c10d_{key}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    private = _c10d_build._private_tmp_root()
    assert private == tmp_path / f"ringreduce-cache-{os.getuid()}"
    assert private.stat().st_mode & 0o777 == 0o700
    built = private / f"c10d-torch{torch.__version__}-{key}" / name
    built.parent.mkdir()
    built.write_bytes(b"")  # as if built there before: found, not compiled again
    assert _c10d_build.build(torch) == built
    private.chmod(0o777)
    with pytest.raises(PermissionError, match="XDG_CACHE_HOME"):
        _c10d_build.build(torch)


@pytest.mark.timeout(120)
def test_destroy_under_torchrun_does_not_wait_for_a_rank_that_ended() -> None:
    script = Path(__file__).resolve().parent / "scripts" / "exit_without_a_word.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "3", "--monitor-interval", "0.2", str(script)]
    rc, out = run_command(cmd, timeout=100, env=_env())
    assert rc == 0, out[-4000:]
    for r in (0, 1):
        m = re.search(rf"rank {r} destroy ([0-9.]+) s", out)
        assert m and float(m.group(1)) < 2.0, out[-4000:]  # the farewell's wait is 5 s


@pytest.mark.timeout(150)
@pytest.mark.parametrize("api", ["rr", "torch"])
def test_torchrun_restart_inits_again(api: str) -> None:
    """torchrun --max-restarts 1: rank 1 fails after init and an all-reduce; the restarted
    workers init again on the agent's store, which still holds the first attempt's keys
    (they got "rank 1 was claimed by 2 processes" every time before)."""
    script = Path(__file__).resolve().parent / "scripts" / "elastic_restart.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--max-restarts", "1", "--monitor-interval", "0.2", str(script), api]
    rc, out = run_command(cmd, timeout=120, env=_env())
    assert rc == 0, out[-4000:]
    for r in (0, 1):
        assert f"attempt 1 rank {r}: ok" in out, out[-4000:]


@pytest.mark.timeout(150)
def test_two_agents_restarting_at_different_counts_meet_again(tmp_path: Path) -> None:
    """Two torchrun agents (--nnodes 2, c10d rendezvous, a fresh store per round with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): after rank 1 fails, one agent restarts at
    TORCHELASTIC_RESTART_COUNT=1 and the other at 0 (torch counts no restart for a
    membership change). Keys prefixed by the count waited for each other until the connect
    timeout (found by a helper); on a store of the round's own the count is not needed."""
    from concurrent.futures import ThreadPoolExecutor

    script = Path(__file__).resolve().parent / "scripts" / "elastic_two_agents.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
           "1", "--max-restarts", "1", "--monitor-interval", "0.2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"rr{os.getpid()}",
           str(script), str(tmp_path / "first-round-done")]
    env = _env({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: run_command(cmd, timeout=120, env=env), range(2)))
    out = "\n".join(o for _, o in runs)
    assert [rc for rc, _ in runs] == [0, 0], out[-6000:]
    for r in (0, 1):
        assert f"round 2 rank {r} " in out, out[-6000:]
    assert "restart count 0)" in out and "restart count 1)" in out, out[-6000:]


def test_claimed_twice_under_torchrun_names_the_restart_count(monkeypatch) -> None:
    """On the agent's shared store, agents' differing restart counts make a restarted
    worker find its rank claimed by the failed attempt: the error says so and how to avoid
    it, not only that RANK is duplicated."""
    from ringreduce import _rendezvous

    for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(k, raising=False)
    plain = "rank 1 was claimed by 2 processes; every process needs a distinct RANK in [0, 4)"
    assert str(_rendezvous._claimed_twice(1, 2, 4, init=True)) == (
        plain + " (or another job runs on this MASTER_PORT: give each job its own port)")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    said = str(_rendezvous._claimed_twice(1, 2, 4, init=True))
    assert said.startswith(plain) and "TORCHELASTIC_RESTART_COUNT=0" in said
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in said
    assert str(_rendezvous._claimed_twice(1, 2, 4, init=False)) == plain  # a group's
    assert _rendezvous._world_prefix(object(), 3) == "ringreduce/3/"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert _rendezvous._world_prefix(object(), 3) == "ringreduce/3-r2/"
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    tcp = types.SimpleNamespace(host="h", port=1234)  # rank 0's TCPStore: the attempt's own
    assert _rendezvous._world_prefix(tcp, 3) == "ringreduce/3/"
    assert _rendezvous._world_prefix(object(), 3) == "ringreduce/3-r2/"  # a FileStore outlives it
