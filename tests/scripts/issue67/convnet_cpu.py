"""Issue 67's convnet as a CPU script writes it, never moving its batch with `.to(...)`: its Dataset converts with `np.float32(self.raw[i]) / 255.0`, normalizes by module-level
numpy arrays and returns `torch.from_numpy(img.transpose(2, 0, 1).copy())` (refused before the run-time fit)."""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class Images(Dataset):
    def __init__(self, count):
        rng = np.random.default_rng(0)
        self.raw = rng.integers(0, 256, (count, 16, 16, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 4, count)

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        label = int(self.labels[i])
        img = np.float32(self.raw[i]) / 255.0
        img = (img - MEAN) / STD
        return torch.from_numpy(img.transpose(2, 0, 1).copy()), label


def train_step(model, images, labels, optimizer):
    """One step on the CPU, the batch as the loader hands it out."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Images(args.steps * 8), batch_size=8, shuffle=True, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (images, labels) in enumerate(loader):
        print(f"step {step}: loss {train_step(model, images, labels, optimizer)!r}")


if __name__ == "__main__":
    main()
