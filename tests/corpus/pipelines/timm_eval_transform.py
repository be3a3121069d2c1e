"""timm's eval transform as `create_transform` builds it: Resize, CenterCrop, ToTensor, Normalize with
IMAGENET_DEFAULT_MEAN/STD, held on the Dataset (moved as a pipeline)."""
import numpy as np
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

from PIL import Image
from torchvision import transforms

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)


class Images(Dataset):
    def __init__(self):
        self.transform = transforms.Compose([
            transforms.Resize(10, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(8),
            transforms.ToTensor(),
            transforms.Normalize(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD),
        ])

    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(PIXELS[i])), i % 4
