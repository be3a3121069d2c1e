"""Train a small CNN on generated images with a training and an evaluation DataLoader; batch sizes come
from command-line flags, and the loop is inline in `main`."""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Blobs(Dataset):
    """Images with a bright blob in one of four quadrants; the label is the quadrant."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(self.seed * 100_003 + index)
        label = index % 4
        image = 0.3 * torch.randn(1, 32, 32, generator=generator)
        row, col = divmod(label, 2)
        image[:, row * 16 + 4 : row * 16 + 12, col * 16 + 4 : col * 16 + 12] += 1.0
        return image, label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--eval_batch_size", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    train_loader = DataLoader(Blobs(2048, 0), batch_size=args.batch_size, shuffle=True)
    eval_loader = DataLoader(Blobs(400, 1), batch_size=args.eval_batch_size)

    for epoch in range(args.epochs):
        model.train()
        for images, labels in train_loader:
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in eval_loader)
        print(f"epoch {epoch}: loss {loss.item():.3f} accuracy {correct / 400:.3f}")


if __name__ == "__main__":
    main()
