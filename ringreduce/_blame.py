"""In a rank of ringreduce-run: mark an exit on an uncaught PeerFailure (or another error
that only relays another rank's failure) for the launcher (ringreduce/run.py reads the
marks to blame the rank that failed first). Its own module: ``import ringreduce`` installs
it, and importing ringreduce.run instead made ``python -m ringreduce.run`` warn that the
module was already imported."""

from __future__ import annotations

import os
import sys

from . import _env


def is_secondary(e: BaseException, peer_failure: type[BaseException]) -> bool:
    """A PeerFailure, or an error that relays another rank's (SECONDARY set: "stopped
    waiting ... because another rank failed", read from the store during set-up)."""
    return isinstance(e, peer_failure) or bool(getattr(e, SECONDARY, False))


SECONDARY = "ringreduce_relayed"  # attribute set on errors that relay another rank's


def named_rank(e: BaseException) -> int | None:
    """The world rank error `e` names (.peer_rank), if it names one."""
    named = getattr(e, "peer_rank", None)
    return named if isinstance(named, int) and named >= 0 else None


def mark_peer_failures(peer_failure: type[BaseException]) -> None:
    """In a rank of ringreduce-run (``import ringreduce`` calls it): when the process ends on
    an uncaught `peer_failure` (or an exception raised while handling one, or from one) --
    which only reports another rank's failure -- mark it for the launcher, so that it names
    the rank that failed first, not one that failed because of it. Told through a file, not
    read from the traceback's text: other hooks reformat it (torch prefixes every line with
    "[rankN]: "), and with --no-prefix the launcher does not see the ranks' output."""
    folder = _env.peer_failures_folder()
    if not folder:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
        seen: BaseException | None = value
        for _ in range(16):  # a bounded walk down the chain (it may be a cycle)
            if seen is None or is_secondary(seen, peer_failure):
                break
            seen = seen.__cause__ or seen.__context__
        if seen is not None and is_secondary(seen, peer_failure):
            # The world rank it names, if any: the launcher blames that rank when every rank
            # that failed only reported it (it froze, or left early with code 0).
            named = named_rank(seen)
            try:
                with open(os.path.join(folder, str(os.getpid())), "x") as f:
                    f.write("" if named is None else str(named))
            except OSError:
                pass  # the launcher is gone, or this process marked it already
        previous(kind, value, tb)  # type: ignore[arg-type]

    sys.excepthook = hook
