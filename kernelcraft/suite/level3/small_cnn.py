# tiny: batch_size=2, image_size=16
# gpu: conv1 1.8 + conv2 9.7 GFLOP + pools + 84 MFLOP classifier -> ~1 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Small CNN classifier: 2 x (3x3 conv, ReLU, 2x2 max pool), then a linear layer."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(64 * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


batch_size = 64
in_channels = 3
image_size = 128
num_classes = 10


def get_inputs():
    return [torch.randn(batch_size, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, image_size, num_classes]
