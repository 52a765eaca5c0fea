"""Result files written whole or not at all.

A run that fails while writing its --json / --csv / --plot / --tune-out file (a full disk, a
file-size limit, a kill) leaves the previous file as it was -- a truncated JSON that no longer
parses destroyed the last good result (a helper's hunt). Each file is written to a temporary
name beside it and renamed over it once complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replacing(path: str, binary: bool = False) -> Iterator[IO[Any]]:
    """A file object whose contents become `path` when the block ends without an error."""
    folder, name = os.path.split(os.path.abspath(path))
    stem, suffix = os.path.splitext(name)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=suffix, dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would have made it, not mkstemp's 0600
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str, data: Any, **dump_args: Any) -> None:
    with replacing(path) as f:
        json.dump(data, f, **dump_args)


def save_figure(fig: Any, path: str, **savefig_args: Any) -> None:
    """matplotlib's savefig, in the format the name's suffix says."""
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    with replacing(path, binary=True) as f:
        fig.savefig(f, format=fmt, **savefig_args)
