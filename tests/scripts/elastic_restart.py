"""Run by tests/test_torch_launch.py under `torchrun --max-restarts 1`: every rank inits
(argv[1]: "rr" for ringreduce.init(), "torch" for init_process_group("ringreduce")) and
all-reduces; on the first attempt rank 1 then fails, so torchrun restarts every worker, and
the second attempt must init again on the same agent store and get right results."""

import os
import sys

import torch
import torch.distributed as dist

import ringreduce as rr

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if sys.argv[1] == "rr":
    rr.init()
    rank, world, allreduce = rr.get_rank(), rr.get_world_size(), rr.allreduce
else:
    dist.init_process_group("ringreduce")
    rank, world, allreduce = dist.get_rank(), dist.get_world_size(), dist.all_reduce
x = torch.full((8,), float(rank + 1 + 100 * attempt))
allreduce(x)
want = sum(r + 1 + 100 * attempt for r in range(world))
assert torch.equal(x, torch.full((8,), float(want))), (attempt, rank, x)
if attempt == 0 and rank == 1:
    raise SystemExit("rank 1 fails on purpose in the first attempt")
if attempt == 0:  # the others wait to be restarted (torchrun stops them)
    import time

    time.sleep(60)
print(f"attempt {attempt} rank {rank}: ok", flush=True)
if sys.argv[1] == "rr":
    rr.destroy()
else:
    dist.destroy_process_group()
