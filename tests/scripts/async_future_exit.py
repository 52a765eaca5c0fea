"""A job that ends with a completed async collective's Future and never calls destroy.

    python async_future_exit.py PORT

World 1 over the ringreduce backend: a few async all_reduces whose Futures are waited for,
then a normal exit (no destroy_process_group). The completer thread used to keep the last
Future alive into interpreter finalization, where freeing it aborted the process (rc 134 in
8 of 40 exits of this script; Lightning jobs ended that way). Must exit 0 and print "ok".
"""

import os
import sys

import torch
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("ringreduce", rank=0, world_size=1)
for i in range(3):
    t = torch.full((1000,), float(i + 1))
    out = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(out.wait(), torch.full((1000,), 2.0 * (i + 1))), out.value()
print("ok", flush=True)
