"""Train the tiny GPT to continue sorted digit strings: the loop is `Trainer.run` in the imported package."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from minigpt.model import GPT
from minigpt.trainer import Trainer, TrainerConfig


class SortDataset(Dataset):
    """Random digit strings followed by the same digits sorted; the model learns to sort."""

    def __init__(self, length: int = 8, size: int = 4096):
        self.length, self.size = length, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(index)
        digits = torch.randint(0, 10, (self.length,), generator=generator)
        sequence = torch.cat([digits, digits.sort().values])
        return sequence[:-1], sequence[1:]


if __name__ == "__main__":
    torch.manual_seed(0)
    dataset = SortDataset()
    model = GPT(vocab_size=10, block_size=15)
    config = TrainerConfig()
    config.learning_rate = 5e-4
    Trainer(config, model, dataset).run()
