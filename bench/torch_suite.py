"""Run PyTorch's own distributed test suite (DistributedTest._DistTestBase, shipped in the
torch wheel as torch/testing/_internal/distributed/distributed_test.py) against a
torch.distributed backend -- "gloo" or "ringreduce" -- the way pytorch's
test/distributed/test_distributed_spawn.py does (that file is not in the wheel).

    python bench/torch_suite.py --backend gloo --world-size 2 --timeout 60 --json g.json
    python bench/torch_suite.py --backend ringreduce --world-size 2 --timeout 60 --json r.json
    python bench/torch_suite.py --backend ringreduce --only-passed g.json --json r2.json
    python bench/torch_suite.py --backend ringreduce -k "all_gather" --start-method spawn ...

As a CLI (``__main__``) this file imports nothing heavy: it sets BACKEND / WORLD_SIZE /
TEMP_DIR / INIT_METHOD (file://), runs ``python -m pytest`` on itself in a new session
(process group) with a per-test timeout (pytest-timeout, signal method; the repo's pytest
config is not used), turns pytest's junit XML into a JSON summary (per test: outcome,
duration, first error line; plus counts, torch version and the repo's HEAD) and finally
SIGKILLs whatever is left in that process group (rank processes, forkserver, trackers).

Imported by pytest (and by the rank processes, which unpickle the test class by module
name), it defines ``TestDistBackendWithSpawn`` as upstream does.  Deviations from upstream:

* backend allow-lists (only for a backend other than gloo/nccl/ucc/mpi): the suite's
  ``DistTestCases.backend_feature[...]`` sets "ddp", "subgroup", "gpu" and "plugin" get the
  backend's name added before distributed_test is imported (upstream's spawn driver refuses
  such a backend outright: it prints "Invalid backend" and defines no tests).  Tests that
  hard-code the name (``BACKEND != "gloo"``, ``require_backend_is_available({"gloo"})``,
  ...) are left alone and skip -- unless --lift-gloo-gates (an extra experiment, off by
  default) makes the decorators alone see "gloo".
* --start-method forkserver (the default) forks the rank processes from a forkserver that
  has imported this module once, instead of spawning two fresh interpreters per test
  (~5 s of CPU each on a 2-core machine; ~25x faster overall).  The child gets the
  parent's environment and distributed_test.INIT_METHOD per test.  --start-method spawn is
  upstream's behaviour.
* the suite's per-test join timeout (TIMEOUT_DEFAULT via DISTRIBUTED_TESTS_DEFAULT_TIMEOUT,
  and the two TIMEOUT_OVERRIDE entries of 400 s and 500 s) is lowered to fit --timeout.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

UPSTREAM_BACKENDS = ("gloo", "nccl", "ucc", "mpi")
PATCHED_FEATURES = ("ddp", "subgroup", "gpu", "plugin")

import multiprocessing.context as _mpc


class _EnvForkServerProcess(_mpc.ForkServerProcess):
    """A forkserver child gets the forkserver's environment, fixed when it started; a spawned
    one gets the parent's at start.  setUp points TEMP_DIR / INIT_METHOD at a fresh directory
    for every test, so carry the parent's environment over -- and distributed_test's
    INIT_METHOD, which that module reads from the environment when it is imported."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._parent_env = dict(os.environ)

    def run(self):
        os.environ.clear()
        os.environ.update(self._parent_env)
        dt = sys.modules.get("torch.testing._internal.distributed.distributed_test")
        if dt is not None:
            dt.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
        super().run()


