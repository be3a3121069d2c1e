"""torchvision v2: `Compose([ToImage(), RandomHorizontalFlip(), ToDtype(torch.float32, scale=True),
Normalize(...)])` on an array (moved as a pipeline)."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

from torchvision.transforms import v2


class Images(Dataset):
    def __init__(self):
        self.transform = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                                     v2.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])

    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        return self.transform(PIXELS[i]), i % 4
