"""Depthwise convolutions lowered to generated Triton kernels (`search/recipes/depthwise.py`, under the `triton`
recipe): what is matched, what is left to PyTorch, and the kernels against PyTorch in Triton's interpreter."""
from __future__ import annotations

import pytest

import triton_interpreter
from triton_fusion import LOAD, calls, case_files, fuse


def _source(init: str, expr: str, shape=(2, 8, 12, 13), extra_input: str = "") -> str:
    inputs = f"torch.randn{shape}" + (f", {extra_input}" if extra_input else "")
    args = "x, w" if extra_input else "x"
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
            "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.conv = {init}\n        self.weight = nn.Parameter(torch.randn(8, 1, 3, 3))\n"
            f"    def forward(self, {args}):\n        return {expr}\n"
            f"def get_inputs():\n    return [{inputs}]\ndef get_init_inputs():\n    return []\n")


# (module, forward, input shape): 1-D and 2-D, square and asymmetric kernels, stride, padding (ints, "same",
# "valid"), dilation, a channel multiplier, bias or none, the functional form with a parameter weight
CASES = [("nn.Conv2d(8, 8, 3, padding=1, groups=8)", "self.conv(x)", (2, 8, 12, 13)),
         ("nn.Conv2d(8, 8, (3, 1), padding=(1, 0), groups=8, bias=False)", "self.conv(x)", (2, 8, 11, 9)),
         ("nn.Conv2d(8, 8, (3, 7), stride=(2, 1), padding=(1, 3), dilation=(1, 2), groups=8)", "self.conv(x)",
          (1, 8, 13, 20)),
         ("nn.Conv2d(4, 8, 3, stride=2, padding=2, groups=4)", "self.conv(x)", (2, 4, 10, 11)),
         ("nn.Conv1d(6, 6, 5, padding=2, groups=6)", "self.conv(x)", (2, 6, 30)),
         ("nn.Identity()", "F.conv2d(x, self.weight, None, 1, 1, 1, 8)", (2, 8, 12, 13)),
         ("nn.Conv2d(8, 8, 4, padding='same', dilation=(1, 2), groups=8)", "self.conv(x)", (2, 8, 9, 14)),
         ("nn.Conv1d(6, 12, 3, stride=3, padding='valid', groups=6)", "self.conv(x)", (2, 6, 31))]


@pytest.mark.parametrize("init,expr,shape", CASES[:6])
def test_a_depthwise_convolution_becomes_one_kernel_call(init, expr, shape):
    gm, _, fused = fuse(_source(init, expr, shape))
    assert fused is not None and [r["name"] for r in fused.regions] == ["_kc_dwconv0"], fused and fused.regions
    assert fused.regions[0]["reduce"].lower().startswith("depthwise conv")
    assert "_kc_dwconv0" in calls(gm) and not any("conv" in str(c) and c != "_kc_dwconv0" for c in calls(gm))
    assert "_kc_dwconv_kernel" in fused.source
    compile(fused.source, "kernels", "exec")


def test_a_weight_given_as_an_input_is_the_kernels_argument():
    gm, _, fused = fuse(_source("nn.Identity()", "F.conv2d(x, w, groups=8)", extra_input="torch.randn(8, 1, 3, 3)"))
    assert fused is not None and [r["name"] for r in fused.regions] == ["_kc_dwconv0"], fused and fused.regions
    call = next(n for n in gm.graph.nodes if getattr(n.target, "__name__", None) == "_kc_dwconv0")
    assert [getattr(a, "name", a) for a in call.args] == ["x", "w", None]


@pytest.mark.parametrize("init,expr", [("nn.Conv2d(8, 8, 3)", "self.conv(x)"),
                                       ("nn.Conv2d(8, 8, 3, groups=2)", "self.conv(x)"),
                                       ("nn.Conv2d(8, 8, 3, padding=1, groups=8, padding_mode='reflect')",
                                        "self.conv(x)"),
                                       ("nn.ConvTranspose2d(8, 8, 3, groups=8)", "self.conv(x)"),
                                       ("nn.Conv3d(8, 8, 3, groups=8)", "self.conv(torch.stack([x] * 4, 2))"),
                                       ("nn.Identity()", "F.conv2d(x, self.weight * 2, groups=8)")])
def test_what_the_kernel_does_not_take_stays_pytorch(init, expr):
    gm, _, fused = fuse(_source(init, expr))
    assert fused is None or not any(r["name"].startswith("_kc_dwconv") for r in fused.regions), fused.regions


def test_generated_kernels_match_pytorch_in_the_interpreter(tmp_path):
    listing = case_files(tmp_path, [(_source(init, expr, shape), shape) for init, expr, shape in CASES], "_kc_dwconv_kernel")
    proc = triton_interpreter.run(f"""
        import json, types, torch
        exec({LOAD!r})
        for ref, cand, shape in json.load(open({str(listing)!r})):
            generated, launches = load(cand, "cand"), []
            kernel = generated._kc_dwconv_kernel

            class Counted:  # the generated kernel, its launches counted
                def __getitem__(self, grid):
                    launches.append(grid)
                    return kernel[grid]
            generated._kc_dwconv_kernel = Counted()
            m_ref, m_new = load(ref, "ref").Model(), generated.ModelNew()
            m_new.load_state_dict(m_ref.state_dict())
            for dtype in (torch.float32, torch.float16):
                x = torch.randn(*shape).to(dtype)
                want, got = m_ref.to(dtype)(x), m_new.to(dtype)(x)
                assert got.shape == want.shape and got.dtype == want.dtype, (cand, got.shape, want.shape)
                tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
                torch.testing.assert_close(got, want, **tol, msg=f"{{cand}} {{dtype}}")
            assert len(launches) == 2, (cand, launches)  # the kernel ran, not the fallback
            if isinstance(m_ref.conv, torch.nn.Conv2d) and m_ref.conv.padding != "same":  # read at run time
                m_ref.float(), m_new.float()
                x = torch.randn(*shape)
                for m in (m_ref, m_new):
                    m.conv.stride, m.conv.padding = (1, 2), (0, 1)
                    m.conv.weight.data.mul_(-1)
                torch.testing.assert_close(m_new(x), m_ref(x), rtol=1e-5, atol=1e-5, msg=cand)
                assert len(launches) == 3, (cand, launches)
                m_new.conv.groups = m_ref.conv.groups = 1  # no longer depthwise: the module itself
                m_new.conv.weight = m_ref.conv.weight = torch.nn.Parameter(torch.randn(8, shape[1], 3, 3))
                torch.testing.assert_close(m_new(x), m_ref(x), rtol=1e-5, atol=1e-5, msg=cand)
                assert len(launches) == 3, (cand, launches)
        print("ok")
    """, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
