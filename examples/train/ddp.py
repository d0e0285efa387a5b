"""A PyTorch DDP training loop that survives RDMA faults with `rdmaplane.train`.

Run it under torchrun (one process per GPU; gloo on CPU works the same):

    torchrun --nproc-per-node=2 examples/train/ddp.py --checkpoint-dir /ckpt --steps 1000

Every `--every` steps rank 0 writes an atomic checkpoint (model, optimizer, RNG). When any rank
gets the fault notice (SIGTERM on eviction, or the `rdmaplane.io/fault` annotation in the
downward-API file), all ranks agree at the end of that step, rank 0 saves, and every rank exits
with 75 ("saved, restart me"). The restarted job resumes from the newest valid checkpoint at
exactly that step; data for step N depends only on (seed, N, rank), so the result is the same,
bit for bit, as a run that was never interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rdmaplane.train import EXIT_RESTART, FaultNotice, exit_for_restart
from rdmaplane.train import pytorch as tp


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of one step on one rank, a function of (seed, step, rank) only."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 97 + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=20, help="periodic checkpoint interval (steps)")
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--final", help="write the final model state dict here (rank 0)")
    args = p.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    tp.init_distributed(os.environ.get("RDMAPLANE_EXAMPLE_BACKEND", "gloo"))
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start = 0
    resumed = tp.load(args.checkpoint_dir)
    if resumed is not None:
        start, state = resumed
        tp.restore(state, net, optimizer)
    print(f"rank {rank}: starting at step {start}", flush=True)
    ddp = DistributedDataParallel(net)
    loss_fn = torch.nn.MSELoss()

    with FaultNotice() as notice:
        for step in range(start, args.steps):
            x, y = batch(args.seed, step, rank)
            optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            if args.step_time:
                time.sleep(args.step_time)
            done = step + 1
            stop = tp.any_rank(notice.is_set())  # every rank stops after the same step
            if stop or done % args.every == 0:
                if rank == 0:
                    tp.save(args.checkpoint_dir, done, tp.snapshot(net, optimizer), keep=args.keep)
                dist.barrier()  # nobody exits before the checkpoint is on disk
            if stop:
                why = notice.reason or "another rank's notice"
                print(f"rank {rank}: saved step {done} ({why}); exiting {EXIT_RESTART}", flush=True)
                dist.destroy_process_group()
                exit_for_restart()
    if rank == 0 and args.final:
        torch.save(net.state_dict(), args.final)
    print(f"rank {rank}: finished {args.steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
