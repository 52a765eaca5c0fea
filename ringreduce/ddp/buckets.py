"""Bucket assignment: pure math, no tensors and no I/O (tested exhaustively on its own).

Gradients are reduced in buckets: contiguous flat buffers holding several parameters'
gradients, so one all-reduce moves many small tensors. The order of parameters in the buckets
is the order their gradients are expected to become ready during backward: reverse
registration order at first (the last layer's gradients are computed first), then the order
actually observed in the first iteration (rank 0's, agreed by broadcast).

As PyTorch's DDP does, the first bucket is small (1 MiB) so that communication starts early in
backward; later buckets close once they reach the cap. Parameters of different dtypes never
share a bucket (one all-reduce has one dtype); each dtype has its own open bucket and its own
first-bucket limit.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_CAP_MB = 25.0


def cap_bytes(bucket_cap_mb: float) -> int:
    """Bucket cap in bytes for a bucket_cap_mb argument (MiB, as torch DDP reads it)."""
    if bucket_cap_mb is None:
        bucket_cap_mb = DEFAULT_BUCKET_CAP_MB
    if not bucket_cap_mb >= 0:
        raise ValueError(f"bucket_cap_mb must be >= 0 (0: one bucket per parameter), got "
                         f"{bucket_cap_mb}")
    return int(bucket_cap_mb * 1024 * 1024)


def assign_buckets(order: Sequence[int], nbytes: Sequence[int], keys: Sequence[Hashable],
                   cap: int, first_cap: int = FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Group parameter indices into buckets.

    order: parameter indices in expected gradient-ready order (a permutation of a subset of
    range(len(nbytes))). nbytes[i]: gradient size of parameter i; keys[i]: what must match
    inside a bucket (dtype). A bucket closes as soon as its size reaches its limit: the first
    bucket of each key is limited by min(first_cap, cap), later ones by cap (so a bucket may
    exceed its limit by its last parameter, and a parameter bigger than the cap gets a bucket
    of its own). Buckets are returned ordered by the position of their first parameter in
    `order`, so bucket 0 holds the earliest-ready gradients.
    """
    if cap < 0 or first_cap < 0:
        raise ValueError("bucket limits must be >= 0 (0: one parameter per bucket)")
    seen = set()
    for i in order:
        if not 0 <= i < len(nbytes):
            raise ValueError(f"parameter index {i} out of range for {len(nbytes)} parameters")
        if i in seen:
            raise ValueError(f"parameter index {i} appears twice in the bucket order")
        seen.add(i)
    first_limit = min(first_cap, cap)
    open_: dict[Hashable, tuple[list[int], int]] = {}  # key -> (indices, bytes)
    closed_count: dict[Hashable, int] = {}
    done: list[tuple[int, list[int]]] = []  # (position of first member, indices)
    pos = {i: k for k, i in enumerate(order)}
    for i in order:
        key = keys[i]
        members, size = open_.get(key, ([], 0))
        members.append(i)
        size += int(nbytes[i])
        limit = first_limit if closed_count.get(key, 0) == 0 else cap
        if size >= limit:
            done.append((pos[members[0]], members))
            closed_count[key] = closed_count.get(key, 0) + 1
            open_.pop(key, None)
        else:
            open_[key] = (members, size)
    for members, _ in open_.values():
        done.append((pos[members[0]], members))
    done.sort(key=lambda t: t[0])
    return [m for _, m in done]


def complete_order(observed: Sequence[int], n: int, include: Sequence[int]) -> list[int]:
    """The bucket order after the first iteration: the observed ready order (duplicates and
    indices outside `include` dropped), then the never-ready parameters of `include` in
    reverse registration order."""
    inc = set(include)
    out: list[int] = []
    seen = set()
    for i in observed:
        if i in inc and i not in seen and 0 <= i < n:
            out.append(i)
            seen.add(i)
    out.extend(i for i in sorted(inc, reverse=True) if i not in seen)
    return out
