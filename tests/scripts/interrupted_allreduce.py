"""Ranks 0 and 1 wait in an all-reduce for rank 2, which sleeps; a SIGINT forwarded by the
launcher reaches all three. Each prints 'interrupted R' on KeyboardInterrupt (and whether
ringreduce noted the peer's failure on it), 'failed R: <type>' on anything else.
Usage: interrupted_allreduce.py MARKER"""

import os
import sys
import time

import numpy as np

import ringreduce as rr

rank = int(os.environ["RANK"])
rr.init()
print(f"ready {rank}", flush=True)
try:
    if rank == 2:
        time.sleep(1000)
    rr.allreduce(np.ones(4, np.float32))
    print(f"done {rank}", flush=True)
except KeyboardInterrupt as e:
    print(f"interrupted {rank} notes={len(getattr(e, '__notes__', []))}", flush=True)
    sys.exit(1)
except Exception as e:  # noqa: BLE001
    print(f"failed {rank}: {type(e).__name__}", flush=True)
    sys.exit(2)
