r"""Training jobs for tests/test_frameworks.py: the same tiny model trained by an unchanged
framework, once on "gloo" and once on "ringreduce".

    python tests/framework_workers.py MODE BACKEND OUTDIR

MODE is one of

* ``lightning_trainer``: ``Trainer(accelerator="cpu", devices=2,
  strategy=DDPStrategy(process_group_backend=BACKEND))`` with Lightning's default launcher
  (it re-runs this script for local rank 1, so run it as a plain script, ``devices=2``);
* ``lightning_spawn``: the same with ``DDPStrategy(start_method="spawn", ...)``;
* ``fabric``: ``Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(
  process_group_backend=BACKEND))`` and ``fabric.launch()`` (default launcher: re-runs this
  script too);
* ``accelerate``: HF Accelerate, run under ``torchrun --nproc_per_node 2`` or ``accelerate
  launch --multi_gpu --num_processes 2`` (see the recipe below).

Accelerate recipe (accelerate 1.15 on a CPU-only machine, checked by the tests). Accelerate
picks "gloo" for CPU by itself (``PartialState._prepare_backend``), and
``Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="ringreduce")])`` is refused
(``ValueError: Your assigned backend ringreduce is not available, please use gloo``), but it
calls ``init_process_group`` only ``if not torch.distributed.is_initialized()``: create the
default group yourself, before the first ``Accelerator``/``PartialState``::

    # launch 2 processes with either (both set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*):
    #   torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port PORT train.py
    #   accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
    #       --main_process_ip 127.0.0.1 --main_process_port PORT \
    #       --mixed_precision no --dynamo_backend no train.py
    import torch.distributed as dist
    from accelerate import Accelerator
    dist.init_process_group("ringreduce")         # env:// from the launcher's variables
    accelerator = Accelerator(cpu=True)
    assert dist.get_backend() == "ringreduce"     # accelerator.state.backend still says "gloo"

Pitfalls: without ``cpu=True`` (or ``ACCELERATE_USE_CPU=1``) on a machine with no GPU,
Accelerate reports ``DistributedType.NO`` and ``num_processes == 1`` and neither wraps the
model in DDP nor shards the data (each rank trains alone). ``accelerate launch --cpu
--num_processes 2`` starts ONE process without RANK (multi-CPU there means mpirun), so
``init_process_group`` fails with "environment variable RANK expected"; ``--multi_gpu`` is
what makes it start torchrun-style workers (it works on CPU), and ``--cpu`` cannot be
combined with it, hence ``cpu=True`` in the script. ``accelerator.state.backend`` keeps the
string Accelerate chose ("gloo"); DDP from ``prepare()`` and ``accelerator.reduce/gather``
use the default group, i.e. ringreduce: ``torch.distributed.get_backend()`` is what tells.

Each training rank writes ``OUTDIR/rank{R}.json``: backend really used
(``torch.distributed.get_backend()``), rank, world size, initial and final parameters (flat
lists), and the number of optimizer steps. The model is ``Linear(8, 4)`` seeded the same on
every rank, the data 64 fixed samples, batch 8, SGD lr 0.1; each framework shards the data
by rank with its own distributed sampler (shuffle off), which does not depend on the backend.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

N_SAMPLES, BATCH, LR, SEED = 64, 8, 0.1, 1234
WORLD = 2


@atexit.register
def _destroy_gloo_at_exit() -> None:
    """The gloo reference runs destroy their process group before Python finalizes.
    Without it (Lightning's spawn children and Accelerate never call it), a gloo worker
    thread may release a finished work's tensors while the interpreter finalizes and die in
    std::terminate taking the GIL ("terminate called without an active exception"; torch's
    bug, pytorch/pytorch#190489): measured here in 10 of 30 gloo-only Lightning-spawn jobs
    with ringreduce not even imported (gdb: ProcessGroupGloo::runLoop -> ~AsyncWork ->
    decref_pyobject -> take_gil -> pthread_exit). The ringreduce runs are left as users
    leave them: their exit is part of what is tested."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


def make_dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, 8, generator=g)
    w = torch.randn(8, 4, generator=g)
    y = x @ w + 0.1 * torch.randn(N_SAMPLES, 4, generator=g)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Linear(8, 4)


def flat_params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()]).tolist()


def ddp_backend(wrapper: nn.Module) -> str | None:
    """Backend of the process group that the framework's DistributedDataParallel uses."""
    from torch.nn.parallel import DistributedDataParallel

    for m in wrapper.modules():
        if isinstance(m, DistributedDataParallel):
            return dist.get_backend(m.process_group)
    return None


def write_result(outdir: str, model: nn.Module, init: list[float], steps: int,
                 wrapper: nn.Module, **extra) -> None:
    """Rank's JSON result; `model` is the bare Linear, `wrapper` what the framework made."""
    rank = dist.get_rank()
    res = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "ddp_backend": ddp_backend(wrapper),
        "init": init,
        "final": flat_params(model),
        "steps": steps,
        "pid": os.getpid(),
        **extra,
    }
    tmp = Path(outdir) / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(res))
    tmp.rename(Path(outdir) / f"rank{rank}.json")


