# tiny: M=512, K=16, N=128
# gpu: 2*M*K*N = 8.6 GFLOP, 256 MiB output -> ~0.2-0.4 ms (bound by writing C)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Tall-skinny matmul C = A @ B with A (M, K), B (K, N) and a small inner dimension K."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


M = 16384
K = 64
N = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
