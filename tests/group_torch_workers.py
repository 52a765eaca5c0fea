"""Rank-side code of tests/test_groups.py: torch.distributed subgroups on the ringreduce
backend (new_group, re-init) and ringreduce DDP on a split, checked against known sums."""

from __future__ import annotations

import ringreduce as rr


def torch_reinit_subgroups(rank: int, world: int) -> list:
    """init, a subgroup, destroy_process_group(), init again, a subgroup of other ranks and
    size: torch restarts its group names, so the second group has the first one's name and
    PrefixStore (stale keys there once read as a duplicate rank or a wrong world size)."""
    import torch
    import torch.distributed as dist

    fails: list = []
    for cycle, members in enumerate(([0, 1], list(range(world)), [1, world - 1])):
        dist.init_process_group("ringreduce", rank=rank, world_size=world)
        pg = dist.new_group(members)
        if rank in members:
            t = torch.full((5,), float(rank + cycle))
            dist.all_reduce(t, group=pg)
            want = float(sum(members) + cycle * len(members))
            if t.tolist() != [want] * 5:
                fails.append(f"cycle {cycle}, group {members} ({pg.group_name}): {t.tolist()}, "
                             f"want {want}")
        dist.destroy_process_group()
    return fails


def torch_subgroups(rank: int, world: int) -> list:
    """Stock torch code on the ringreduce backend: dist.new_group subgroups (overlapping,
    odd sizes), each checked with the collectives torch routes to them."""
    import torch
    import torch.distributed as dist

    fails: list = []
    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    shapes = [[0, world - 1], list(range(1, world)), [world - 1]]
    for members in shapes:
        pg = dist.new_group(members)
        if rank not in members:
            continue
        t = torch.arange(5, dtype=torch.float64) + 10 * rank
        dist.all_reduce(t, group=pg)
        want = sum(torch.arange(5, dtype=torch.float64) + 10 * r for r in members)
        if not torch.equal(t, want):
            fails.append(f"{members}: all_reduce {t} != {want}")
        src = members[-1]
        b = torch.full((3,), float(rank))
        dist.broadcast(b, src=src, group=pg)
        if not torch.equal(b, torch.full((3,), float(src))):
            fails.append(f"{members}: broadcast from {src}: {b}")
        out = torch.empty(len(members) * 2, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.tensor([rank, -rank]), group=pg)
        if out.tolist() != [v for r in members for v in (r, -r)]:
            fails.append(f"{members}: all_gather_into_tensor {out.tolist()}")
        dist.barrier(group=pg)
        if dist.get_world_size(pg) != len(members) or dist.get_rank(pg) != members.index(rank):
            fails.append(f"{members}: rank/size {dist.get_rank(pg)}/{dist.get_world_size(pg)}")
    t = torch.full((4,), rank + 1.0)
    dist.all_reduce(t)
    if not torch.equal(t, torch.full((4,), world * (world + 1) / 2)):
        fails.append(f"world all_reduce after subgroups: {t}")
    dist.destroy_process_group()
    return fails


def ddp_on_groups(rank: int, world: int) -> list:
    """Two DDP replicas side by side: ranks [0, 1] and [2, 3] each wrap the same model with
    process_group=their group and train on rank-dependent data; after 3 SGD steps every
    member holds the parameters a single process computes from its group's data."""
    import torch

    fails: list = []
    halves = rr.world_group().split(rank // 2, key=rank)
    members = halves.ranks

    def data(r: int, step: int) -> tuple:
        gen = torch.Generator().manual_seed(1000 * r + step)
        return torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)

    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))

    model = rr.DistributedDataParallel(make(), process_group=halves)
    ref = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        x, y = data(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ropt.zero_grad()  # the reference: the mean of the members' gradients
        for r in members:
            xr, yr = data(r, step)
            (torch.nn.functional.mse_loss(ref(xr), yr) / len(members)).backward()
        ropt.step()
    for (n, p), q in zip(model.module.named_parameters(), ref.parameters()):
        if not torch.allclose(p, q, atol=1e-6):
            fails.append(f"{n}: {p.flatten()[:3]} != reference {q.flatten()[:3]}")
    # World rank 3 builds a different model: its group's error names world ranks (it named
    # group ranks: "rank(s) [1] differ from rank 0", blaming healthy world rank 1).
    torch.manual_seed(0)
    odd = torch.nn.Sequential(torch.nn.Linear(4, 5 if rank == 3 else 3))
    try:
        rr.DistributedDataParallel(odd, process_group=halves)
        if rank >= 2:
            fails.append("no error for world rank 3's different model")
    except ValueError as e:
        if rank < 2 or "rank(s) [3] differ from rank 2" not in str(e):
            fails.append(f"mismatch error: {e}")
    return fails
