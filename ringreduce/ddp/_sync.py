"""Construction-time agreement across ranks: parameter shapes, then rank 0's state.

Both run on the default ringreduce communicator, in the same order on every rank.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from .. import api

# Tensors are broadcast as raw bytes, packed into chunks of at most this size (as torch
# DDP's _sync_module_states packs 250 MB): one collective per chunk, whatever the dtypes.
BROADCAST_CHUNK_BYTES = 256 * 1024 * 1024


def _describe(p: torch.Tensor, is_buffer: bool = False) -> str:
    return f"{tuple(p.shape)} {str(p.dtype).replace('torch.', '')}" + (
        "" if p.requires_grad or is_buffer else " (requires_grad=False)")


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def verify_shapes(names: Sequence[str], params: Sequence[torch.Tensor], rank: int,
                  world: int, num_buffers: int = 0, group: Any = None,
                  options: Sequence[tuple] = ()) -> None:
    """Raise ValueError on every rank when the ranks' parameter lists differ, naming the
    first parameter that differs (index, name, shape and dtype on each rank) -- or when
    their `options` ((argument name, integer value) pairs: the wrapper's arguments that
    decide which collectives run) differ, naming the first one.

    The last `num_buffers` entries of `params` are buffers (checked the same way, without
    requires_grad): ranks whose buffers differ would otherwise fail later, in the buffer
    broadcast, with a less helpful count mismatch. One all-gather when the ranks agree.
    """
    nparams = len(params) - num_buffers
    descs = [_describe(p, i >= nparams) for i, p in enumerate(params)]
    summary = torch.tensor([len(params), nparams, _hash64("|".join(descs))]
                           + [int(v) for _, v in options], dtype=torch.int64)
    gathered = api.allgather(summary, group=group)  # (world, 3 + len(options))
    if bool((gathered == gathered[0]).all()):
        return
    at = world_ranks(group, world)  # messages name world ranks, as every other error does
    _check_options(gathered[:, 3:], options, at)
    # Something differs: every rank saw the same gathered table, so all take this path.
    nmax = int(gathered[:, 0].max())
    mine = torch.full((nmax,), 0, dtype=torch.int64)
    for i, d in enumerate(descs):
        mine[i] = _hash64(d) or 1  # 0 marks "no parameter here"
    table = api.allgather(mine, group=group)  # (world, nmax)
    diff = (table != table[0]).any(dim=0).nonzero()
    first = int(diff[0]) if diff.numel() else min(int(n) for n in gathered[:, 0])
    # Gather a fixed-size encoding of parameter `first` from every rank, for the message.
    enc = torch.zeros(12, dtype=torch.int64)
    if first < len(params):
        p = params[first]
        enc[0] = 1
        enc[1] = p.dim()
        enc[2] = _DTYPES.index(p.dtype) if p.dtype in _DTYPES else -1
        enc[3] = int(p.requires_grad or first >= nparams)
        for k, s in enumerate(list(p.shape)[:8]):
            enc[4 + k] = s
    encs = api.allgather(enc, group=group)
    per_rank = []
    any_buffers = bool((gathered[:, 0] != gathered[:, 1]).any())
    for r in range(world):
        e = encs[r].tolist()
        if not e[0]:
            n, np_ = int(gathered[r, 0]), int(gathered[r, 1])
            per_rank.append(f"rank {at[r]}: none (it has {np_} parameters" + (
                f" and {n - np_} buffers)" if any_buffers else ")"))
            continue
        shape = tuple(e[4:4 + min(e[1], 8)])
        dt = str(_DTYPES[e[2]]).replace("torch.", "") if e[2] >= 0 else "?"
        per_rank.append(f"rank {at[r]}: {shape} {dt}" + ("" if e[3] else " (requires_grad=False)"))
    name = f"'{names[first]}'" if first < len(names) else "absent"
    # Which ranks disagree with rank 0 at that entry (all do the same arithmetic).
    odd = [at[r] for r in range(world) if r and not bool((encs[r] == encs[0]).all())]
    who = f"; rank(s) {odd} differ from rank {at[0]}" if odd else ""
    # What entry `first` is, as the lowest rank that has one there sees it (the same words
    # on every rank, also when the ranks' parameter counts differ).
    owner = next((r for r in range(world) if int(gathered[r, 0]) > first), 0)
    np0 = int(gathered[owner, 1])
    kind, idx = ("buffer", first - np0) if first >= np0 else ("parameter", first)
    raise ValueError(
        f"DistributedDataParallel: the model differs across ranks at {kind} {idx} "
        f"({name} on rank {at[rank]}{who}): "
        + "; ".join(per_rank) +
        ". Every rank must construct the same model (same layers, shapes, dtypes and "
        "requires_grad) before wrapping it.")


def _check_options(table: torch.Tensor, options: Sequence[tuple], at: list) -> None:
    """ValueError naming the first option whose value differs between ranks (table: one
    row per rank); every rank reads the same table, so every rank raises."""
    for j, (name, _) in enumerate(options):
        col = table[:, j].tolist()
        if len(set(col)) > 1:
            show = (lambda v: f"{v / 2 ** 20:g}") if name == "bucket_cap_mb" else bool
            raise ValueError(
                f"DistributedDataParallel: the ranks were given different {name}: "
                + "; ".join(f"rank {at[r]}: {show(v)}" for r, v in enumerate(col))
                + ". It decides which collectives run: every rank must wrap the model with "
                "the same arguments.")


def world_ranks(group: Any, size: int) -> list:
    """World rank of each rank of `group` (None: the world), for messages."""
    ranks = getattr(group, "ranks", None)
    return list(ranks) if ranks is not None and len(ranks) == size else list(range(size))


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
           torch.complex128]


def _world_rank(group: Any, r: int) -> int:
    return r if group is None else group.ranks[r]


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int = 0, rank: int = 0,
                      chunk_bytes: int = BROADCAST_CHUNK_BYTES, group: Any = None) -> None:
    """Overwrite every tensor with rank `src`'s values, moving raw bytes in a few
    collectives (broadcast never reduces, so dtypes may share one byte buffer). `src` and
    `rank` are ranks in `group` (None: the world)."""
    tensors = [t for t in tensors if t.numel() > 0]
    i = 0
    while i < len(tensors):
        chunk, size = [], 0
        while i < len(tensors) and (not chunk or size + _nbytes(tensors[i]) + 16 <= chunk_bytes):
            chunk.append(tensors[i])
            size += _nbytes(tensors[i]) + 16
            i += 1
        offs, total = _layout(chunk)
        flat = torch.empty(total, dtype=torch.uint8)
        if rank == src:
            _pack(flat, chunk, offs)
        api.broadcast(flat, src=_world_rank(group, src), group=group)
        if rank != src:
            _unpack(flat, chunk, offs)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offsets of each tensor in a packed buffer (16-byte aligned, so that a slice can
    be viewed as the tensor's dtype) and the total size."""
    offs, off = [], 0
    for t in tensors:
        off = (off + 15) // 16 * 16
        offs.append(off)
        off += _nbytes(t)
    return offs, off


