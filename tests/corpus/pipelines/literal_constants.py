"""Constants written as literals in the statement: `(img - np.array([...])) / np.array([...])` (float64)."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)


class Images(Dataset):
    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        img = PIXELS[i].astype(np.float32) / 255.0
        img = (img - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
        return torch.from_numpy(img.transpose(2, 0, 1).copy()), i % 4
