"""flood_listeners.py PID SKIP_PORT: until killed, find the TCP ports process PID listens on
(but SKIP_PORT) and flood each with connections -- silent ones and ones sending garbage,
up to 300 held, as a port scanner or hostile process might (tests/test_hardening.py)."""

import os
import socket
import sys
import time

pid, skip = sys.argv[1], int(sys.argv[2])


def listening_ports() -> set:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        sys.exit(0)  # it ended
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports - {skip}


held: list = []
k = 0
while True:
    for port in listening_ports():
        for _ in range(20):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            k += 1
            if k % 3 == 1:
                try:
                    s.send(os.urandom(100))
                except OSError:
                    pass
            held.append(s)
            while len(held) > 300:
                held.pop(0).close()
    time.sleep(0.01)
