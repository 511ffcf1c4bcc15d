# tiny: batch_size=2, seq_len=8, dim=64, hidden_dim=128
# gpu: 3 GEMMs, 2*T*dim*hidden*3 = 142 GFLOP -> ~5.7 ms
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Gated MLP (SwiGLU): down(silu(gate(x)) * up(x)), bias-free as in LLaMA."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden_dim, bias=False)
        self.up = nn.Linear(dim, hidden_dim, bias=False)
        self.down = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


batch_size = 4
seq_len = 512
dim = 2048
hidden_dim = 5632


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]


def get_init_inputs():
    return [dim, hidden_dim]
