"""Max and average pooling lowered to generated Triton kernels (`search/recipes/pooling.py`, under the `triton`
recipe): what is matched, what is left to PyTorch, and the kernels against PyTorch in Triton's interpreter."""
from __future__ import annotations

import pytest

import triton_interpreter
from triton_fusion import LOAD, calls, case_files, fuse


def _source(init: str, expr: str, shape=(2, 3, 20, 22)) -> str:
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
            "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.pool = {init}\n    def forward(self, x):\n        return {expr}\n"
            f"def get_inputs():\n    return [torch.randn{shape}]\ndef get_init_inputs():\n    return []\n")


# (module, forward, input shape): 1-3 spatial dimensions, strides, padding, dilation, count_include_pad
CASES = [("nn.MaxPool2d(3, stride=2, padding=1)", "self.pool(x)", (2, 3, 20, 22)),
         ("nn.MaxPool2d(4, stride=1, padding=1, dilation=1)", "self.pool(x)", (2, 3, 17, 9)),
         ("nn.MaxPool3d(3, stride=2, padding=1, dilation=3)", "self.pool(x)", (1, 2, 14, 13, 12)),
         ("nn.MaxPool1d(5, stride=2, padding=2, dilation=2)", "self.pool(x)", (2, 3, 40)),
         ("nn.AvgPool1d(8, stride=1, padding=4)", "self.pool(x)", (2, 3, 50)),
         ("nn.AvgPool2d(11)", "self.pool(x)", (1, 2, 45, 34)),
         ("nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)", "self.pool(x)", (2, 3, 15, 16)),
         ("nn.AvgPool3d(3, stride=2, padding=1)", "self.pool(x)", (1, 2, 9, 10, 11)),
         ("nn.Identity()", "F.max_pool2d(x, 2)", (2, 3, 20, 22)),
         ("nn.Identity()", "F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)", (2, 3, 12, 13)),
         ("nn.Identity()", "F.avg_pool1d(x, 4)", (2, 3, 41)),
         ("nn.Identity()", "F.max_pool3d(x, (2, 3, 1), stride=(1, 2, 1))", (1, 2, 6, 9, 5))]


@pytest.mark.parametrize("init,expr,shape", CASES[:3] + CASES[8:10])
def test_a_pooling_becomes_one_kernel_call(init, expr, shape):
    gm, _, fused = fuse(_source(init, expr, shape))
    assert fused is not None and [r["name"] for r in fused.regions] == ["_kc_pool0"], fused and fused.regions
    assert "_kc_pool0" in calls(gm) and not any("pool" in str(c) and c != "_kc_pool0" for c in calls(gm))
    assert "_kc_pool_kernel" in fused.source
    compile(fused.source, "kernels", "exec")


@pytest.mark.parametrize("init,expr", [("nn.MaxPool2d(3, ceil_mode=True)", "self.pool(x)"),
                                       ("nn.MaxPool2d(3, return_indices=True)", "self.pool(x)[0]"),
                                       ("nn.AvgPool2d(3, divisor_override=2)", "self.pool(x)"),
                                       ("nn.Identity()", "F.avg_pool2d(x, 3, ceil_mode=True)"),
                                       ("nn.AdaptiveAvgPool2d(4)", "self.pool(x)")])
def test_what_the_kernel_does_not_take_stays_pytorch(init, expr):
    gm, _, fused = fuse(_source(init, expr))
    assert fused is None or not any(r["name"].startswith("_kc_pool") for r in fused.regions), fused.regions


def test_generated_kernels_match_pytorch_in_the_interpreter(tmp_path):
    listing = case_files(tmp_path, [(_source(init, expr, shape), shape) for init, expr, shape in CASES], "_kc_pool_kernel")
    proc = triton_interpreter.run(f"""
        import json, types, torch
        exec({LOAD!r})
        for ref, cand, shape in json.load(open({str(listing)!r})):
            m_ref, m_new = load(ref, "ref").Model(), load(cand, "cand").ModelNew()
            for nan in (False, True):
                torch.manual_seed(len(shape))
                x = torch.randn(*shape)
                if nan:
                    x.view(-1)[torch.randperm(x.numel())[:3]] = float("nan")
                want, got = m_ref(x), m_new(x)
                assert got.shape == want.shape and got.dtype == want.dtype, (cand, got.shape, want.shape)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, msg=f"{{cand}} nan={{nan}}")
            m_new.pool.ceil_mode = m_ref.pool.ceil_mode = hasattr(m_ref.pool, "ceil_mode")  # settings read at run time
            if hasattr(m_ref.pool, "ceil_mode"):
                torch.testing.assert_close(m_new(x), m_ref(x), equal_nan=True)
        print("ok")
    """, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