def _define_suite() -> None:
    import torch
    from torch.testing._internal import common_distributed as cd

    backend = os.environ["BACKEND"]
    if backend not in UPSTREAM_BACKENDS:
        for feat in PATCHED_FEATURES:
            cd.DistTestCases.backend_feature.setdefault(feat, set()).add(backend)
    limit = int(os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", cd.TIMEOUT_DEFAULT))
    for name in list(cd.TIMEOUT_OVERRIDE):
        cd.TIMEOUT_OVERRIDE[name] = min(cd.TIMEOUT_OVERRIDE[name], limit)

    # --lift-gloo-gates (an extra, non-upstream experiment, off by default): let the
    # decorators that distributed_test evaluates when its classes are defined see
    # BACKEND == "gloo", so the tests gated by literals such as `BACKEND != "gloo"` run
    # too; everything evaluated while a test runs (init_process_group, branches in test
    # bodies) sees the real backend.
    lift = (os.environ.get("TORCH_SUITE_LIFT_GLOO_GATES") == "1"
            and backend not in UPSTREAM_BACKENDS)
    if lift:
        os.environ["BACKEND"] = "gloo"
    try:
        import torch.testing._internal.distributed.distributed_test as dt
    finally:
        os.environ["BACKEND"] = backend
    if lift:
        dt.BACKEND = backend

    torch.backends.cuda.matmul.allow_tf32 = False

    start_method = os.environ.get("TORCH_SUITE_START_METHOD", "spawn")

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if start_method == "spawn":
                self._spawn_processes()
            else:
                # Same as _spawn_processes, but the rank processes are forked from a
                # forkserver that has already imported this module (torch, the suite):
                # a fresh interpreter per rank costs ~5 s of CPU per test on this machine.
                import torch.multiprocessing as tmp
                tmp.get_context("forkserver").set_forkserver_preload([__name__])
                self._start_processes(_EnvForkServerProcess)
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    TestDistBackendWithSpawn.__module__ = __name__
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    globals()["TestDistBackendWithSpawn"] = TestDistBackendWithSpawn


if __name__ != "__main__" and os.environ.get("BACKEND"):
    _define_suite()


# ----------------------------------------------------------------------------- CLI

def _first_error_line(text: str) -> str:
    """The exception line that a failure text ends on, preferring the first rank's."""
    if not text:
        return ""
    import re

    chunks = re.split(r"Process \d+ exited with error code \d+ and exception:\n", text)
    body = chunks[1] if len(chunks) > 1 else text
    lines = [ln for ln in body.splitlines() if ln.strip()]
    # the last unindented line of a traceback that is not traceback framing
    framing = ("Traceback", "During handling", "The above exception", "To execute this test",
               "This message can be suppressed", "Exception raised from", "frame #")
    cands = [ln for ln in lines if not ln.startswith((" ", "\t", "^", "~"))
             and not ln.startswith(framing)]
    pat = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Timeout|Failed|Warning|Exit)|Failed)\b")
    errs = [ln for ln in cands if pat.match(ln)]
    line = (errs[-1] if errs else (cands[-1] if cands else lines[-1] if lines else ""))
    if len(chunks) <= 1:
        first = text.strip().splitlines()[0] if text.strip() else ""
        if first.startswith(("RuntimeError: Process", "AssertionError", "Failed: Timeout")):
            line = first
    return line.strip()[:400]


def _parse_junit(path: str) -> dict:
    import xml.etree.ElementTree as ET

    tests = {}
    if not os.path.exists(path):
        return tests
    root = ET.parse(path).getroot()
    for tc in root.iter("testcase"):
        name = tc.get("name")
        rec = {"outcome": "passed", "duration": round(float(tc.get("time") or 0.0), 2),
               "error": ""}
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is None:
                continue
            rec["outcome"] = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            msg = el.get("message") or ""
            full = (el.text or "")
            if tag == "skipped":
                rec["error"] = msg.strip().splitlines()[0][:400] if msg.strip() else ""
            else:
                rec["error"] = _first_error_line(msg) or _first_error_line(full)
            break
        tests[name] = rec
    return tests


def _git_head(repo: str) -> str:
    import subprocess

    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], check=False,
                              capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--",
                                "ringreduce", "csrc"], check=False, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return head + (" (ringreduce/ or csrc/ modified)" if dirty else "")
    except Exception:  # noqa: BLE001
        return ""



def _dump(summary: dict, f: TextIO) -> None:
    """JSON with one line per test (the file stays readable and diffable)."""
    import json

    rest = {k: v for k, v in summary.items() if k != "tests"}
    f.write(json.dumps(rest, indent=1)[:-2] + ',\n "tests": {\n')
    f.write(",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}"
                       for k, v in summary.get("tests", {}).items()))
    f.write("\n }\n}\n")

