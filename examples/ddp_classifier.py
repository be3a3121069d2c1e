"""Data-parallel training of a small MLP classifier: DistributedDataParallel, one process per rank, launched
with torchrun; the gloo backend, so it runs on the CPU (NCCL on GPUs when there are some).

Each rank reads its own shard of a generated data set (DistributedSampler); DDP averages the gradients
across ranks in every backward. `--slow-rank R` makes rank R's Dataset sleep in `__getitem__`: a
straggler bound by its input pipeline, which every other rank then waits for in the all-reduce.

    torchrun --nproc-per-node 2 examples/ddp_classifier.py
    advisor profile --nproc-per-node 2 examples/ddp_classifier.py:train_step
    advisor profile --nproc-per-node 2 examples/ddp_classifier.py -- --slow-rank 1
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Points(Dataset):
    """Points around four centres; the label is the centre. `delay` seconds per item (a slow loader)."""

    def __init__(self, size: int = 8192, features: int = 32, delay: float = 0.0):
        generator = torch.Generator().manual_seed(0)
        self.centres = torch.randn(4, features, generator=generator) * 3
        self.labels = torch.randint(0, 4, (size,), generator=generator)
        self.points = self.centres[self.labels] + torch.randn(size, features, generator=generator)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        if self.delay:
            time.sleep(self.delay)
        return self.points[index], self.labels[index]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    """One optimization step on this rank's batch; returns the loss."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # DDP's hooks all-reduce the gradients across ranks here
    optimizer.step()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank's loader sleeps (a straggler)")
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else \
        torch.device("cpu")
    torch.manual_seed(0)
    dataset = Points(delay=0.002 if rank == args.slow_rank else 0.0)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 4)).to(device)
    model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            loss = train_step(model, optimizer, x.to(device), y.to(device))
            if rank == 0 and step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
