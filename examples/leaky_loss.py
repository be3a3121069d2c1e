"""A small classifier whose training loop leaks memory: it keeps every step's loss with its graph.

The model trains with label smoothing and `train_step` returns the plain cross-entropy for the log.
That returned loss was never back-propagated, so its graph still holds what its backward would need
(the batch × classes log-probabilities). The loop sums it into `total_loss` as a tensor instead of a
number, and with it keeps every step's graph alive: memory grows by about 8 MB a step.

The fix is to keep numbers, not graphs: `total_loss += loss.item()` (or `loss.detach()`).

    python examples/leaky_loss.py                       # train standalone (watch the memory grow)
    advisor profile examples/leaky_loss.py:train_step   # the trial reports the growth per step
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

CLASSES = 8192


def make_data(samples: int = 8192, features: int = 64, seed: int = 0) -> TensorDataset:
    """Features and labels from a fixed random linear teacher."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    teacher = torch.randn(features, CLASSES, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One optimization step; returns the plain cross-entropy of the batch (still attached to its graph)."""
    logits = model(x)
    optimizer.zero_grad()
    F.cross_entropy(logits, y, label_smoothing=0.1).backward()
    optimizer.step()
    return F.cross_entropy(logits, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = DataLoader(make_data(), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        total_loss = 0.0
        for step, (x, y) in enumerate(loader):
            loss = train_step(model, optimizer, x, y)
            total_loss += loss  # the leak: a tensor with its graph, kept for the whole epoch
        print(f"epoch {epoch} mean loss {total_loss.item() / (step + 1):.3f}")


if __name__ == "__main__":
    main()
