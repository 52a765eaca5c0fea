"""Under torchrun (the agent serves the store): the last rank ends with os._exit(0) right
after a barrier, the others destroy the process group at once and print how long it took.
Rank 0's destroy waited 5 s for the dead rank's "bye" to protect a store its process does
not serve (a helper; gloo returns at once)."""

import os
import time

import torch.distributed as dist

import ringreduce  # noqa: F401 - registers the backend

dist.init_process_group("ringreduce")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
if rank == world - 1:
    os._exit(0)
t0 = time.monotonic()
dist.destroy_process_group()
print(f"rank {rank} destroy {time.monotonic() - t0:.2f} s", flush=True)
