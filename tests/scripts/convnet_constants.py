"""A small convnet on 8-bit pictures held in memory, its Dataset normalizing them per channel by module
constants (tuple-assigned numpy arrays), channels-last, before the transpose to channels-first: the form
issue 53 found refused by the 8-bit copies."""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


class Pictures(Dataset):
    def __init__(self, count):
        rng = np.random.default_rng(0)
        self.raw = rng.integers(0, 256, (count, 16, 16, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 4, count)

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        img = np.float32(self.raw[i]) / 255.0
        img = (img - MEAN) / STD
        return torch.from_numpy(img.transpose(2, 0, 1)), int(self.labels[i])


def train_step(model, images, labels, optimizer, device):
    images = images.to(device)
    labels = labels.to(device)
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
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Pictures(args.steps * 8), batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (images, labels) in enumerate(loader):
        print(f"step {step}: loss {train_step(model, images, labels, optimizer, device)!r}")


if __name__ == "__main__":
    main()
