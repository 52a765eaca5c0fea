"""Start N local ranks of a bench/ script's worker, collect what each wrote, and draw its
plot (shared by bench/groups.py, idle_groups.py, p2p.py and rooted.py).

Each rank runs ``python SCRIPT --worker MODE OUT ITERS`` with torchrun's variables set
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT) and
RINGREDUCE_TRANSPORT; OUT is that rank's JSON file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile


def launcher() -> list[str]:
    """ringreduce-run's command: the installed package's run.py as a plain file, found
    without importing the package (as ringreduce-bench starts it: `-m ringreduce.run` imports
    ringreduce and torch first, ~1.3 s here before any rank starts)."""
    spec = importlib.util.find_spec("ringreduce")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("ringreduce is not installed: pip install -e . first")
    return [sys.executable, os.path.join(spec.submodule_search_locations[0], "run.py")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, n: int, mode: str, iters: int, transport: str = "auto",
           timeout: float = 600, env: dict | None = None) -> list:
    """Run the ranks to completion; each rank's JSON (None where a rank wrote none).
    SystemExit naming the setup if a rank fails. env: more environment for every rank."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="rr-bench-") as tmp:  # removed, whatever happens
        outs = [os.path.join(tmp, f"{r}.json") for r in range(n)]
        procs = [subprocess.Popen([sys.executable, os.path.abspath(script), "--worker", mode,
                                   outs[r], str(iters)],
                                  env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(n),
                                       "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                       "MASTER_PORT": str(port),
                                       "RINGREDUCE_TRANSPORT": transport, **(env or {})})
                 for r in range(n)]
        try:
            for p in procs:
                if p.wait(timeout=timeout) != 0:
                    raise SystemExit(f"{mode} on {n} ranks ({transport}) failed: a rank "
                                     f"exited with {p.returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        res = []
        for path in outs:
            try:
                with open(path) as f:
                    res.append(json.load(f))
            except FileNotFoundError:
                res.append(None)
    return res


def axes(ncols: int = 1, figsize: tuple = (6, 3.5), **kw: object) -> tuple:
    """A matplotlib figure (headless) and its axes, for a bench script's --plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=figsize, **kw)


def save(fig: object, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def entry(worker: object, main: object) -> None:
    """A bench script's __main__: ``--worker MODE OUT ITERS`` runs one rank (launch()),
    anything else the script's own command line."""
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
