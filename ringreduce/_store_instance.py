"""Which store server instance a store talks to, for counting inits per server.

Each init's keys live under a prefix numbered by the inits this process made before on the
same store server (_rendezvous._GENERATIONS). Keyed by the server's address alone, a server
made again on the same port (rank 0 re-creating it after a failed rank was replaced: the
survivors counted 1 earlier init, the replacement 0) or a second FileStore/HashStore (every
non-TCP store shared one count) put ranks of one world under different prefixes: they waited
out the connect timeout for each other's keys (found by a helper; gloo runs both). The first
client of a server writes a random instance id there (compare_set: later ones read it), and
counts are kept per (address, instance).
"""

from __future__ import annotations

import secrets
import weakref
from typing import Any

from ._procnet import find_store

KEY = "ringreduce/instance"
_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # root store -> its id


def store_instance(store: Any) -> str:
    """The instance id of the server under `store` (through PrefixStores; one store round
    trip per store object); "" if the store cannot say (then counts are per address)."""
    root = find_store(store, lambda s: getattr(s, "underlying_store", None) is None) or store
    try:
        return _SEEN[root]
    except (KeyError, TypeError):
        pass
    try:
        got = root.compare_set(KEY, "", secrets.token_hex(8))
        inst = got.decode() if isinstance(got, bytes) else str(got)
    except Exception:  # noqa: BLE001 - a store without compare_set, or one gone: per address
        return ""
    try:
        _SEEN[root] = inst
    except TypeError:  # not weakly referable: asked again next time
        pass
    return inst
