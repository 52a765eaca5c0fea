"""ringreduce-bench: an nccl-tests-style microbenchmark of ringreduce's collectives, with
torch.distributed gloo and Open MPI measured side by side.

    ringreduce-bench -n 2 -b 8 -e 64M -f 2 --compare gloo --plot busbw.png
    python -m ringreduce.bench -n 4 -o all --check
    torchrun --nproc-per-node 2 -m ringreduce.bench -b 1K -e 16M   # one rank of a job

Outside a job (no RANK/WORLD_SIZE or launcher variables) it starts -n local ranks itself
through ringreduce-run; inside one (ringreduce-run, torchrun, srun, mpirun) it is one rank.
See bench/README.md for how to read the table.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ringreduce-bench console script; returns the exit code."""
    from .. import _env
    from . import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli.parse_args(argv)
    if args.model:
        from . import model

        return model.run(args)
    problem = cli.cuda_problem(args) or _no_torch()
    if problem:
        print(f"{cli.PROG}: error: {problem}", file=sys.stderr)
        return 2
    try:
        info = _env.detect_launch()
    except ValueError as e:
        print(f"{cli.PROG}: error: {e}", file=sys.stderr)
        return 2
    if info.source == "default":
        from .launch import spawn_local

        return spawn_local(args, argv)
    if args.nproc and args.nproc != info.world_size and info.rank == 0:
        print(f"{cli.PROG}: note: -n {args.nproc} ignored: this is rank {info.rank} of a job "
              f"of {info.world_size} started by {info.source}", file=sys.stderr)
    from .runner import run_rank

    return run_rank(args)


def _no_torch() -> str | None:
    """The measurement fills and checks its buffers with torch (also at -n 1) and gloo is
    torch's: without it, say so before any rank starts (--model needs none)."""
    import importlib.util

    try:
        if importlib.util.find_spec("torch") is not None:
            return None
    except (ImportError, ValueError):  # a finder refused it; torch.__spec__ unset
        pass
    return ("the benchmark needs torch (its buffers and result checks, the store of a "
            "job of several ranks, the gloo anchor): pip install torch; "
            "--model prints the cost model's predictions without it")
