"""Rank 1 raises ValueError from a main decorated with torch's @record (which writes it to
TORCHELASTIC_ERROR_FILE, as under torchrun); the others print their error file's path and
sleep until stopped.

Usage: recorded_error.py MARKER
"""

import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    print("error file", os.environ.get("TORCHELASTIC_ERROR_FILE"), flush=True)
    if os.environ["RANK"] == "1":
        time.sleep(0.5)  # let the other ranks get to their sleep
        raise ValueError("boom from rank 1")
    while True:
        time.sleep(1000)


main()
