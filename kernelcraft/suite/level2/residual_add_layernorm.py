# tiny: batch_size=4, seq_len=16, features=256
# gpu: 512 MiB in + 256 MiB out -> ~0.25 ms (memory bound)
import torch
import torch.nn as nn


class Model(nn.Module):
    """Residual add followed by LayerNorm: LayerNorm(x + residual)."""

    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        with torch.no_grad():
            self.ln.weight.copy_(1.0 + 0.1 * torch.randn(features))
            self.ln.bias.copy_(0.1 * torch.randn(features))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.ln(x + residual)


batch_size = 16
seq_len = 1024
features = 4096


def get_inputs():
    return [torch.randn(batch_size, seq_len, features), torch.randn(batch_size, seq_len, features)]


def get_init_inputs():
    return [features]
