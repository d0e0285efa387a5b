"""A PyTorch training loop that survives RDMA faults with `rdmaplane.train`, bit for bit.

Run it under torchrun (one process per GPU; gloo on CPU works the same):

    torchrun --nproc-per-node=2 examples/train/ddp.py --checkpoint-dir /ckpt --steps 1000

`fit` is the loop of docs/faults.md, verbatim (a test holds them equal): DDP, or FSDP with
`--sharded`; dropout and augmentation seeded per rank (Python's `random`, numpy, torch); AdamW,
a cosine schedule, label smoothing, gradient clipping, a DistributedSampler with `set_epoch`.
Every `--every` steps a checkpoint is written (in the background with `--async-save`). When any
rank gets the fault notice (SIGTERM on eviction, or the `rdmaplane.io/fault` annotation in the
downward-API file), all ranks save after the same step and exit 75 ("saved, restart me"); the
restarted job resumes at exactly that step, each rank with its own random state, and ends with
the weights of a run that was never interrupted.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from rdmaplane import train
from rdmaplane.train import pytorch as tp

BATCH = 16


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A synthetic 4-class problem; each sample is scaled with Python's `random` and noised
    with numpy's global RNG, as augmentation pipelines do."""

    def __init__(self, seed: int, n: int = 1024) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long() + 2 * (self.x[:, 4:8].sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, 16).astype(np.float32))
        return self.x[i] * random.uniform(0.9, 1.1) + noise, self.y[i]


def mlp(step_time: float) -> torch.nn.Module:
    """An MLP with LayerNorm and dropout; `step_time` extra seconds per forward pass pace the
    run for the tests (0 otherwise)."""
    layers: list[torch.nn.Module] = []
    for width_in in (16, 64):
        layers += [torch.nn.Linear(width_in, 64), torch.nn.LayerNorm(64), torch.nn.GELU()]
        layers.append(torch.nn.Dropout(0.1))
    net = torch.nn.Sequential(*layers, torch.nn.Linear(64, 4))
    if step_time:
        net.register_forward_pre_hook(lambda *_: time.sleep(step_time))
    return net


def fit(
    args: argparse.Namespace, rank: int, model: Callable[[], torch.nn.Module]
) -> torch.nn.Module:
    torch.manual_seed(args.seed + rank)  # per rank: dropout and augmentation differ by rank
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    net = model()  # on this rank's device
    device = next(net.parameters()).device
    forward = fully_shard(net) if args.sharded else DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    layout = tp.ShardedCheckpoints if args.sharded else tp.Checkpoints
    ckpt = layout(
        args.checkpoint_dir,
        net,
        optimizer,
        scheduler=scheduler,  # anything with state_dict() and load_state_dict()
        every=args.every,
        async_save=args.async_save,
    )
    step = ckpt.resume()  # 0, or the newest valid checkpoint's step, this rank's RNGs restored
    print(f"rank {rank}: starting at step {step}", flush=True)
    data = Augmented(args.seed)
    sampler = DistributedSampler(data, seed=args.seed, drop_last=True)
    per_epoch = len(sampler) // BATCH
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    with ckpt, train.FaultNotice(answered=ckpt.answered) as notice:
        while step < args.steps:
            epoch, into = divmod(step, per_epoch)
            sampler.set_epoch(epoch)
            todo = list(sampler)[into * BATCH :]  # mid-epoch: skip what was trained, unread
            # its own generator: making the iterator draws from it, not from the global RNG
            batches = DataLoader(data, BATCH, sampler=todo, generator=torch.Generator())
            for x, y in batches:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss_fn(forward(x), y).backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                step += 1
                if ckpt.step_done(step, notice):  # saved after a notice any rank got
                    why = notice.reason or "another rank's notice"
                    print(f"rank {rank}: saved step {step} ({why}); exiting 75", flush=True)
                    train.exit_for_restart()
                if step == args.steps:
                    break
    return net


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=20, help="periodic checkpoint interval (steps)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--sharded", action="store_true", help="FSDP and sharded checkpoints")
    p.add_argument("--async-save", action="store_true", help="periodic saves in the background")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--final", help="write the final model state dict here (rank 0)")
    args = p.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    backend = os.environ.get("RDMAPLANE_EXAMPLE_BACKEND", "gloo")
    tp.init_distributed(backend)
    rank = dist.get_rank()
    device = torch.device("cpu")
    if backend == "nccl":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    net = fit(args, rank, lambda: mlp(args.step_time).to(device))
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))
    if rank == 0 and args.final:
        torch.save(full, args.final)
    print(f"rank {rank}: finished {args.steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
