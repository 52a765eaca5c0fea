"""The real extension under AddressSanitizer: destroy() while another thread is inside a
synchronous collective must fail that call and free nothing under it.

The module builds ringreduce._C with RINGREDUCE_SANITIZE=address (CPU only) into a cache
directory keyed by the sources' hash, copies the Python package beside it, and runs the
ranks with libasan preloaded (Python itself is not instrumented; leak checking is off
because the interpreter keeps its objects at exit). ASan aborts the rank on any
use-after-free or overflow, which the test sees as a rank that died with ASan's report.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

if sys.version_info < (3, 11):  # PYTHONSAFEPATH below
    pytest.skip("needs Python >= 3.11 (PYTHONSAFEPATH)", allow_module_level=True)

from _spawn import TESTS_DIR, run_world_raw
from test_faults import check_destroy_during_collective

# Keeps both CPUs busy (an AddressSanitizer build of the extension): one such test at a time under
# pytest-xdist (tests/_xdist_locks.py).
pytestmark = pytest.mark.cpu_heavy

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 600
ASAN_OPTIONS = "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86"


def _preload() -> str | None:
    """LD_PRELOAD for an uninstrumented python: libasan first, and libstdc++ with it (else
    ASan's __cxa_throw interceptor finds no real function and aborts at the first throw)."""
    gxx = shutil.which("g++")
    if gxx is None:
        return None
    libs = []
    for name in ("libasan.so", "libstdc++.so"):
        path = subprocess.run([gxx, f"-print-file-name={name}"], capture_output=True,
                              text=True, check=False, timeout=30).stdout.strip()
        if not (os.path.isabs(path) and os.path.exists(path)):
            return None
        libs.append(os.path.realpath(path))
    return " ".join(libs)


def _sources_hash() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "csrc").rglob("*")) + [ROOT / "setup.py"]:
        if p.is_file():
            h.update(str(p.relative_to(ROOT)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def asan_package() -> tuple[Path, str]:
    """(directory holding an ASan-built `ringreduce` package, path of libasan.so)."""
    libasan = _preload()
    if libasan is None:
        pytest.skip("g++ with libasan is needed (install g++) to build the sanitized module")
    cache = Path(tempfile.gettempdir()) / f"rr_asan_{_sources_hash()}"
    pkg = cache / "pkg"
    if not (pkg / "ringreduce" / ".complete").exists():
        shutil.rmtree(cache, ignore_errors=True)
        env = dict(os.environ, RINGREDUCE_SANITIZE="address", RINGREDUCE_CUDA="0",
                   RINGREDUCE_WERROR="0")
        build = subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(cache / "lib"),
             "--build-temp", str(cache / "tmp")],
            cwd=ROOT, env=env, capture_output=True, text=True, check=False,
            timeout=BUILD_TIMEOUT_S)
        assert build.returncode == 0, f"ASan build failed:\n{build.stderr[-6000:]}"
        shutil.copytree(ROOT / "ringreduce", pkg / "ringreduce",
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        for so in (cache / "lib" / "ringreduce").glob("_C*.so"):
            shutil.copy2(so, pkg / "ringreduce" / so.name)
        (pkg / "ringreduce" / ".complete").write_text("ok")
    return pkg, libasan


@pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_destroy_during_a_collective_under_asan(asan_package: tuple[Path, str],
                                                transport: str) -> None:
    pkg, libasan = asan_package
    env = {"RINGREDUCE_TRANSPORT": transport, "RINGREDUCE_TIMEOUT": "60",
           "RINGREDUCE_HEARTBEAT_TIMEOUT": "60", "LD_PRELOAD": libasan,
           "ASAN_OPTIONS": ASAN_OPTIONS, "PYTHONPATH": os.pathsep.join([str(pkg), str(TESTS_DIR)]),
           # ranks start in the checkout: keep its (uninstrumented) package off sys.path
           "PYTHONSAFEPATH": "1"}
    outs = run_world_raw(3, "fault_workers:destroyer", 2.0, 4 << 20, timeout=90, env=env)
    for o in outs:
        assert "AddressSanitizer" not in o.stderr, o.describe()
    check_destroy_during_collective(outs)
    # Rank 0 really ran the sanitized build, not the module in the checkout.
    assert outs[0].value["module"].startswith(str(pkg)), outs[0].value["module"]


@pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
def test_fast_calls_hold_their_handle_while_a_slot_is_rewritten(
        asan_package: tuple[Path, str]) -> None:
    """rr.allreduce / rr.barrier's C fast path read its communicator's capsule from the slot
    as a borrowed reference and released the GIL: a thread rewriting the slot meanwhile
    (destroy(), init(), a re-made channel) freed the handle under the call
    (heap-use-after-free, 4/4 runs of a helper's repro)."""
    pkg, libasan = asan_package
    env = {"LD_PRELOAD": libasan, "ASAN_OPTIONS": ASAN_OPTIONS, "RINGREDUCE_TIMEOUT": "60",
           "PYTHONPATH": os.pathsep.join([str(pkg), str(TESTS_DIR)]), "PYTHONSAFEPATH": "1"}
    outs = run_world_raw(2, "fastcall_workers:slot_rewritten_meanwhile", 30000, 20.0,
                         timeout=120, env=env)
    for o in outs:
        assert "AddressSanitizer" not in o.stderr, o.describe()
        assert o.value is not None, o.describe()
        assert o.value["wrong"] == 0 and o.value["fast"] >= o.value["calls"] >= 1000, o.value
        assert o.value["module"].startswith(str(pkg)), o.value["module"]
