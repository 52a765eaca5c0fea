"""Rank 0 exits with code 1 (as a rank does on the PeerFailure its peer's exit causes) a
moment BEFORE rank 1 exits with code 3 (the real failure); rank 2 sleeps. With "exc", both
exit with 1 on an exception printed as an uncaught one is: rank 0's a ringreduce PeerFailure
(raised while handling another error, as a wrapper would), rank 1's a ValueError. "exc-torch" as "exc",
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
# Rank 0 leaves this file (its pid) just before it fails: rank 1 fails once rank 0's process
# has ended, however long each took to start or rank 0 to exit (under load in CI rank 0's
# exit came more than SETTLE_S after rank 1's, which then was named alone).
first = os.path.join(tempfile.gettempdir(), f"{sys.argv[1]}-rank0-failed")


def ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, not reaped
    except (OSError, IndexError):
        return True


def ends_now() -> None:
    """The exception being handled, printed as an uncaught one is (sys.excepthook), then
    exit 1 at once: the interpreter's shutdown took from 0.1 to over 0.6 s under load, and
    the race below needs each rank's exit where it is placed."""
    sys.excepthook(*sys.exc_info())
    sys.stderr.flush()
    os._exit(1)


def fail_rank0() -> None:
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


if rank == "0":
    time.sleep(0.5)
    with open(first + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(first + ".tmp", first)
    try:
        fail_rank0()
    except SystemExit as e:
        os._exit(int(e.code or 0))
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then gone
        ends_now()
if rank == "1":
    for _ in range(200):
        if os.path.exists(first):
            break
        time.sleep(0.05)
    with open(first) as f:
        pid0 = int(f.read())
    os.unlink(first)
    for _ in range(400):
        if ended(pid0):
            break
        time.sleep(0.025)
    time.sleep(0.05)
    if mode == "codes":
        os._exit(3)
    try:
        raise ValueError("the real failure")
    except ValueError:
        ends_now()
while True:
    time.sleep(1000)
