"""A stock torch.distributed job that never imports ringreduce itself.

    python plain_torch_job.py RANK WORLD INIT_METHOD [lightning|bare]

"lightning": the environment Lightning's launcher gives its workers (WORLD_SIZE,
LOCAL_RANK, NODE_RANK; never RANK, no MASTER_ADDR). "bare": no launcher variable at all, as
in torch's own test suite. Either way rank and world size reach the backend only through
init_process_group's arguments, and the address only through `INIT_METHOD`. Prints one
JSON line: what the collectives returned, checked against numpy.
"""

import json
import os
import sys

rank, world, init_method = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "lightning"
for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT", "NODE_RANK", "GROUP_RANK"):
    os.environ.pop(k, None)
if mode == "lightning":
    os.environ.update(WORLD_SIZE=str(world), LOCAL_RANK="0", NODE_RANK=str(rank))

import numpy as np
import torch
import torch.distributed as dist

imported_by_user = False  # this script never runs `import ringreduce`
dist.init_process_group("ringreduce", init_method=init_method, rank=rank, world_size=world)
x = torch.arange(1001, dtype=torch.float64) * (rank + 1)
dist.all_reduce(x)
want = np.arange(1001, dtype=np.float64) * sum(r + 1 for r in range(world))
outs = [torch.zeros(3, dtype=torch.int32) for _ in range(world)]
dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int32))
gathered = [int(o[0]) for o in outs]
sub = dist.new_group([0, world - 1])
y = torch.tensor([float(rank)])
if rank in (0, world - 1):
    dist.all_reduce(y, group=sub)
dist.destroy_process_group()
print(json.dumps({"rank": rank, "allreduce_ok": bool(np.array_equal(x.numpy(), want)),
                  "gathered": gathered, "sub": float(y[0]),
                  "imported_by_user": imported_by_user}), flush=True)
