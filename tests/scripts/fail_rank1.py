"""Rank 1 exits with code 3 once every rank is up; the others sleep forever.

Usage: fail_rank1.py MARKER [--ignore-term]. With --ignore-term the sleeping ranks ignore
SIGTERM, so the launcher has to escalate to SIGKILL.
"""

import os
import signal
import sys
import time

if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
if os.environ["RANK"] == "1":
    time.sleep(0.5)  # let the other ranks get to their sleep
    sys.exit(3)
while True:
    time.sleep(1000)
