"""The torch backend's Work (ringreduce.backend): a ringreduce collective in flight as
torch sees it -- wait() with an optional timeout, get_future(), result(), the recv's source
rank -- over a Completion (_futures)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _C, _env
from ._futures import Completion


class _Work(dist._Work):
    """A collective in flight: wait() blocks (GIL released), get_future() gives outputs."""

    def __init__(self, completion: Completion):
        super().__init__()
        self._c = completion

    def wait(self, timeout: timedelta | None = None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        # Beyond the longest wait any deadline takes (a year): as good as none, as gloo's.
        if secs and 0 < secs <= _env.MAX_WAIT_S and not self._c.is_completed():
            w = self._c.work
            if w is not None and not w.wait(secs):
                raise _C.CollectiveTimeout(
                    f"ringreduce: the collective did not complete within work.wait(timeout="
                    f"{secs:g} s); it is still running (it fails by itself at the "
                    f"process group's timeout, RINGREDUCE_TIMEOUT)")
        exc = self._c.settle()  # its Future is done too once wait() returns
        if exc is not None:
            raise exc
        return True

    def get_future(self) -> torch.futures.Future:
        # (The Python process group's; the C++ adapter converts raw_future() itself.) C++
        # sees a Python set_exception() as a plain value: a callback that raises fails it.
        return self._c.future().then(_value_or_raise)

    def raw_future(self) -> torch.futures.Future:
        return self._c.future()

    def source_rank(self) -> int:
        """recv / recv_anysource: the sender's rank in the process group (after wait)."""
        src = getattr(self, "source", None)
        if src is None:
            raise RuntimeError("sourceRank() is defined for the Work of a recv only")
        self.wait()
        return int(src() if callable(src) else src)

    def is_completed(self) -> bool:
        return self._c.is_completed()

    def is_success(self) -> bool:
        return self._c.is_completed() and self._c.exception() is None

    def exception(self) -> BaseException | None:
        return self._c.exception()

    def result(self) -> list:
        self.wait()
        v = self._c.value
        return v if isinstance(v, list) else []

    def synchronize(self) -> None:
        self.wait()


def _value_or_raise(fut: torch.futures.Future) -> Any:
    v = fut.value()  # raises if the future carries its error as one
    if isinstance(v, BaseException):  # a Python set_exception(), seen through C++
        raise v
    return v


def _work(rr_work: Any, value: Any, after: Callable[[], None] | None = None) -> _Work:
    return _Work(Completion(rr_work, value, after))


def _done(value: Any) -> _Work:
    return _Work(Completion(None, value))
