"""Run by tests/test_launcher.py under ringreduce-run: after init (argv[1]: "rr" for
ringreduce.init(), "torch" for init_process_group("ringreduce")) every rank forks children,
as DataLoader workers do, that try a collective (refused: the communicator is the
parent's) and then exit normally, running the inherited exit hooks (which must neither hang
nor say goodbye for the parent); the parents' collectives stay right."""

import os
import sys

import _either_api
import torch

rank, world, allreduce, finish = _either_api.init(sys.argv[1])
for it in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            allreduce(torch.full((4,), 100.0))
            print(f"rank {rank} child ran a collective", flush=True)
        except Exception as e:  # noqa: BLE001 - reported, the test reads it
            print(f"rank {rank} child refused: {type(e).__name__}: {e}", flush=True)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"child exited with status {status}"
    x = torch.full((4,), float(rank + it))
    allreduce(x)
    assert torch.equal(x, torch.full((4,), float(sum(range(world)) + world * it))), x
print(f"rank {rank} ok", flush=True)
finish()
