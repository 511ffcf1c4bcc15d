# tiny: N=128
# gpu: 2*N^3 = 1.1 TFLOP on fp16 tensor cores (~700 TFLOP/s) -> ~1.6 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Half-precision square matmul C = A @ B (fp16 inputs and output; meant for GPU tensor cores)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


N = 8192


def get_inputs():
    return [torch.randn(N, N).half(), torch.randn(N, N).half()]


def get_init_inputs():
    return []
