"""The process-wide default communicator created by ringreduce.init()."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Group:
    """An initialised communicator and what init learned about the job."""

    rank: int
    world_size: int
    comm: Any  # ringreduce._C.Communicator, or None for world_size 1
    hosts: list = field(default_factory=list)
    options: dict = field(default_factory=dict)
    local_rank: int = 0
    default_algo: int = 0  # RINGREDUCE_ALGO: what algo="auto" means for all-reduce
    # The store init made (its _rendezvous registry key; None when the caller or torch
    # passed the store: not ours to release) and this init's key prefix in it.
    store_key: tuple | None = None
    store_prefix: str = ""


_DEFAULT: list = [None]


def current(what: str = "this call") -> Group:
    g = _DEFAULT[0]
    if g is None:
        raise RuntimeError(
            f"ringreduce is not initialised: call ringreduce.init() before {what} "
            f"(it reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun and ringreduce-run set them)"
        )
    return g
