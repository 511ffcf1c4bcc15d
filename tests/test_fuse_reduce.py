"""tritonfuse's full-reduction epilogue: an elementwise region whose only user is `sum`/`mean` over all
elements becomes one kernel writing fp32 partial sums (docs/design/recipes.md#tritonfuse)."""
from __future__ import annotations

import json

import pytest

from kernelcraft.search.recipes import tritonfuse

import triton_interpreter
from triton_fusion import LOAD, calls, candidate, fuse

HINGE = "torch.mean(torch.clamp(1 - p * t, min=0))"
MSE = "torch.mean((p - t) ** 2)"
L1 = "(p - t).abs().sum()"
CHAINED = "((p - t).pow(2).mean() * 2.0 + 1.0)"  # the reduced scalar feeds a later region


def _source(expr: str, shapes=((64, 300), (300,)), dtype="float32", pre: str = "") -> str:
    make = "torch.randn" if dtype.startswith("float") else "torch.randint(0, 9, "
    ins = ", ".join(f"{make}({s}, dtype=torch.{dtype})" if dtype.startswith("float") else f"{make}{s}, dtype=torch.{dtype})"
                    for s in shapes)
    return ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, p, t):\n"
            + (f"        {pre}\n" if pre else "") + f"        return {expr}\n"
            f"def get_inputs():\n    return [{ins}]\ndef get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("expr,kind,ops", [(HINGE, "mean", 3), (MSE, "mean", 2), (L1, "sum", 2),
                                           ("(p * p).sum()", "sum", 1), ("torch.sum(p - t, dim=None)", "sum", 1),
                                           ("torch.pow(p - t, 2).mean()", "mean", 2)])
def test_region_and_full_reduction_become_one_kernel(expr, kind, ops):
    gm, _, fused = fuse(_source(expr))
    assert fused is not None and len(fused.regions) == 1
    assert fused.regions[0] == {"name": "_kc_ew0", "ops": ops, "inputs": 2 if "t" in expr else 1, "reduce": kind}
    assert calls(gm) == ["_kc_ew0"]  # region members and the reduction erased
    out = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert tuple(out.meta["tensor_meta"].shape) == ()
    src = fused.source
    assert "tl.sum(acc, axis=0)" in src and "BLOCKS: tl.constexpr" in src and "tl.store(out_ptr" not in src
    assert "partials.sum()" in src and ("(total / n)" in src) == (kind == "mean")
    if expr == HINGE:
        assert "tl.maximum(" in src and "((1.0) - (v0))" in src
    compile(src, "kernels", "exec")


def test_square_is_lowered_only_for_the_exponent_two():
    gm, _, fused = fuse(_source("((p - t) ** 3).sum()"))
    assert fused is None and "sum" in calls(gm)
    _, _, fused = fuse(_source("((p - t) ** 2.0).sum()"))
    assert fused is not None and fused.regions[0]["ops"] == 2 and "((v0) * (v0))" in fused.source


@pytest.mark.parametrize("expr", ["d.sum(dim=1)", "d.sum(1)", "torch.sum(d, dim=None, keepdim=True)",
                                  "torch.mean(d, dtype=torch.float32)",
                                  "d.sum() + d.amax()"])  # the region's output has a second user
def test_near_misses_keep_the_reduction(expr):
    gm, _, fused = fuse(_source(expr, pre="d = (p - t).abs()"))
    assert fused is not None and all(r["reduce"] is None for r in fused.regions if r["name"].startswith("_kc_ew")), expr
    # the reduction stays outside the region's kernel: PyTorch's, or one over a dimension of its own (dimreduce)
    assert any(t in ("sum", "mean") or str(t).startswith("_kc_red") for t in calls(gm))


def test_second_user_and_single_op_without_reduction():
    gm, _, fused = fuse(_source("torch.sum(p * t) + (p * t).sum(0).sum()"))  # traced: two separate muls
    assert fused is not None and [r["reduce"] for r in fused.regions] == ["sum", "sum over dimension 0"]
    gm, _, fused = fuse(_source("d.sum() + d[0].sum()", pre="d = p * t"))  # one op whose output has two users: nothing to fuse
    assert fused is None and calls(gm).count("sum") == 2
    assert fuse(_source("p * t"))[2] is None  # one op, no reduction: the >= 2 rule


def test_integer_tensors_are_not_fused():
    gm, _, fused = fuse(_source(L1, dtype="int64"))
    assert fused is None and "sum" in calls(gm)


def test_generated_candidates_match_the_reference_in_the_interpreter(tmp_path, monkeypatch):
    """Sizes: n not a multiple of BLOCK, several programs, n == 0 (sum 0, mean nan), a transposed input; the
    last case is generated with a small grid target so that each program loops over several blocks."""
    cases = []
    for i, (expr, shapes) in enumerate([
            (HINGE, [[[64, 300], [300]], [[3, 7], [7]], [[0, 300], [300]], [[2100], [2100]]]),
            (MSE, [[[64, 300], [64, 300]], [["T", 300, 64], [64, 300]], [[5, 1, 700], [3, 1]]]),
            (L1, [[[64, 300], [300]], [[0], [0]], [[1025], [1]]]),
            (CHAINED, [[[64, 300], [300]], [[17], [17]]]),
            ("(p * p).sum() / t.sum()", [[[64, 300], [300]]])]):
        ref, cand = tmp_path / f"ref{i}.py", tmp_path / f"cand{i}.py"
        ref.write_text(_source(expr))
        cand.write_text(candidate(_source(expr)))
        cases.append((str(ref), str(cand), shapes))
    monkeypatch.setattr(tritonfuse, "REDUCE_PROGRAMS", 2)  # n = 19200: BLOCKS = 16, two programs
    cand = tmp_path / "cand_loop.py"
    cand.write_text(candidate(_source(HINGE)))
    assert "BLOCKS=blocks" in cand.read_text() and "min(64, triton.next_power_of_2(triton.cdiv(n, 2048)))" in cand.read_text()
    cases.append((cases[0][0], str(cand), [[[64, 300], [300]], [[7, 5000], [5000]]]))
    listing = tmp_path / "cases.json"
    listing.write_text(json.dumps(cases))
    proc = triton_interpreter.run(f"""
        import json, types, torch
        exec({LOAD!r})
        def make(shape):
            return torch.randn(*shape[1:]).t() if shape[0] == "T" else torch.randn(*shape)
        for ref, cand, shape_sets in json.load(open({str(listing)!r})):
            m_ref, m_new = load(ref, "ref").Model(), load(cand, "cand").ModelNew()
            for shapes in shape_sets:
                torch.manual_seed(len(shape_sets))
                ins = [make(s) for s in shapes]
                want, got = m_ref(*ins), m_new(*ins)
                assert got.shape == want.shape == () and got.dtype == want.dtype, (cand, shapes)
                torch.testing.assert_close(got, want, rtol=1.3e-6 * 4, atol=1e-5, equal_nan=True, msg=f"{{cand}} {{shapes}}")
        print("ok")
    """, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
