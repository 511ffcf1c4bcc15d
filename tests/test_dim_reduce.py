"""Reductions over one dimension lowered to generated Triton kernels (`search/recipes/dimreduce.py`, under the
`triton` recipe): what is matched, what is not, and the kernels against PyTorch in Triton's interpreter."""
from __future__ import annotations

import json

import pytest

from kernelcraft.search.recipes import dimreduce

import triton_interpreter
from triton_fusion import LOAD, calls, candidate, fuse


def _source(expr: str, shape=(4, 37, 50), dtype="float32") -> str:
    make = (f"torch.randn({shape}, dtype=torch.{dtype})" if dtype.startswith("float")
            else f"torch.randint(0, 9, {shape}, dtype=torch.{dtype})")
    return ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
            f"        return {expr}\n"
            f"def get_inputs():\n    return [{make}]\ndef get_init_inputs():\n    return []\n")


MATCHED = [("torch.sum(x, dim=1, keepdim=True)", "sum over dimension 1"),
           ("torch.mean(x, dim=1)", "mean over dimension 1"),
           ("torch.max(x, dim=1)[0]", "amax over dimension 1"),
           ("x.max(dim=-1).values", "amax over dimension 2"),
           ("torch.min(x, 1, True)[0]", "amin over dimension 1"),
           ("torch.amax(x, dim=(0,))", "amax over dimension 0"),
           ("torch.argmin(x, dim=1)", "argmin over dimension 1"),
           ("x.argmax(2)", "argmax over dimension 2"),
           ("x.sum(0)", "sum over dimension 0")]


@pytest.mark.parametrize("expr,what", MATCHED)
def test_a_reduction_over_one_dimension_becomes_one_kernel_call(expr, what):
    gm, _, fused = fuse(_source(expr))
    assert fused is not None and [r["reduce"] for r in fused.regions] == [what], expr
    assert calls(gm) == ["_kc_red0"]  # the reduction (and a max/min pair) erased
    assert "_kc_dimreduce_kernel" in fused.source and "def _kc_red0(x):" in fused.source
    compile(fused.source, "kernels", "exec")


@pytest.mark.parametrize("expr", ["torch.max(x, dim=1)[1]",  # the indices of a max: not lowered
                                  "(lambda r: r[0] + r[1].float())(torch.max(x, 1))",  # values and indices read
                                  "x.sum(dim=(0, 1))",  # two dimensions
                                  "torch.sum(x, 1, dtype=torch.float64)",
                                  "x.sum()", "torch.amax(x)"])  # every element: not one dimension
def test_near_misses_are_left_to_pytorch(expr):
    gm, _, fused = fuse(_source(expr))
    assert fused is None or all(not str(r["reduce"]).endswith(("dimension 0", "dimension 1", "dimension 2"))
                                for r in fused.regions), (expr, fused and fused.regions)
    assert not any(str(c).startswith("_kc_red") for c in calls(gm)), expr


def test_integer_tensors_are_left_to_pytorch():
    gm, _, fused = fuse(_source("torch.sum(x, dim=1)", dtype="int64"))
    assert fused is None and "sum" in calls(gm)


def test_an_elementwise_region_then_a_reduction_over_a_dimension():
    gm, _, fused = fuse(_source("torch.relu(x * 2.0 + 1.0).sum(dim=1)"))
    assert fused is not None and [r["reduce"] for r in fused.regions] == [None, "sum over dimension 1"]
    assert calls(gm) == ["_kc_ew0", "_kc_red0"]


# (expression, input shapes, how the input is drawn): inner tiles and R chunks of more than one, keepdim, NaNs,
# ties (integer-valued floats), an all -inf slice, a size-1 reduced dimension, no elements
CASES = [("torch.sum(x, dim=1, keepdim=True)", [(4, 37, 50), (2, 300, 3), (3, 5, 300)], "randn"),
         ("torch.mean(x, dim=0)", [(37, 50), (1, 9), (600, 2)], "randn"),
         ("torch.mean(x, dim=-1)", [(7, 3000), (0, 5)], "randn"),
         ("torch.max(x, dim=1)[0]", [(4, 37, 50), (2, 300, 3)], "nan"),
         ("torch.min(x, 2, True)[0]", [(4, 37, 50)], "nan"),
         ("torch.argmax(x, dim=1)", [(4, 37, 50), (2, 300, 3), (3, 5, 300)], "ties"),
         ("torch.argmin(x, dim=2)", [(4, 37, 50), (2, 3, 700)], "ties"),
         ("torch.argmax(x, dim=1)", [(4, 37, 50)], "nan"),
         ("torch.argmin(x, dim=0)", [(300, 7)], "nan"),
         ("torch.argmax(x, dim=1)", [(3, 40, 5)], "-inf")]


def test_short_rows_run_the_pytorch_op():
    """A program must read at least MIN_WORK elements, decided by shape at run time: else the PyTorch op runs."""
    _, _, fused = fuse(_source("torch.sum(x, dim=1)"))
    assert "if R * min(inner, 128) < 2048 or R * inner >= 2 ** 31:" in fused.source


def test_generated_kernels_match_pytorch_in_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(dimreduce, "MIN_WORK", 1)  # the kernel for every shape here, however small
    cases = []
    for i, (expr, shapes, draw) in enumerate(CASES):
        ref, cand = tmp_path / f"ref{i}.py", tmp_path / f"cand{i}.py"
        ref.write_text(_source(expr))
        cand.write_text(candidate(_source(expr)))
        assert "< 1 or" in cand.read_text()
        cases.append((str(ref), str(cand), shapes, draw))
    listing = tmp_path / "cases.json"
    listing.write_text(json.dumps(cases))
    proc = triton_interpreter.run(f"""
        import json, types, torch
        exec({LOAD!r})
        def make(shape, draw):
            if draw == "ties":
                return torch.randint(0, 3, shape).float()
            x = torch.randn(*shape)
            if draw == "nan" and x.numel():
                x.view(-1)[torch.randperm(x.numel())[: max(1, x.numel() // 50)]] = float("nan")
            if draw == "-inf":
                x[:, :, 1] = float("-inf")
            return x
        for ref, cand, shapes, draw in json.load(open({str(listing)!r})):
            m_ref, m_new = load(ref, "ref").Model(), load(cand, "cand").ModelNew()
            for shape in shapes:
                torch.manual_seed(len(shape))
                x = make(shape, draw)
                want, got = m_ref(x), m_new(x)
                assert got.shape == want.shape and got.dtype == want.dtype, (cand, shape, got.shape, want.shape)
                if want.dtype == torch.int64:
                    assert torch.equal(got, want), (cand, shape, draw)
                else:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True, msg=f"{{cand}} {{shape}}")
        print("ok")
    """, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
