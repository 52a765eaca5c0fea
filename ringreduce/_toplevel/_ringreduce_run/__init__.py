"""``ringreduce-run``'s console entry point, installed as a top-level package of its own,
``_ringreduce_run`` (setup.py maps it here), so that starting the launcher does not import
the ringreduce package -- whose __init__ loads its extension and torch: ~2 s before any
rank started, and more address space than a launcher needs (under ``ulimit -v`` it failed
where torchrun and the ranks fit: found by a helper). It runs ringreduce/run.py, which
imports nothing of the package, as a plain file (``python -m ringreduce.run`` imports the
package first, as Python does for any submodule)."""

from __future__ import annotations

import importlib.util
import os
import sys


def main() -> int:
    spec = importlib.util.find_spec("ringreduce")  # found, not imported
    where = list(spec.submodule_search_locations or []) if spec is not None else []
    path = os.path.join(where[0], "run.py") if where else ""
    if not os.path.isfile(path):  # an unusual install: the package's own copy
        from ringreduce.run import main as run_main

        return run_main()
    launcher = importlib.util.spec_from_file_location("_ringreduce_run.run", path)
    module = importlib.util.module_from_spec(launcher)  # type: ignore[arg-type]
    sys.modules[launcher.name] = module  # type: ignore[union-attr]  # dataclasses need it
    launcher.loader.exec_module(module)  # type: ignore[union-attr]
    return module.main()
