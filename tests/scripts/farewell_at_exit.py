"""A farewell talk that destroy() stopped waiting for, still inside a store call when the
program exits, must not abort the process. The store's server (another process) is
stopped, so the talk's store.add blocks in torch's C++ with the GIL released; a shell
continues the server 1 s later, while this interpreter is finalizing (an object whose
__del__ sleeps keeps it there): the call returns, the thread asks for the GIL, Python makes
it exit inside C++ and the process ends in std::terminate -- unless the farewell's exit hook
let the talk end first. Prints "main done"; exits 0 when nothing aborted."""

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from ringreduce import _farewell

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen([sys.executable, "-c", (
    "import sys, time, torch.distributed as d\n"
    f"s = d.TCPStore('127.0.0.1', {port}, None, True, wait_for_workers=False)\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
assert server.stdout.readline().strip() == "up"
store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
store.set("k", "0")
os.kill(server.pid, signal.SIGSTOP)
# Continued 1 s from now by a process of its own (a thread of ours could not run then).
subprocess.Popen(["sh", "-c", f"sleep 1; kill -CONT {server.pid}; sleep 5; kill {server.pid}"],
                 start_new_session=True)
t0 = time.monotonic()
_farewell._talk_until(_farewell._farewell_deadline(0.2, True), lambda: store.add("k", 1))
assert time.monotonic() - t0 < 1.0, "the talk's wait is bounded"


class SlowFinalizer:
    def __del__(self) -> None:
        time.sleep(2.0)  # the interpreter is finalizing meanwhile (GIL released)


keep = SlowFinalizer()
print("main done", flush=True)
