"""Run by tests/test_launcher.py under ringreduce-run: after init (argv[1]: "rr" for
ringreduce.init(), "torch" for init_process_group("ringreduce")) every rank forks children,
as DataLoader workers do, that try a collective (refused: the communicator is the
parent's) and then exit normally, running the inherited exit hooks (which must neither hang
nor say goodbye for the parent); the parents' collectives stay right. Last, a child waits
for an async all-reduce its parent started and had not completed at the fork: refused (it
waited forever: only the parent's thread completes it). The children's
ringreduce.get_rank()/get_world_size()/is_initialized() give the parent's world's numbers
(they raised / said False: a Dataset sharding by rank broke in DataLoader workers)."""

import os
import sys
import time

import _either_api
import torch

rank, world, allreduce, finish = _either_api.init(sys.argv[1])
for it in range(3):
    pid = os.fork()
    if pid == 0:
        import ringreduce as rr

        # What a DataLoader worker shards by: the parent's numbers (torch's answer there).
        seen = (rr.is_initialized(), rr.get_rank(), rr.get_world_size())
        print(f"rank {rank} child sees {'ok' if seen == (True, rank, world) else seen}",
              flush=True)
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
if rank == 1:
    time.sleep(1.0)  # rank 0's all-reduce is still running when it forks
x = torch.full((1 << 16,), float(rank))
w = allreduce(x, async_op=True)
pid = os.fork() if rank == 0 else -1
if pid == 0:
    try:
        w.wait()
        print(f"rank {rank} child ran a collective (waited for the parent's)", flush=True)
    except Exception as e:  # noqa: BLE001 - reported, the test reads it
        print(f"rank {rank} child refused: {type(e).__name__}: {e}", flush=True)
    os._exit(0)
w.wait()
if pid > 0:
    assert os.waitpid(pid, 0)[1] == 0
assert torch.equal(x, torch.full_like(x, float(sum(range(world))))), x
print(f"rank {rank} ok", flush=True)
finish()
