"""Which store server instance a store talks to, for counting inits per server.

Each init's keys live under a prefix numbered by the inits this process made before on the
same store server (_rendezvous._GENERATIONS). Keyed by the server's address alone, a server
made again on the same port (rank 0 re-creating it after a failed rank was replaced: the
survivors counted 1 earlier init, the replacement 0) or a second FileStore/HashStore (every
non-TCP store shared one count) put ranks of one world under different prefixes: they waited
out the connect timeout for each other's keys (found by a helper; gloo runs both). The first
client of a server writes a random instance id there (later ones read it), and counts are
kept per (address, instance).
"""

from __future__ import annotations

import secrets
import weakref
from typing import Any

from ._procnet import find_store
from ._store_keys import publish_once

KEY = "ringreduce/instance"
_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # root store -> its id


def store_instance(store: Any, create: bool = True) -> str:
    """The instance id of the server under `store` (through PrefixStores; asked once per
    store object, a failure too: one store's answer never changes). create=False only reads
    (a store that may be another program's): "" where none is written yet, or on an error."""
    root = find_store(store, lambda s: getattr(s, "underlying_store", None) is None) or store
    try:
        return _SEEN[root]
    except (KeyError, TypeError):
        pass
    if not create:
        try:
            return bytes(root.get(KEY)).decode() if root.check([KEY]) else ""
        except Exception:  # noqa: BLE001 - a store that cannot say
            return ""
    try:
        inst = publish_once(root, KEY, secrets.token_hex(8))
    except Exception:  # noqa: BLE001 - a store that cannot say, or one gone: per address
        inst = ""
    try:
        _SEEN[root] = inst
    except TypeError:  # not weakly referable: asked again next time
        pass
    return inst
