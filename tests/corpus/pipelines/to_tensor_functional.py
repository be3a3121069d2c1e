"""`TF.to_tensor(pil)` then `TF.normalize(...)` in __getitem__ (no pipeline held): the conversion also moves
the channels first, so the 8-bit image left in its place is channels-last."""
import numpy as np
import torch
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

from PIL import Image
from torchvision.transforms import functional as TF


class Images(Dataset):
    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        img = Image.fromarray(PIXELS[i])
        x = TF.to_tensor(img)
        x = TF.normalize(x, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
        return x, torch.tensor(i % 4)
