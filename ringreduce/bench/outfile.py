"""Result files written whole or not at all.

A run that fails while writing its --json / --csv / --plot / --tune-out file (a full disk, a
file-size limit, a kill) leaves the previous file as it was -- a truncated JSON that no longer
parses destroyed the last good result (a helper's hunt). A regular file is written to a
temporary name beside it and renamed over it once complete; a symbolic link's file is the
one replaced (the link stays), and what is no regular file (/dev/stdout, a pipe, a FIFO) is
written to directly. A file that cannot be renamed over (a container's bind-mounted file)
gets the finished contents copied in.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import IO, Any

# rename() refused, but the file itself can be written (a bind mount: EBUSY)
_NO_RENAME = (errno.EBUSY, errno.EXDEV, errno.EPERM, errno.EACCES)


def _new_file_mode() -> int:
    """What open() would give a new file: 0666 less the umask (read, not set and reset)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def replacing(path: str, binary: bool = False) -> Iterator[IO[Any]]:
    """A file object whose contents become `path` when the block ends without an error."""
    mode, kw = ("wb", {}) if binary else ("w", {"newline": ""})
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/stdout, /dev/fd/63, a FIFO
        with open(path, mode, **kw) as f:
            yield f
        return
    target = os.path.realpath(path)
    folder, name = os.path.split(target)
    stem, suffix = os.path.splitext(name)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=suffix, dir=folder)
    try:
        with contextlib.suppress(OSError):  # some network mounts refuse chmod
            os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode) if os.path.exists(target)
                      else _new_file_mode())
        with os.fdopen(fd, mode, **kw) as f:
            yield f
        try:
            os.replace(tmp, target)
        except OSError as e:
            if e.errno not in _NO_RENAME:
                raise
            with open(tmp, "rb") as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.unlink(tmp)
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
