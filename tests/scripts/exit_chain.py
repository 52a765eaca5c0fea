"""Rank 0 exits with code 1 (as a rank does on the PeerFailure its peer's exit causes) a
moment BEFORE rank 1 exits with code 3 (the real failure); rank 2 sleeps. With "exc", both
exit with 1 after a traceback's last line: rank 0's a PeerFailure, rank 1's a ValueError.

Usage: exit_chain.py MARKER [codes|exc]
"""

import os
import sys
import time

print("ready", flush=True)
rank = os.environ["RANK"]
exc = sys.argv[2:] == ["exc"]
if rank == "0":
    time.sleep(0.5)
    if exc:
        print("ringreduce._C.PeerFailure: rank 1 (127.0.0.1) exited", file=sys.stderr, flush=True)
    sys.exit(1)
if rank == "1":
    time.sleep(0.6)
    if exc:
        print("ValueError: the real failure", file=sys.stderr, flush=True)
    sys.exit(1 if exc else 3)
while True:
    time.sleep(1000)
