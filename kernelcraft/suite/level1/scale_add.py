# tiny: batch_size=16, dim=4096
# gpu: 512 MiB in + 256 MiB out -> ~0.25 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Elementwise scaled add: alpha * a + b."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.alpha * a + b


batch_size = 4096
dim = 16384
alpha = 0.75


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return [alpha]
