"""All-reduces of rank- and job-dependent data checked against numpy, every 0.1 s until the
file STOP exists (at least 3, at most 300), so that another job can start meanwhile. Prints
"ready" once initialised, "ok" after every check passed.

Usage: checked_allreduces.py MARKER SEED STOP
"""

import os
import sys
import time

import numpy as np

import ringreduce as rr

seed, stop = int(sys.argv[2]), sys.argv[3]
rr.init()
rank, world = rr.get_rank(), rr.get_world_size()
print("ready", flush=True)
for i in range(300):
    x = np.arange(1000, dtype=np.float64) * seed + rank * 10 + i
    rr.allreduce(x)
    want = np.arange(1000, dtype=np.float64) * seed * world + 10 * sum(range(world)) + i * world
    assert np.array_equal(x, want), (i, x[:3], want[:3])
    done = np.array([float(os.path.exists(stop))])
    rr.allreduce(done)  # every rank stops after the same iteration
    if i >= 2 and done[0] > 0:
        break
    time.sleep(0.1)
rr.destroy()
print("ok", flush=True)
