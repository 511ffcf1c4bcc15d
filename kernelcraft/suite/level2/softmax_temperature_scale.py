# tiny: batch_size=64, dim=256
# gpu: 256 MiB in + 256 MiB out -> ~0.2 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax of x / temperature over the last dim, rescaled by dim and a learned per-feature gain."""

    def __init__(self, dim: int, temperature: float):
        super().__init__()
        self.temperature = temperature
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(x / self.temperature, dim=-1)
        return p * x.shape[-1] * self.gain


batch_size = 65536
dim = 1024
temperature = 2.0


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, temperature]
