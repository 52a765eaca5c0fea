"""For the scripts here that run on either API: ringreduce.init() ("rr") or
init_process_group("ringreduce") ("torch")."""

from __future__ import annotations

from typing import Any, Callable


def init(api: str) -> tuple[int, int, Callable[[Any], Any], Callable[[], None]]:
    """Init on `api`; returns (rank, world size, all-reduce in place, destroy)."""
    if api == "rr":
        import ringreduce as rr

        rr.init()
        return rr.get_rank(), rr.get_world_size(), rr.allreduce, rr.destroy
    import torch.distributed as dist

    dist.init_process_group("ringreduce")
    return dist.get_rank(), dist.get_world_size(), dist.all_reduce, dist.destroy_process_group
