"""Data-parallel training of a small CNN on synthetic images -- the quick-start demo.

    ringreduce-run -n 2 examples/train.py --steps 20          # our DDP wrapper
    torchrun --nproc_per_node 2 examples/train.py             # same, under torchrun
    ringreduce-run -n 2 examples/train.py --ddp torch         # torch's DDP on our backend
    python examples/train.py                                  # one process, no communication

The data set is generated deterministically in this script (10 classes of 16x16 images: a
class-specific pattern plus noise), so every rank builds the same one and a
DistributedSampler gives each rank its own shard. Rank 0 writes a checkpoint (keys prefixed
with "module.", loadable by either wrapper) and the other ranks wait at a barrier until it is
on disk, as training scripts usually do.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60,
                   help="train until this many optimizer steps in total (default 60)")
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ddp", choices=["ringreduce", "torch"], default="ringreduce",
                   help="ringreduce: ringreduce.ddp.DistributedDataParallel; torch: "
                        "torch.nn.parallel.DistributedDataParallel over --backend")
    p.add_argument("--backend", default="ringreduce",
                   help="torch.distributed backend for --ddp torch (ringreduce or gloo)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(),
                                                        "ringreduce_train_ckpt.pt"))
    p.add_argument("--resume", action="store_true", help="start from --checkpoint")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (default: cores / local ranks)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


# ----------------------------------------------------------------------------- data, model


def make_dataset(n: int, seed: int) -> TensorDataset:
    """n 1x16x16 images in 10 classes: a fixed random pattern per class (the same for every
    seed), plus noise drawn from `seed`."""
    patterns = torch.randn(10, 1, 16, 16, generator=torch.Generator().manual_seed(2024))
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = patterns[labels] + 1.5 * torch.randn(n, 1, 16, 16, generator=g)
    return TensorDataset(images, labels)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


# ----------------------------------------------------------------------------- distributed


class Comm:
    """The few collectives the script itself needs, over whichever stack trains."""

    def __init__(self, kind: str, backend: str) -> None:
        import ringreduce as rr

        self.kind = kind
        if kind == "ringreduce":
            rr.init()
            self.rank, self.world = rr.get_rank(), rr.get_world_size()
            self._rr = rr
        else:
            import torch.distributed as dist

            import ringreduce.backend  # noqa: F401 - registers the "ringreduce" backend

            if "RANK" not in os.environ:  # plain `python train.py`: a world of one
                os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
            dist.init_process_group(backend)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self._dist = dist

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.kind == "ringreduce":
            from ringreduce.ddp import DistributedDataParallel
        else:
            from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model)

    def barrier(self) -> None:
        if self.kind == "ringreduce":
            self._rr.barrier()
        else:
            self._dist.barrier()

    def mean(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        if self.kind == "ringreduce":
            self._rr.allreduce(t, op="avg")
        else:
            self._dist.all_reduce(t)
            t /= self.world
        return float(t)

    def close(self) -> None:
        if self.kind == "ringreduce":
            self._rr.destroy()
        else:
            self._dist.destroy_process_group()


def main() -> None:
    args = parse_args()
    comm = Comm(args.ddp, args.backend)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", comm.world))
    if args.threads or local_world > 1:  # share the usable cores between the local ranks
        from ringreduce._cpus import usable_cpus  # affinity mask and cgroup quota, not cpu_count

        torch.set_num_threads(args.threads or max(1, usable_cpus() // local_world))
    is_main = comm.rank == 0

    torch.manual_seed(args.seed)  # rank 0's initial weights are broadcast anyway
    model = comm.wrap(SmallCNN())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    if args.resume and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        if is_main:
            print(f"resumed from {args.checkpoint} at step {start}", flush=True)

    train = make_dataset(8192, seed=1234)
    sampler = DistributedSampler(train, num_replicas=comm.world, rank=comm.rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if is_main:
        nparams = sum(p.numel() for p in model.parameters())
        print(f"training SmallCNN ({nparams / 1e3:.0f}k parameters) with {args.ddp} DDP on "
              f"{comm.world} rank(s), global batch {args.batch_size * comm.world}", flush=True)

    model.train()
    step = start
    epoch = start // max(1, len(loader))
    t0 = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                avg = comm.mean(loss.item())  # every rank calls it: it is a collective
                if is_main:
                    per_step = (time.perf_counter() - t0) / (step - start)
                    print(f"step {step:4d}  loss {avg:.4f}  ({per_step * 1e3:.1f} ms/step)",
                          flush=True)
            if step >= args.steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0

    # Held-out accuracy, each rank on its shard, averaged.
    model.eval()
    test = make_dataset(2048, seed=99)
    shard = DistributedSampler(test, num_replicas=comm.world, rank=comm.rank, shuffle=False)
    correct = total = 0
    with torch.no_grad():
        for x, y in DataLoader(test, batch_size=256, sampler=shard):
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    acc = comm.mean(correct / max(total, 1))

    if is_main:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                   args.checkpoint)
    comm.barrier()  # nobody moves on (or reads the file) before rank 0 wrote it
    if is_main:
        done = step - start
        print(f"done: {done} steps in {elapsed:.2f} s ({elapsed / max(done, 1) * 1e3:.1f} "
              f"ms/step), test accuracy {acc:.3f}, checkpoint {args.checkpoint}", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