def _pack(flat: torch.Tensor, tensors: Sequence[torch.Tensor], offs: Sequence[int]) -> None:
    for t, off in zip(tensors, offs):
        flat[off:off + _nbytes(t)].copy_(_byte_view(t))


def _unpack(flat: torch.Tensor, tensors: Sequence[torch.Tensor], offs: Sequence[int]) -> None:
    with torch.no_grad():
        for t, off in zip(tensors, offs):
            t.copy_(flat[off:off + _nbytes(t)].view(t.dtype).view(t.shape))


class BufferSync:
    """Per-forward broadcast of module buffers from rank `src` (0; inside join() the
    highest rank still training) when broadcast_buffers=True: one
    byte-packed collective for all buffers, with a reusable staging buffer."""

    def __init__(self, rank: int, group: Any = None) -> None:
        self.rank = rank
        self.group = group
        self._flat = torch.empty(0, dtype=torch.uint8)

    def __call__(self, buffers: Sequence[torch.Tensor], src: int = 0) -> None:
        buffers = [b for b in buffers if b.numel() > 0]
        if not buffers:
            return
        offs, size = _layout(buffers)
        if self._flat.numel() != size:
            # Not an inference tensor even when the first sync runs in inference_mode() (a
            # sanity-check validation): the later syncs outside it write into it.
            with torch.inference_mode(False):
                self._flat = torch.empty(size, dtype=torch.uint8)
        if self.rank == src:
            _pack(self._flat, buffers, offs)
        api.broadcast(self._flat, src=_world_rank(self.group, src), group=self.group)
        if self.rank != src:
            # Copied in without bumping the buffers' version counters, as torch's buffer sync:
            # a forward before the previous one's backward (two views of a batch through a
            # BatchNorm) must not make that backward fail with "modified by an inplace
            # operation".
            with torch.autograd._unsafe_preserve_version_counter(tuple(buffers)):
                _unpack(self._flat, buffers, offs)
