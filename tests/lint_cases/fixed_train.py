"""The script of broken_train.py with every fix `advisor lint` suggests applied: it reports nothing.

Never run: tests only parse it.
"""

import os

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


torch.distributed.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device(f"cuda:{local_rank}")
model = DistributedDataParallel(Net().to(device), device_ids=[local_rank])
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")

train_set = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
val_set = TensorDataset(torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,)))
train_loader = DataLoader(
    train_set, batch_size=64, sampler=DistributedSampler(train_set), num_workers=4, pin_memory=True,
    persistent_workers=True,
)
val_loader = DataLoader(val_set, batch_size=64, num_workers=2, pin_memory=True)


@torch.no_grad()
def validate(model, loader):
    model.eval()
    correct = 0
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.float16):
            outputs = model(images)
        correct += (outputs.argmax(1) == labels).sum().item()
    return correct / len(loader.dataset)


for epoch in range(10):
    model.train()
    epoch_loss = 0.0
    for images, labels in train_loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        epoch_loss += loss.item()
    torch.cuda.empty_cache()
    print(epoch, epoch_loss / len(train_loader), validate(model, val_loader))
