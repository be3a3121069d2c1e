"""OpenCV-style decoding: a decoder returning a BGR uint8 array (as cv2.imdecode does), `cvtColor`-like channel
swap, `img.astype(np.float32)`, in-place `img /= 255.0`, `img -= MEAN`, `img /= STD`, HWC to CHW."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def imdecode(buffer):
    return np.frombuffer(buffer, np.uint8).reshape(12, 10, 3)[:, :, ::-1]


class Images(Dataset):
    def __init__(self):
        self.buffers = [p.tobytes() for p in PIXELS]

    def __len__(self):
        return len(self.buffers)

    def __getitem__(self, i):
        img = imdecode(self.buffers[i])
        img = img[:, :, ::-1]
        img = img.astype(np.float32)
        img /= 255.0
        img -= MEAN
        img /= STD
        img = img.transpose(2, 0, 1)
        return torch.from_numpy(img.copy()), i % 4
