"""The convnet Dataset of issue 67: `np.float32(self.raw[i]) / 255.0`, module-level numpy MEAN and STD,
`torch.from_numpy(img.transpose(2, 0, 1).copy())`."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class Images(Dataset):
    def __init__(self):
        self.raw = PIXELS

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, i):
        img = np.float32(self.raw[i]) / 255.0
        img = (img - MEAN) / STD
        return torch.from_numpy(img.transpose(2, 0, 1).copy()), i % 4
