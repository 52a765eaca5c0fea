"""Write known lines to stdout and stderr, the last one without a newline."""

import os
import sys

rank = os.environ["RANK"]
print(f"out line 1 from {rank}")
print(f"err line from {rank}", file=sys.stderr)
print(f"out line 2 from {rank}")
sys.stdout.write(f"partial from {rank}")
