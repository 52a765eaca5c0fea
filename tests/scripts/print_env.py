"""Print one JSON line with the launcher-provided environment of this rank.

Also runnable as a module (``-m print_env``) for the launcher's -m mode.
"""

import json
import os
import sys

KEYS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE", "RINGREDUCE_SECRET", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
)

info = {k: os.environ.get(k) for k in KEYS}
info["argv"] = sys.argv[1:]
info["own_group"] = os.getpgid(0) == os.getpid()
info["main"] = __name__
print(json.dumps(info))
