"""Rank 0 exits with code 1 (as a rank does on the PeerFailure its peer's exit causes) a
moment BEFORE rank 1 exits with code 3 (the real failure); rank 2 sleeps. With "exc", both
exit with 1 on an uncaught exception: rank 0's a ringreduce PeerFailure (raised while
handling another error, as a wrapper would), rank 1's a ValueError. "exc-torch" as "exc",
under the excepthook torch.distributed installs, which prefixes every line with "[rankN]: ".

"relayed": rank 0's error relays a failure rank 1 posted to the store (set-up's waits).

Usage: exit_chain.py MARKER [codes|exc|exc-torch|relayed]
"""

import io
import os
import sys
import tempfile
import time

rank = os.environ["RANK"]
mode = sys.argv[2] if len(sys.argv) > 2 else "codes"
if mode != "codes":
    import ringreduce  # (about a second: before the race below starts)
print("ready", flush=True)
if mode == "exc-torch":
    old_hook = sys.excepthook

    def torch_like_hook(*args: object) -> None:  # as torch.distributed's excepthook
        old, sys.stderr = sys.stderr, io.StringIO()
        try:
            old_hook(*args)  # type: ignore[arg-type]
        finally:
            text, sys.stderr = sys.stderr.getvalue(), old
        sys.stderr.write("\n".join(f"[rank{rank}]: {s}" if s else "" for s in text.split("\n")))

    sys.excepthook = torch_like_hook
# Rank 0 leaves this file just before it fails: rank 1 fails after it, however long each
# took to start.
first = os.path.join(tempfile.gettempdir(), f"{sys.argv[1]}-rank0-failed")
if rank == "0":
    time.sleep(0.5)
    open(first, "w").close()
    if mode == "relayed":  # set-up's error relaying a failure another rank posted
        from ringreduce import _store_wait

        class Posted:  # a store holding rank 1's posted failure
            def check(self, keys: list) -> bool:
                return True

            def get(self, key: str) -> bytes:
                return b"RingReduceError\nrank 1 was interrupted during init"

        _store_wait.raise_posted(Posted(), ["failed"], 0, "init")
    if mode != "codes":
        try:
            raise ringreduce.PeerFailure("rank 1 (127.0.0.1) exited")
        except ringreduce.PeerFailure as e:
            raise RuntimeError("training step failed") from e
    sys.exit(1)
if rank == "1":
    for _ in range(200):
        if os.path.exists(first):
            break
        time.sleep(0.05)
    os.unlink(first)
    time.sleep(0.1)
    if mode != "codes":
        raise ValueError("the real failure")
    sys.exit(3)
while True:
    time.sleep(1000)
