# tiny: batch_size=32, in_features=128, out_features=256
# gpu: 2*B*in*out = 69 GFLOP -> ~2.8 ms
import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear layer followed by LayerNorm over the output features."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.ln = nn.LayerNorm(out_features)
        with torch.no_grad():
            self.ln.weight.copy_(1.0 + 0.1 * torch.randn(out_features))
            self.ln.bias.copy_(0.1 * torch.randn(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.linear(x))


batch_size = 4096
in_features = 2048
out_features = 4096


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
