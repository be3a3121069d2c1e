"""Train a tiny timm model (built from its config: no weights are downloaded) on torchvision's FakeData, fed
through the most common image pipeline there is: PIL augmentations, ToTensor(), ImageNet's Normalize."""

from __future__ import annotations

import argparse

import timm
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def train_step(model, images, labels, optimizer, device):
    images = images.to(device)
    labels = labels.to(device)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--source-size", type=int, default=40, help="FakeData's images, cropped to --image-size")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_transform = transforms.Compose([
        transforms.RandomResizedCrop(args.image_size, scale=(0.5, 1.0)),
        transforms.RandomHorizontalFlip(),
        transforms.ColorJitter(0.2, 0.2, 0.2),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    data = datasets.FakeData(size=args.steps * 8, image_size=(3, args.source_size, args.source_size),
                             num_classes=10, transform=train_transform)
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=args.workers)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for step, (images, labels) in enumerate(loader):
        loss = train_step(model, images, labels, optimizer, device)
        print(f"step {step}: loss {loss:.4f}")


if __name__ == "__main__":
    main()