def main() -> int:
    import argparse
    import json
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("-k", dest="k", default=None, help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=60, help="per-test limit, seconds")
    ap.add_argument("--json", required=True, help="where to write the summary")
    ap.add_argument("--only-passed", default=None,
                    help="a summary JSON of an earlier run: run only the tests that passed there")
    ap.add_argument("--tests", nargs="*", default=None, help="explicit test names")
    ap.add_argument("--start-method", choices=("spawn", "forkserver"), default="forkserver",
                    help="how rank processes start (upstream: spawn; forkserver preloads the "
                         "suite so a test does not pay two interpreter+torch imports)")
    ap.add_argument("--lift-gloo-gates", action="store_true",
                    help="non-upstream experiment: also run the tests gated on the literal "
                         "backend name gloo (decorators see gloo, the tests run the backend)")
    ap.add_argument("--log", default=None, help="pytest's output (default: <json>.log)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    a = ap.parse_args()

    here = os.path.abspath(__file__)
    tmp = tempfile.mkdtemp(prefix=f"torch_suite_{a.backend}_ws{a.world_size}_")
    os.mkdir(os.path.join(tmp, "barrier"))
    os.mkdir(os.path.join(tmp, "test_dir"))
    env = dict(os.environ)
    env.update({
        "BACKEND": a.backend,
        "WORLD_SIZE": str(a.world_size),
        "TEMP_DIR": tmp,
        "INIT_METHOD": f"file://{tmp}/",
        # the suite's own join timeout fires first and terminates the ranks; pytest-timeout
        # is only the backstop
        # (after it, the suite asks each live rank for a traceback: up to 5 s each)
        "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(max(10, a.timeout - 5 * a.world_size - 10)),
        "PYTHONUNBUFFERED": "1",
        "TORCH_SUITE_START_METHOD": a.start_method,
        "TORCH_SUITE_LIFT_GLOO_GATES": "1" if a.lift_gloo_gates else "0",
        "PYTHONPATH": os.path.dirname(here) + os.pathsep + env.get("PYTHONPATH", ""),
    })

    names = list(a.tests or [])
    if a.only_passed:
        with open(a.only_passed) as f:
            prev = json.load(f)
        names += sorted(n for n, r in prev["tests"].items() if r["outcome"] == "passed")
    targets = [f"{here}::TestDistBackendWithSpawn::{n}" for n in names] or [here]

    junit = os.path.join(tmp, "junit.xml")
    log = a.log or (os.path.splitext(a.json)[0] + ".log")
    cmd = [sys.executable, "-m", "pytest", *targets, "-q", "-rN", "-p", "no:cacheprovider",
           "--rootdir", os.path.dirname(here), "-c", os.devnull,
           "--timeout", str(a.timeout), "-o", "timeout_method=signal",
           "--junitxml", junit, "-o", "junit_logging=no", "-o", "junit_family=xunit2",
           *a.pytest_args]
    if a.k:
        cmd += ["-k", a.k]
    head0 = _git_head(os.path.dirname(os.path.dirname(here)))
    t0 = time.time()
    with open(log, "w") as out:
        out.write("$ " + " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else "") + "\n")
        out.flush()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=os.path.dirname(os.path.dirname(here)))
        try:
            rc = p.wait()
        except KeyboardInterrupt:
            rc = -2
        finally:
            # every rank process and helper that pytest started is in this process group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wall = time.time() - t0

    tests = _parse_junit(junit)
    shutil.rmtree(tmp, ignore_errors=True)  # TEMP_DIR, file:// rendezvous, junit
    counts = {}
    for r in tests.values():
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    summary = {"backend": a.backend, "world_size": a.world_size, "k": a.k,
               "start_method": a.start_method, "lift_gloo_gates": a.lift_gloo_gates,
               "repo_head_at_start": head0,
               "timeout": a.timeout, "pytest_rc": rc, "wall_s": round(wall, 1),
               "torch": None, "patched_features": (list(PATCHED_FEATURES)
                                                   if a.backend not in UPSTREAM_BACKENDS
                                                   else []),
               "counts": counts, "tests": tests}
    try:
        import importlib.metadata as md
        summary["torch"] = md.version("torch")
    except Exception as e:  # noqa: BLE001
        summary["torch"] = f"unknown ({e})"
    from ringreduce.bench.outfile import replacing  # whole file or none

    with replacing(a.json) as f:
        _dump(summary, f)
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{a.backend} ws={a.world_size}: {counts} in {wall:.0f}s (pytest rc {rc}); "
          f"json {a.json}, log {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
