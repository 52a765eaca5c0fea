"""Each rank leaves a shared-memory segment named as ringreduce names its own
(rr-<tag>-<pid>-<32 hex digits>, csrc/transport/shm/segment.cc), as a rank SIGKILLed while
its peers had not mapped its segment yet does; rank 1 then SIGKILLs itself, the others
sleep until the launcher stops them. Usage: shm_left_by_killed.py MARKER"""

import os
import secrets
import signal
import sys
import time

marker = sys.argv[1]
with open(f"/dev/shm/rr-{marker}-{os.getpid()}-{secrets.token_hex(16)}", "wb") as f:
    f.write(b"\0" * 4096)
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    time.sleep(1000)
