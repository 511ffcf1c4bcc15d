# tiny: batch_size=4, seq_len=16, features=256
# gpu: 256 MiB in + 256 MiB out -> ~0.2 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """RMS normalization over the last dimension: x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


batch_size = 16
seq_len = 1024
features = 4096


def get_inputs():
    return [torch.randn(batch_size, seq_len, features)]


def get_init_inputs():
    return [features]