# ------------------------------------------------------------------ Lightning Trainer
def _lightning_module_cls():
    import lightning.pytorch as pl

    class TinyModule(pl.LightningModule):
        def __init__(self, outdir: str) -> None:
            super().__init__()
            self.outdir = outdir
            self.net = make_model()
            self.init = flat_params(self.net)
            self.steps = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.steps += 1
            loss = nn.functional.mse_loss(self.net(x), y)
            # The most common Lightning logging call: its epoch mean all-reduces an int64
            # batch-size counter with ReduceOp.AVG (SUM + division only on "gloo").
            self.log("loss", loss, sync_dist=True, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

        def train_dataloader(self):
            return DataLoader(make_dataset(), batch_size=BATCH, shuffle=False)

        def on_train_end(self) -> None:
            write_result(self.outdir, self.net, self.init, self.steps,
                         wrapper=self.trainer.strategy.model,
                         strategy=type(self.trainer.strategy).__name__,
                         logged=float(self.trainer.callback_metrics["loss"]),
                         launcher=type(self.trainer.strategy.launcher).__name__)

    # picklable as framework_workers.TinyModule (ddp_spawn pickles the trainer and module)
    TinyModule.__module__, TinyModule.__qualname__ = __name__, "TinyModule"
    return TinyModule


def __getattr__(name: str):
    """Module attribute ``TinyModule``, built on first use so that the other modes need not
    import Lightning (slow); pickle finds the class through here in a spawned child."""
    if name == "TinyModule":
        globals()[name] = cls = _lightning_module_cls()
        return cls
    raise AttributeError(name)


def lightning_trainer(backend: str, outdir: str, start_method: str = "popen") -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    pl.seed_everything(SEED, verbose=False)
    module = sys.modules[__name__].TinyModule(outdir)
    trainer = pl.Trainer(
        accelerator="cpu", devices=WORLD, num_nodes=1, max_epochs=2,
        strategy=DDPStrategy(start_method=start_method, process_group_backend=backend),
        enable_checkpointing=False, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, deterministic=True,
    )
    trainer.fit(module)


# ------------------------------------------------------------------ Lightning Fabric
def fabric(backend: str, outdir: str) -> None:
    from lightning.fabric import Fabric
    from lightning.fabric.strategies import DDPStrategy

    fab = Fabric(accelerator="cpu", devices=WORLD, num_nodes=1,
                 strategy=DDPStrategy(process_group_backend=backend))
    fab.launch()
    fab.seed_everything(SEED, verbose=False)
    model = make_model()
    init = flat_params(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt = fab.setup(model, opt)
    loader = fab.setup_dataloaders(DataLoader(make_dataset(), batch_size=BATCH, shuffle=False))
    steps = train_two_epochs(model, opt, loader, fab.backward)
    write_result(outdir, model.module, init, steps, wrapper=model,
                 launcher=type(fab.strategy.launcher).__name__)
    fab.barrier()


def train_two_epochs(model, opt, loader, backward) -> int:
    """The plain loop Fabric and Accelerate users write (their own backward()); steps run."""
    steps = 0
    for _ in range(2):
        for x, y in loader:
            opt.zero_grad()
            backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            steps += 1
    return steps


# ------------------------------------------------------------------ HF Accelerate
def accelerate_job(backend: str, outdir: str) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    if backend != "gloo":  # gloo: let Accelerate create its own group, as it does by default
        dist.init_process_group(backend)
    accelerator = Accelerator(cpu=True)
    assert accelerator.distributed_type == DistributedType.MULTI_CPU, accelerator.distributed_type
    assert accelerator.num_processes == WORLD, accelerator.num_processes
    torch.manual_seed(SEED)
    model = make_model()
    init = flat_params(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(make_dataset(), batch_size=BATCH, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    steps = train_two_epochs(model, opt, loader, accelerator.backward)
    # a collective through Accelerate itself, on whatever group it uses
    total = accelerator.reduce(torch.tensor([float(steps)]), reduction="sum")
    assert int(total.item()) == WORLD * steps, total
    write_result(outdir, accelerator.unwrap_model(model), init, steps, wrapper=model,
                 accelerate_backend=accelerator.state.backend,
                 distributed_type=str(accelerator.distributed_type))
    accelerator.wait_for_everyone()
    accelerator.end_training()


def main(argv: list[str]) -> None:
    mode, backend, outdir = argv
    if mode == "lightning_trainer":
        lightning_trainer(backend, outdir)
    elif mode == "lightning_spawn":
        lightning_trainer(backend, outdir, start_method="spawn")
    elif mode == "fabric":
        fabric(backend, outdir)
    elif mode == "accelerate":
        accelerate_job(backend, outdir)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
