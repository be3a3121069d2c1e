"""Train a small regression MLP with a per-epoch `train(model, loader, optimizer)` function and an
evaluation after each epoch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

BATCH_SIZE = 32


def make_data(rows: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 64, generator=generator)
    y = x[:, :8].sum(dim=1, keepdim=True) + 0.1 * torch.randn(rows, 1, generator=generator)
    return TensorDataset(x, y)


def train(model: torch.nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> float:
    model.train()
    total = 0.0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    return sum(F.mse_loss(model(x), y).item() for x, y in loader) / len(loader)


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train_loader = DataLoader(make_data(4096, 0), batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(make_data(512, 1), batch_size=256)
    for epoch in range(100):
        loss = train(model, train_loader, optimizer)
        print(f"epoch {epoch}: train {loss:.4f} test {evaluate(model, test_loader):.4f}")


if __name__ == "__main__":
    main()
