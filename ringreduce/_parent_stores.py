"""In a forked child: the stores its parents made or used. Their sockets are shared with the
parent: a child's init() that took one from _rendezvous's registry interleaved its requests
with the parent's and corrupted its job (a helper's fork hunt). The objects are kept, so
that their destructors (a server's thread, which the child does not have) never run here."""

from __future__ import annotations

import os
from typing import Any

_PARENTS: dict[tuple, int] = {}  # (addr, port) -> the pid of the parent that made it
_OBJECTS: list = []


def inherit(stores: dict[tuple, Any], torch_store: Any) -> None:
    """After a fork, in the child: `stores` (_rendezvous._STORES) and torch's default store
    (None: none) are the parent's."""
    parent = os.getppid()
    _OBJECTS.extend(stores.values())
    _PARENTS.update({k: parent for k in stores})
    if torch_store is not None:
        _OBJECTS.append(torch_store)


def refuse(store: Any, key: tuple | None) -> None:
    """Raise if `store` (or the store at `key`, an (addr, port)) is a parent's."""
    parent = _PARENTS.get(key) if key is not None else None
    if parent is None and store is not None and any(store is o for o in _OBJECTS):
        parent = os.getppid()
    if parent is not None:
        where = f" at {key[0]}:{key[1]}" if key is not None else " (torch's default store)"
        raise RuntimeError(
            f"this process was forked from process {parent}, whose job uses the store{where}: "
            f"a forked process cannot share it. To give this process a world of its own, set "
            f"its own MASTER_PORT (and RANK/WORLD_SIZE) before init(), or start it with "
            f"multiprocessing's 'spawn' method")
