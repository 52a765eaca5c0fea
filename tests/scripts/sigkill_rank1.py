"""Rank 1 kills itself with SIGKILL; the others sleep forever. Usage: sigkill_rank1.py MARKER"""

import os
import signal
import time

if os.environ["RANK"] == "1":
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    time.sleep(1000)
