"""ringreduce-run's copy of the ranks' output (ringreduce/run.py loads this file by its
path: neither imports anything of the package). Bytes are copied as they come -- a partial
line (a prompt, a progress bar) shows at once -- with a prefix at each line's start."""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import select
import threading
from typing import IO, Callable

_LINE_STARTS = re.compile(rb"(?<=\n)|(?<=\r)(?!\n)")  # after \n, after a redrawing \r


def prefixed(chunk: bytes, prefix: bytes, at_start: bool) -> bytes:
    """`chunk` with `prefix` at each line's start in it (at its own start too when
    `at_start`), not after its end (the next chunk's start gets it)."""
    parts = _LINE_STARTS.split(chunk)
    return (prefix if at_start else b"") + prefix.join(parts[:-1] if parts[-1] == b"" else parts)


def split_utf8(chunk: bytes) -> tuple[bytes, bytes]:
    """(whole, rest): `rest`, the bytes of a UTF-8 character `chunk` ends in the middle of
    (a read that cut it, or a writer that split it), kept for the next read -- another
    rank's output could end the line between its halves, and the newline put there broke
    the character."""
    for k in range(1, min(4, len(chunk)) + 1):
        b = chunk[-k]
        if b & 0xC0 != 0x80:  # not a continuation byte: the last character's first byte
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else \
                4 if b & 0xF8 == 0xF0 else 1
            return (chunk[:-k], chunk[-k:]) if need > k else (chunk, b"")
    return chunk, b""


class Screen:
    """What the output pumps share: one writer at a time; the pump that left a line open (a
    prompt, a progress bar) and its writer -- another's output ends that line first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: tuple[object, Callable[[bytes], None]] | None = None

    def end_open_line(self) -> None:
        """(With the lock held.) End a pump's open line: its rest starts a new one."""
        if self.open is not None:
            with contextlib.suppress(ValueError, OSError):
                self.open[1](b"\n")
            self.open = None

    def say(self, text: str, stream: IO[str]) -> None:
        """The launcher's own message, on a line of its own."""
        with self.lock:
            self.end_open_line()
            print(text, file=stream, flush=True)


def pump(src: IO[bytes], dst: IO[str], prefix: bytes, screen: Screen) -> None:
    """Copy a child's pipe to our stream as its bytes come (a partial line shows at once; it
    waited for its newline), a prefix at each line's start, until EOF."""
    binary = getattr(dst, "buffer", None)  # absent when a caller swapped in a text stream
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode

    def write(data: bytes) -> None:
        if binary is not None:
            binary.write(data)
            binary.flush()
        else:
            dst.write(decode(data))
            dst.flush()

    me, broken, at_start, after_cr, opened = object(), False, True, False, False
    fd, held = src.fileno(), b""
    while True:
        chunk = os.read(fd, 65536)
        eof = not chunk
        chunk, held = held + chunk, b""
        # A line's rest a moment later (print() under -u writes its text, then the newline)
        # goes with it: another rank's output then seldom has to end the line first.
        while chunk and not chunk.endswith(b"\n") and select.select([fd], [], [], 0.02)[0]:
            more = os.read(fd, 65536)
            if not more:
                break
            chunk += more
        if not eof:
            chunk, held = split_utf8(chunk)
        with screen.lock:
            if opened and not (screen.open is not None and screen.open[0] is me):
                # Another rank's output (or the launcher's) ended our open line: what we
                # write next starts a new one; a newline ending the old one is done already.
                opened, at_start, after_cr = False, True, False
                chunk = chunk[1:] if chunk[:1] == b"\n" else chunk
            if eof and not chunk:
                if opened:  # the last line without its newline gets one
                    with contextlib.suppress(ValueError, OSError):
                        write(b"" if broken else b"\n")
                    screen.open = None
                break
            if not chunk:
                continue
            if not opened:
                screen.end_open_line()  # another rank's
            out = prefixed(chunk, prefix, at_start and not (after_cr and chunk[:1] == b"\n"))
            at_start, after_cr = chunk.endswith((b"\n", b"\r")), chunk.endswith(b"\r")
            # A line ended by \r stays open: a progress bar's last redraw is ended by the
            # next output or at EOF (a \r\n split between reads gets no prefix on its \n).
            opened = not chunk.endswith(b"\n")
            screen.open = (me, write) if opened else None
            if not broken:
                try:
                    write(out)
                except (ValueError, OSError):  # closed or broken pipe (e.g. piped into head)
                    broken = True  # drained on, so that the child never blocks on a full pipe
    src.close()
