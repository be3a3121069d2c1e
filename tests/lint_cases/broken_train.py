"""A training script with every mistake `advisor lint` knows; each reported line says `expect: <rule>`.

Never run: tests only parse it.
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
model.half()  # expect: half-with-batchnorm
model = nn.DataParallel(model)  # expect: data-parallel
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

train_set = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
val_set = TensorDataset(torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,)))
train_loader = DataLoader(train_set, batch_size=64, shuffle=True)  # expect: dataloader-num-workers  expect: dataloader-pin-memory
val_loader = DataLoader(val_set, batch_size=64, num_workers=2, pin_memory=True)


def validate(model, loader):
    model.eval()
    correct = 0
    for images, labels in loader:
        images = images.to(device)  # expect: non-blocking-copy
        labels = labels.to(device, non_blocking=True)
        outputs = model(images.half())  # expect: eval-without-no-grad
        correct += (outputs.argmax(1) == labels).sum().item()
    return correct / len(loader.dataset)


for epoch in range(10):
    model.train()
    epoch_loss = 0.0
    for images, labels in train_loader:
        images, labels = images.to(device), labels.to(device)
        loss = criterion(model(images.half()), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        epoch_loss += loss  # expect: loss-accumulation
        torch.cuda.empty_cache()  # expect: empty-cache-in-loop
    print(epoch, epoch_loss / len(train_loader), validate(model, val_loader))
