"""Rank 2 stops taking part in a loop of all-reduces: "freeze" (SIGSTOP: its peers find it
silent) or "leave" (os._exit(0): its peers find it gone). Ranks 0 and 1 end on the uncaught
PeerFailure naming it (exit code 1); the launcher must name rank 2, which did not fail on
its own -- before, it named rank 0 or 1.

"freeze_slow_exit": as freeze, and rank 0's exit hooks take 2 s (as destroy()'s farewell
may, waiting for the frozen rank) -- it is still reported, not counted as stopped.

Usage: blamed_peer.py MARKER freeze|freeze_slow_exit|leave
"""

import atexit
import os
import signal
import sys
import time

import numpy as np

import ringreduce as rr

rr.init()
if sys.argv[2] == "freeze_slow_exit" and rr.get_rank() == 0:
    atexit.register(time.sleep, 2.0)  # runs first: registered after ringreduce's hooks
x = np.ones(1000)
for i in range(1000):
    if rr.get_rank() == 2 and i == 3:
        if sys.argv[2].startswith("freeze"):
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            os._exit(0)
    rr.allreduce(x)
rr.destroy()
