#!/usr/bin/env python
"""Ray Train on the "ringreduce" backend, user code unchanged (issue #12).

    python examples/ray_train.py            # 2 workers on this machine, gloo then ringreduce

Ray's workers create the process group before any user code runs, in processes that never
`import ringreduce`: the backend comes from torch's `torch.backends` entry point (installed
with ringreduce). The only ringreduce-specific line is the backend name in TorchConfig.
Trains the same tiny model with fixed seeds under both backends and checks that the final
parameters are equal; exits non-zero otherwise. Needs `pip install "ray[train]"` (not part of
the test extras: Ray is a large install).
"""

from __future__ import annotations

import sys
import tempfile


def train_loop(config: dict) -> dict:
    import torch
    import torch.distributed as dist
    from ray.train.torch import prepare_model

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 4))  # DDP on Ray's process group
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(123)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 4, generator=g)
    for step in range(8):
        lo = (step * 8 * world + rank * 8) % 64
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[lo:lo + 8]), y[lo:lo + 8]).backward()
        opt.step()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    return {"backend": dist.get_backend(), "params": params, "rank": rank}


def run(backend: str, storage: str) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 0.5}),
        run_config=RunConfig(storage_path=storage, name=f"rr-{backend}"))
    result = trainer.fit()
    if result.error is not None or not result.return_value:
        raise SystemExit(f"Ray Train on {backend} failed: {result.error}")
    return result.return_value  # the rank-0 worker's


def main() -> int:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            res = {b: run(b, tmp) for b in ("gloo", "ringreduce")}
    finally:
        ray.shutdown()
    g, r = res["gloo"], res["ringreduce"]
    diff = max(abs(a - b) for pa, pb in zip(g["params"], r["params"]) for a, b in zip(pa, pb))
    print(f"gloo backend={g['backend']}, ringreduce backend={r['backend']}, "
          f"max |param difference| = {diff:.3g}")
    ok = r["backend"] == "ringreduce" and g["backend"] == "gloo" and diff <= 1e-6
    print("OK: Ray Train on ringreduce matches gloo" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
