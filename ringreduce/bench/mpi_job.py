"""The Open MPI anchor as its own job: `mpirun -n N python -m ringreduce.bench.mpi_job ARGS
--mpi-results FILE` sweeps the same sizes and (collective, -d type, --op reduction)
combinations as the ringreduce run with mpi4py only, skipping per combination what MPI
refuses, and rank 0 writes the rows and skips as JSON for the ringreduce ranks to merge into
their table. (The ringreduce launcher starts it; it is not meant to be run by hand.)"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from . import cli

    args = cli.parse_args(sys.argv[1:] if argv is None else argv)
    args.compare = []
    out = args.mpi_results
    try:
        import torch

        from . import progress
        from .anchors import MPI
        from .runner import sweep, total_work

        torch.set_num_threads(1)
        lib = MPI()
        rank, world = lib.comm.Get_rank(), lib.comm.Get_size()
        bar = progress.Progress(total_work(args, world, 1),
                                rank == 0 and progress.wanted(args.progress))
        try:
            rows, skipped = sweep(args, [lib], lib.allreduce_np, rank, world, bar)
        finally:
            bar.close()
        data = {"results": [r.as_dict() for r in rows], "skipped": skipped, "note": lib.note}
    except Exception as e:  # noqa: BLE001 -- reported as the anchor's skip reason
        rank, data = 0, {"error": f"{type(e).__name__}: {e}"}
        try:
            from mpi4py import MPI as M

            rank = M.COMM_WORLD.Get_rank()
        except Exception:  # noqa: BLE001, S110 -- no MPI at all: this is rank 0
            pass
    if rank == 0 and out:
        with open(out, "w") as f:
            json.dump(data, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
