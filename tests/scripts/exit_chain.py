"""Rank 0 exits with code 1 (as a rank does on the PeerFailure its peer's exit causes) a
moment BEFORE rank 1 exits with code 3 (the real failure); rank 2 sleeps.

Usage: exit_chain.py MARKER
"""

import os
import sys
import time

print("ready", flush=True)
rank = os.environ["RANK"]
if rank == "0":
    time.sleep(0.5)
    sys.exit(1)
if rank == "1":
    time.sleep(0.6)
    sys.exit(3)
while True:
    time.sleep(1000)
