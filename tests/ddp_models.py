"""Models, data and comparison helpers shared by the DDP test workers (ddp_workers.py) and
the torch backend's (backend_workers.py): inputs are a pure function of the seed, so every
rank can compute the single-process reference itself."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import ringreduce as rr

B = 4  # per-rank batch


class MLP(nn.Module):
    def __init__(self, with_f64: bool = False, hidden: int = 16) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.l3 = nn.Linear(hidden, 4)
        # A float64 parameter: buckets never mix dtypes.
        self.scale = nn.Parameter(torch.ones(4, dtype=torch.float64)) if with_f64 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))
        return y * self.scale.float() if self.scale is not None else y


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.flatten(1))


class Branchy(nn.Module):
    """`c` is used only when asked (rank/step dependent); `never` is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.c = nn.Linear(16, 4)
        self.never = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        h = torch.tanh(self.a(x))
        out = self.b(h)
        return out + self.c(h) if use_c else out


class TwoPaths(nn.Module):
    """y = p(x) + q(x); which path is computed first decides the gradient-ready order."""

    def __init__(self) -> None:
        super().__init__()
        self.p1, self.p2 = nn.Linear(8, 8), nn.Linear(8, 4)
        self.q1, self.q2 = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, q_first: bool = False) -> torch.Tensor:
        if q_first:
            q = self.q2(torch.tanh(self.q1(x)))
            p = self.p2(torch.tanh(self.p1(x)))
        else:
            p = self.p2(torch.tanh(self.p1(x)))
            q = self.q2(torch.tanh(self.q1(x)))
        return p + q


class CheckpointedHead(nn.Module):
    """o(checkpoint(tanh(a(x)))) with torch.utils.checkpoint(use_reentrant=True) around the
    last layer: its gradients arrive inside a nested backward, a's after it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.o = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.o, torch.tanh(self.a(x)), use_reentrant=True)


class Recheckpointed(nn.Module):
    """m under two reentrant checkpoints in one forward: its hooks fire twice per backward
    (static_graph counts them, as torch's). Alone (sliced to 4 outputs: every gradient comes
    in nested backwards, the first of which ends with every parameter seen), or `around`:
    a before it, a checkpointed o after it."""

    def __init__(self, around: bool = False) -> None:
        super().__init__()
        self.m = nn.Linear(8, 8)
        self.a = nn.Linear(8, 8) if around else None
        self.o = nn.Linear(8, 4) if around else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = torch.tanh(self.a(x)) if self.a is not None else x
        for _ in range(2):
            h = checkpoint(self.m, h, use_reentrant=True)
        return checkpoint(self.o, h, use_reentrant=True) if self.o is not None else h[:, :4]


def batch(step: int, world: int, shape: tuple = (8,), seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn((world * B,) + shape, generator=g), torch.randn(world * B, 4, generator=g)


def shard(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * B:(rank + 1) * B]


def maxdiff(a: nn.Module, b: nn.Module) -> float:
    return max(float((x.detach().double() - y.detach().double()).abs().max())
               for x, y in zip(a.parameters(), b.parameters()))


def bufdiff(a: nn.Module, b: nn.Module) -> float:
    return max([float((x.double() - y.double()).abs().max())
                for x, y in zip(a.buffers(), b.buffers())] or [0.0])


def make(model_fn: Callable[[], nn.Module], seed: int = 0) -> tuple:
    """A model (different init per rank, to check the broadcast from rank 0) and the
    reference: rank 0's initial weights."""
    torch.manual_seed(seed)
    ref = model_fn()
    torch.manual_seed(seed + 17 * rr.get_rank())
    model = model_fn()
    return model, ref


def sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
