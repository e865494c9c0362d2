"""export_cnn.py: the PyTorch CNN of the export round trip (tests/cli/export.sh): conv,
batch norm, ReLU, max-pool, a residual add, dropout and linear, for Fashion-MNIST (1, 28, 28).
Written the way PyTorch users write models (named submodules, functional relu, an explicit
forward), not the way pipedream's JSON reads."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, dropout=0.25, c=32, hidden=128):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.conv4 = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.drop = nn.Dropout(dropout)
        self.fc1 = nn.Linear(2 * c * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))           # (c, 14, 14)
        y = F.relu(self.bn2(self.conv2(x)))
        y = self.bn3(self.conv3(y))
        x = torch.relu(x + y)                                    # the residual add
        x = self.pool(F.relu(self.conv4(x)))                     # (2c, 7, 7)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(self.drop(x)))
        return self.fc2(x)


def net():
    return Net()
