"""A plain accelerate loop: the script builds its DataLoader, model and optimizer, and `accelerator.prepare`
rebuilds the loader (a DataLoaderShard with a batch_sampler) before the loop iterates it."""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

BATCH_SIZE = 16

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=10_000)
args = parser.parse_args()

torch.manual_seed(0)
accelerator = Accelerator()
data = TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
loader = DataLoader(data, batch_size=BATCH_SIZE, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

step = 0
while step < args.max_steps:
    for inputs, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step == args.max_steps:
            break
