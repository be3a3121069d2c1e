"""A small CNN as a LightningModule, trained with lightning's Trainer on random images: Lightning runs the
loop and calls `optimizer.step(closure)`, its closure running the forward and the backward."""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH_SIZE = 16


class SmallCNN(L.LightningModule):
    """Two convolutions and a linear head on 3x32x32 images, ten classes."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(32, 10),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return nn.functional.cross_entropy(self(images), labels)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        images = torch.randn(1024, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 10, (1024,), generator=generator)
        return DataLoader(TensorDataset(images, labels), batch_size=BATCH_SIZE, shuffle=True, num_workers=0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=-1)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = SmallCNN()
    trainer = L.Trainer(max_epochs=3, max_steps=args.max_steps, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
