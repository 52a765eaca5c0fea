"""Run by tests/test_torch_launch.py under two torchrun agents (--nnodes 2, one worker
each, --max-restarts 1): in the first round (no file at argv[1] yet) rank 1 writes the file
and fails; the agents then restart their workers with different TORCHELASTIC_RESTART_COUNTs
(the failed worker's agent counts a restart, the other restarts on a membership change and
does not: torch issue 135712), and the second round must still meet and all-reduce."""

import os
import sys
import time

import torch

import ringreduce as rr

marker = sys.argv[1]
first = not os.path.exists(marker)
rr.init()
rank, world = rr.get_rank(), rr.get_world_size()
x = torch.full((8,), float(rank + 1))
rr.allreduce(x)
assert torch.equal(x, torch.full((8,), float(world * (world + 1) // 2))), (rank, x)
if first and rank == 1:
    open(marker, "w").close()
    raise SystemExit("rank 1 fails on purpose in the first round")
if first:  # the others wait to be restarted (torchrun stops them)
    time.sleep(60)
print(f"round 2 rank {rank} (restart count "
      f"{os.environ.get('TORCHELASTIC_RESTART_COUNT')}): ok", flush=True)
rr.destroy()
