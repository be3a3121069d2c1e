"""A small CNN image classifier whose Dataset decodes image files from disk: DataLoader-bound.

Each `__getitem__` opens a PNG or JPEG with Pillow, decodes it, crops, flips and jitters it, then makes
float pixels of it and normalizes them, so with
`num_workers=0` the training loop spends most of its time waiting for data, not computing.

The data set (shapes drawn on noisy backgrounds, four classes) is generated deterministically into
`examples/data/shapes/` on the first run.

    python examples/image_classifier.py                       # train standalone
    advisor profile examples/image_classifier.py:train_step   # profile its training step
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter
from torch.utils.data import DataLoader, Dataset

DATA_DIR = Path(__file__).resolve().parent / "data" / "shapes"
CLASSES = ("circle", "square", "triangle", "cross")
IMAGE_SIZE = 256  # stored size; training crops CROP_SIZE and resizes it to INPUT_SIZE
CROP_SIZE = 224
INPUT_SIZE = 96


def draw_image(rng: random.Random, label: int) -> Image.Image:
    """One noisy image with a shape of the given class on it."""
    noise = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    image = Image.fromarray(noise).filter(ImageFilter.GaussianBlur(2))
    draw = ImageDraw.Draw(image)
    size = rng.randrange(70, 150)
    x, y = rng.randrange(10, IMAGE_SIZE - size - 10), rng.randrange(10, IMAGE_SIZE - size - 10)
    color = tuple(rng.randrange(256) for _ in range(3))
    box = (x, y, x + size, y + size)
    if CLASSES[label] == "circle":
        draw.ellipse(box, fill=color)
    elif CLASSES[label] == "square":
        draw.rectangle(box, fill=color)
    elif CLASSES[label] == "triangle":
        draw.polygon([(x, y + size), (x + size // 2, y), (x + size, y + size)], fill=color)
    else:
        third = size // 3
        draw.rectangle((x + third, y, x + 2 * third, y + size), fill=color)
        draw.rectangle((x, y + third, x + size, y + 2 * third), fill=color)
    return image


def ensure_dataset(root: Path = DATA_DIR, count: int = 384) -> list[tuple[Path, int]]:
    """Generate the image files once (each from its own seed: the same files every time); return
    (path, label) pairs."""
    root.mkdir(parents=True, exist_ok=True)
    items = []
    for i in range(count):
        label = i % len(CLASSES)
        path = root / f"{i:04d}-{CLASSES[label]}.{'png' if i % 2 else 'jpg'}"
        if not path.exists():
            image = draw_image(random.Random(i), label)
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
            # PNG's fastest compression: noise barely compresses, and the default level took 26 ms an image
            # (5 s of a first run), the fastest 4 ms; decoding costs the same either way.
            image.save(tmp, quality=95) if path.suffix == ".jpg" else image.save(tmp, compress_level=1)
            tmp.replace(path)  # a run stopped mid-write never leaves a truncated image
        items.append((path, label))
    return items


class ShapesDataset(Dataset):
    """Decodes and augments one image file per item."""

    def __init__(self, items: list[tuple[Path, int]], seed: int = 0):
        self.items = items
        self.seed = seed

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        rng = random.Random(self.seed * 100_003 + index)
        image = Image.open(path).convert("RGB")
        left, top = rng.randrange(IMAGE_SIZE - CROP_SIZE + 1), rng.randrange(IMAGE_SIZE - CROP_SIZE + 1)
        image = image.crop((left, top, left + CROP_SIZE, top + CROP_SIZE))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        image = image.rotate(rng.uniform(-15, 15), resample=Image.Resampling.BICUBIC)
        image = image.resize((INPUT_SIZE, INPUT_SIZE), Image.Resampling.LANCZOS)
        image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.8, 1.2))  # contrast/brightness jitter
        image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.9, 1.1))
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        pixels = (pixels - 0.5) / 0.25
        return pixels, label


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head."""

    def __init__(self, classes: int = len(CLASSES)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x))
        return self.head(x.mean(dim=(2, 3)))


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
    parser.add_argument("--epochs", type=int, default=10)  # advisor stops it once its steps are measured
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(ShapesDataset(ensure_dataset()), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.num_workers, drop_last=True)
    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(args.epochs):
        for step, (images, labels) in enumerate(loader):
            loss = train_step(model, optimizer, images, labels, device)
            if step % 4 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
