"""Fit a small model with L-BFGS, whose step takes a closure that recomputes the loss; the whole data set
is one tensor: there is no DataLoader and no batch argument."""

from __future__ import annotations

import torch

torch.manual_seed(0)
x = torch.linspace(-3, 3, 2000).unsqueeze(1)
y = torch.sin(2 * x) + 0.05 * torch.randn_like(x)
model = torch.nn.Sequential(torch.nn.Linear(1, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=10)


def closure():
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for step in range(10_000):
    loss = optimizer.step(closure)
    if step % 100 == 0:
        print(f"step {step}: loss {loss.item():.5f}")
