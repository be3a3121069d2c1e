"""The trainer: its configuration holds the batch size; `run` is the whole training loop."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, RandomSampler


@dataclass
class TrainerConfig:
    batch_size: int = 16
    num_workers: int = 0
    learning_rate: float = 3e-4
    max_iters: int = 100_000
    grad_norm_clip: float = 1.0


class Trainer:
    def __init__(self, config: TrainerConfig, model: torch.nn.Module, train_dataset):
        self.config = config
        self.model = model
        self.train_dataset = train_dataset
        self.iter_num = 0

    def run(self) -> None:
        model, config = self.model, self.config
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
        train_loader = DataLoader(
            self.train_dataset,
            sampler=RandomSampler(self.train_dataset, replacement=True, num_samples=10**9),
            shuffle=False,
            batch_size=config.batch_size,
            num_workers=config.num_workers,
        )
        model.train()
        data_iter = iter(train_loader)
        while True:
            x, y = next(data_iter)
            _, loss = model(x, y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
            optimizer.step()
            self.iter_num += 1
            if self.iter_num >= config.max_iters:
                break
