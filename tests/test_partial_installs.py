"""Installs missing a part. Without torch (pyproject does not require it for world size 1):
what runs, and what says it needs torch -- before anything starts, naming `pip install
torch`; torch is hidden from a fresh interpreter by an import hook. A source tree without
its compiled core for this Python. (Found by a helper on Pythons without torch.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import ringreduce

_HIDE_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def _run(body: str) -> dict:
    code = _HIDE_TORCH + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL,
                       env={"PATH": "/usr/bin:/bin", "RINGREDUCE_DEBUG": "OFF"})
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(90)
def test_world_size_one_runs_and_the_rest_says_it_needs_torch() -> None:
    out = _run("""
        import json, numpy as np, ringreduce as rr
        res = {"torch_loaded": None}
        rr.init(0, 1)
        x = np.arange(5, dtype=np.float32)
        rr.allreduce(x)
        res["sum"] = x.tolist()
        try:
            rr.recv(np.zeros(2), src=0)
        except ValueError as e:
            res["recv_self"] = str(e)
        w = rr.allreduce(x, async_op=True)
        w.wait()
        try:
            w.get_future()
        except ImportError as e:
            res["future"] = str(e)
        rr.destroy()
        try:
            rr.init(0, 2)
        except ImportError as e:
            res["world2"] = str(e)
        import sys
        res["torch_loaded"] = "torch" in sys.modules
        print(json.dumps(res))
    """)
    assert out["sum"] == [0.0, 1.0, 2.0, 3.0, 4.0], out
    assert out["recv_self"].endswith("is this rank; receive from another rank"), out
    assert "needs torch (pip install torch)" in out["future"], out
    # Said before asking for MASTER_ADDR/MASTER_PORT (an address would not help).
    assert "needs torch when world_size > 1" in out["world2"], out
    assert "pip install torch" in out["world2"] and "MASTER_ADDR" not in out["world2"], out
    assert out["torch_loaded"] is False, out


@pytest.mark.timeout(90)
def test_the_bench_says_it_needs_torch_before_starting_ranks() -> None:
    out = _run("""
        import contextlib, io, json
        from ringreduce import bench
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = bench.main(["-n", "1", "-b", "8", "-e", "64", "-w", "1", "-i", "2"])
        print(json.dumps({"rc": rc, "err": err.getvalue()}))
    """)
    assert out["rc"] == 2, out
    assert "the benchmark needs torch" in out["err"] and "pip install torch" in out["err"], out
    assert "Traceback" not in out["err"], out


@pytest.mark.timeout(60)
def test_a_source_tree_without_its_core_says_so(tmp_path: Path) -> None:
    """Importing from a source folder built for another Python (or not built) said "cannot
    import name '_C' from partially initialized module (most likely due to a circular
    import)"."""
    pkg = Path(ringreduce.__file__).parent
    shutil.copytree(pkg, tmp_path / "ringreduce",
                    ignore=shutil.ignore_patterns("_C.*", "__pycache__"))
    # -S: no .pth files, so no editable install's finder (which would win over sys.path)
    site = sysconfig.get_paths()["purelib"]
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); sys.path.append({site!r}); "
            f"import ringreduce")
    p = subprocess.run([sys.executable, "-S", "-c", code], check=False, capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p.stdout + p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "has no _C." in last and "source tree not built for it" in last, last
    assert "pip install ." in last and "build_ext --inplace" in last, last
