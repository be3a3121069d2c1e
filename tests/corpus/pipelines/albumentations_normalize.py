"""albumentations' Normalize as numpy code: BGR to RGB by a reversed slice, then
`(img.astype(np.float32) - mean * 255) / (std * 255)` in one statement, `np.transpose(img, (2, 0, 1))`."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class Images(Dataset):
    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        image = PIXELS[i][:, :, ::-1]
        image = (image.astype(np.float32) - MEAN * 255.0) / (STD * 255.0)
        image = np.transpose(image, (2, 0, 1))
        return torch.from_numpy(np.ascontiguousarray(image)), i % 4
