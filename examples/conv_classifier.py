"""A small convolutional classifier on images held in memory: compute-bound on the CPU.

Three conv blocks with BatchNorm over 64×64 RGB images (random tensors with a class-dependent pattern,
made in memory on start), batch 32, SGD with momentum. Nothing waits on data, so what pays here is what
makes convolutions faster: bf16 autocast where the CPU computes bf16, channels_last, torch.compile.

    python examples/conv_classifier.py                        # train standalone
    advisor profile examples/conv_classifier.py:train_step    # profile its training step
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

CLASSES = 10
IMAGE_SIZE = 64


def make_dataset(count: int = 1024, seed: int = 0) -> TensorDataset:
    """Noisy images whose mean colour per channel depends on the class (learnable, the same every run)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (count,), generator=generator)
    shade = torch.linspace(-1, 1, CLASSES)[labels].view(-1, 1, 1, 1) * torch.tensor([1.0, -0.5, 0.25]).view(1, 3, 1, 1)
    images = torch.randn(count, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator) + shade
    return TensorDataset(images, labels)


def block(channels_in: int, channels_out: int) -> nn.Sequential:
    """Convolution, BatchNorm, ReLU, and a 2×2 max pool."""
    return nn.Sequential(nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
                         nn.BatchNorm2d(channels_out), nn.ReLU(inplace=True), nn.MaxPool2d(2))


class ConvNet(nn.Module):
    """Three conv blocks and a linear head."""

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128))
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One optimization step on one batch; returns the loss."""
    images, labels = images.to(device), labels.to(device)
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)  # advisor stops it once its steps are measured
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = ConvNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = 0
    for epoch in range(args.epochs):
        for step, (images, labels) in enumerate(loader):
            loss = train_step(model, optimizer, images, labels, device)
            steps += 1
            if step % 8 == 0 or steps == args.max_steps:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
            if steps == args.max_steps:
                return


if __name__ == "__main__":
    main()
