"""The whole job is stopped (SIGSTOP, as a suspended job) for PAUSE s while ranks wait in
destroy() for the last rank, which computes 3 s first; then SIGCONT. Every rank must end
cleanly: the farewell's deadlines all passed at once on resuming, rank 0 closed the store
under the late rank, and a rank left its farewell thread in a store call at exit
(std::terminate, SIGABRT; found by a helper). Usage: paused_destroy.py PAUSE"""

import os
import subprocess
import sys
import time

import numpy as np

import ringreduce as rr

rr.init()
rank, world = rr.get_rank(), rr.get_world_size()
pids = " ".join(str(int(p)) for p in rr.allgather(np.array([os.getpid()], np.int64)).ravel())
x = np.ones(4)
rr.allreduce(x)
stopper = None
if rank == world - 1:
    stopper = subprocess.Popen(
        ["sh", "-c", f"sleep 0.5; kill -STOP {pids}; sleep {sys.argv[1]}; kill -CONT {pids}"],
        start_new_session=True)
    time.sleep(3.0)
rr.destroy()
if stopper is not None:
    stopper.wait(60)
print(f"rank {rank} destroyed", flush=True)
