"""torchvision v1 on the Dataset: `Compose([RandomHorizontalFlip(), ToTensor(), Normalize(MEAN, STD)])` held as
`self.transform` and called on a PIL image (moved as a pipeline: ToTensor becomes PILToTensor)."""
import numpy as np
from torch.utils.data import Dataset

PIXELS = np.random.default_rng(0).integers(0, 256, (6, 12, 10, 3), dtype=np.uint8)

from PIL import Image
from torchvision import transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Images(Dataset):
    def __init__(self):
        self.transform = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                             transforms.Normalize(MEAN, STD)])

    def __len__(self):
        return len(PIXELS)

    def __getitem__(self, i):
        img = Image.fromarray(PIXELS[i])
        return self.transform(img), i % 4
