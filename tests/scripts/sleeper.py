"""Print 'ready', then sleep until interrupted. Usage: sleeper.py MARKER [options]

--ignore-term    ignore SIGTERM (the launcher must escalate to SIGKILL)
--grandchild     start a child process (same marker) that sleeps forever too
On KeyboardInterrupt (a forwarded SIGINT) print 'interrupted' and exit with code 1.
"""

import os
import signal
import subprocess
import sys
import time

marker = sys.argv[1]
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--grandchild" in sys.argv:
    code = "import time\nwhile True: time.sleep(1000)"
    subprocess.Popen([sys.executable, "-c", code, marker, "grandchild"])
try:
    print(f"ready {os.environ['RANK']}", flush=True)
    while True:
        time.sleep(1000)
except KeyboardInterrupt:
    print(f"interrupted {os.environ['RANK']}", flush=True)
    sys.exit(1)
