"""Run by tests/test_torch_launch.py under `torchrun --max-restarts 1`: every rank inits
(argv[1]: "rr" for ringreduce.init(), "torch" for init_process_group("ringreduce")) and
all-reduces; on the first attempt rank 1 then fails, so torchrun restarts every worker, and
the second attempt must init again on the same agent store and get right results."""

import os
import sys

import _either_api
import torch

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank, world, allreduce, finish = _either_api.init(sys.argv[1])
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
finish()
