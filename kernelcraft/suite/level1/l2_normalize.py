# tiny: batch_size=32, dim=1024
# gpu: 256 MiB in + 256 MiB out -> ~0.2 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """L2-normalizes each row: x / max(||x||_2, eps) over the last dimension."""

    def __init__(self, eps: float = 1e-12):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, ord=2, dim=-1, keepdim=True)
        return x / norm.clamp_min(self.eps)


batch_size = 16384
dim = 4096


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
