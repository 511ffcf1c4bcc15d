# tiny: batch_size=2, image_size=16, width=8
# gpu: 4 convs, 0.9 + 19 + 9.7 + 19 GFLOP -> ~2-4 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """VGG-style network: two blocks of (conv-ReLU-conv-ReLU-maxpool), global average pool, linear classifier."""

    def __init__(self, in_channels: int, width: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.mean(x, dim=(2, 3))
        return self.classifier(x)


batch_size = 16
in_channels = 3
image_size = 128
width = 64
num_classes = 100


def get_inputs():
    return [torch.randn(batch_size, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, width, num_classes]
