"""Channels-last throughout (HWC kept), `np.asarray(img, dtype="float32") / 255`, an init-set mean and std."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)


class Images(Dataset):
    def __init__(self, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)

    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        label = i % 4
        img = np.asarray(PIXELS[i], dtype="float32") / 255
        img = (img - self.mean) / self.std
        return label, torch.from_numpy(img)
