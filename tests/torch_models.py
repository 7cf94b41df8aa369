"""PyTorch twins of minidp's models (same layers and state_dict keys): parity tests, benchmarks."""

import torch
from torch import nn


class Twin(nn.Module):
    """features then classifier, as minidp's LeNet5 and CifarCNN."""

    def __init__(self, features, classifier):
        super().__init__()
        self.features, self.classifier = features, classifier

    def forward(self, x):
        return self.classifier(self.features(x))


class Block(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet20(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(Block(16, 16), Block(16, 16), Block(16, 16))
        self.layer2 = nn.Sequential(Block(16, 32, 2), Block(32, 32), Block(32, 32))
        self.layer3 = nn.Sequential(Block(32, 64, 2), Block(64, 64), Block(64, 64))
        self.avgpool = nn.AvgPool2d(8)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.fc(torch.flatten(self.avgpool(out), 1))


def build(name):
    """PyTorch model equivalent to ``minidp.layers.MODELS[name]()``."""
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    if name == "lenet5":
        return Twin(nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2)),
                    nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(),
                                  nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)))
    if name == "cifar_cnn":
        return Twin(nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
                    nn.Sequential(nn.Flatten(), nn.Linear(2048, 256), nn.ReLU(),
                                  nn.Linear(256, 10)))
    if name == "resnet20":
        return ResNet20()
    raise ValueError(f"model: got {name!r}, allowed: mlp, lenet5, cifar_cnn, resnet20")
