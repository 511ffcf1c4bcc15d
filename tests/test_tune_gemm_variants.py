"""The GEMM template's variants on a CPU: which matrix products match (batched, N-D times a matrix, einsum,
transposed operands, a kept triangle), their generated kernels' correctness in Triton's interpreter, and the
kernel identity that the tuned-configuration store keys on."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kernelcraft.search.recipes import tunable, tunetemplates

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(ROOT / "tests"))
import template_match  # noqa: E402
import triton_interpreter  # noqa: E402

# fixture -> (shape, bindings a / b, the kernel's layout fields that are set)
VARIANTS = {
    "gemm_bmm": ({"M": 70, "N": 90, "K": 40, "batch": 3}, ("A", "B"), {"batched": True}),
    "gemm_einsum_batched": ({"M": 65, "N": 33, "K": 40, "batch": 2}, ("A", "B"), {"batched": True}),
    "gemm_3d_tensor": ({"M": 132, "N": 48, "K": 64}, ("A", "B"), {}),
    "gemm_einsum_4d": ({"M": 120, "N": 40, "K": 32}, ("A", "B"), {}),
    "gemm_einsum_bt": ({"M": 70, "N": 50, "K": 96}, ("A", "B.t()"), {"b_trans": True}),
    "gemm_transposed_both": ({"M": 80, "N": 72, "K": 64}, ("A.t()", "B.t()"), {"a_trans": True, "b_trans": True}),
    "gemm_triu": ({"M": 130, "N": 150, "K": 96}, ("A", "B"), {"tri": "upper", "tri_diag": 1}),
    "gemm_tril": ({"M": 130, "N": 130, "K": 72}, ("A", "B"), {"tri": "lower"}),
    "gemm_split_k": ({"M": 64, "N": 48, "K": 20000}, ("A", "B"), {"split_k": 8}),
}
LAYOUT = {"a_trans": False, "b_trans": False, "batched": False, "tri": "", "tri_diag": 0, "split_k": 1}  # defaults


def _source(name: str) -> str:
    return (TASKS / f"{name}.py").read_text()



@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_variant_matches(name):
    shape, (a, b), layout = VARIANTS[name]
    (m,) = template_match.matches(_source(name))
    assert m.kernel.kind == "gemm" and m.shape == shape and (m.bindings["a"], m.bindings["b"]) == (a, b)
    assert {f: getattr(m.kernel, f) for f, default in LAYOUT.items() if getattr(m.kernel, f) != default} == layout
    assert tunable.check_shape("gemm", m.shape) == shape


@pytest.mark.parametrize("source", [
    _source("gemm_triu_then_add"),  # a constant after the triangle lands on its zeros: not one kernel
    _source("gemm_bmm").replace("torch.bmm(A, B)", 'torch.einsum("bik,bkj->bji", A, B)'),  # output transposed
    _source("gemm_einsum_4d").replace('"bijl,lk->bijk"', '"bijl,lk->bjik"'),
    _source("gemm_3d_tensor").replace("torch.matmul(A, B)", "torch.triu(torch.matmul(A, B))"),  # triu of a 3-D
    _source("gemm_transposed_both").replace("torch.matmul(A.T, B.T)", "torch.matmul(A.T, B.T) @ B"),
])
def test_what_is_not_one_product_does_not_match(source):
    assert template_match.matches(source) == []


def test_the_layout_fields_keep_older_keys():
    """The store keys configurations by `Kernel.key()`: a kernel without the later layout fields keeps the
    key it had, and each field, once set, names different code."""
    plain = tunable.Kernel("gemm", "float32")
    assert plain.key() == "gemm-float32-epi-e34fb7556e"
    variants = [tunable.Kernel("gemm", "float32", **kw) for kw in
                ({"a_trans": True}, {"batched": True}, {"tri": "upper"}, {"tri": "upper", "tri_diag": 2},
                 {"tri": "lower"}, {"split_k": 4})]
    assert len({plain.key(), *(k.key() for k in variants)}) == 1 + len(variants)
    for bad in ({"tri": "diagonal"}, {"tri_diag": 1}):
        with pytest.raises(tunable.TunableError, match="triangle"):
            tunable.Kernel("gemm", "float32", **bad)
    for bad in ({"split_k": 4, "vectors": 1}, {"split_k": 4, "batched": True}, {"split_k": 128}):
        with pytest.raises(tunable.TunableError, match="split_k"):
            tunable.Kernel("gemm", "float32", **bad)
    with pytest.raises(tunable.TunableError, match="positive integers"):
        tunable.check_shape("gemm", {"M": 4, "N": 4, "K": 4, "batch": 0})
    with pytest.raises(tunable.TunableError, match="optional: batch"):
        tunable.check_shape("gemm", {"M": 4, "N": 4, "K": 4, "rows": 2})


def test_the_store_prefers_the_same_gpu(tmp_path):
    k = tunable.Kernel("gemm", "float32", batched=True)
    shape = {"M": 512, "N": 2048, "K": 1024, "batch": 128}
    on = {gpu: {"BLOCK_M": bm, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
          for gpu, bm in (("NVIDIA H100 80GB HBM3", 64), ("NVIDIA H200", 128))}
    store = tmp_path / "tuned.json"
    for gpu, cfg in on.items():
        tunable.record_tuned(k, shape, cfg, ms=1.0, gpu=gpu, source="t", path=store)
    for gpu, cfg in on.items():
        got, origin = tunable.lookup_config(k, shape, gpu=gpu, paths=[store])
        assert got == cfg and "exact" in origin and gpu in origin
    near = {**shape, "M": 384}  # the same GPU a little off in size beats another GPU at this size
    assert tunable.lookup_config(k, near, gpu="NVIDIA H200", paths=[store])[0] == on["NVIDIA H200"]
    assert tunable.lookup_config(k, shape, gpu="NVIDIA A100-SXM4-80GB", paths=[store])[0] in on.values()


def test_the_description_names_the_layout():
    words = {name: tunable.describe(template_match.matches(_source(name))[0])
             for name in ("gemm_bmm", "gemm_triu", "gemm_split_k", "gemm_transposed_both")}
    assert words["gemm_bmm"].endswith("MxNxK 70x90x40, 3 products") and "batched" in words["gemm_bmm"]
    assert "upper triangle kept (diagonal 1)" in words["gemm_triu"]
    assert "K in 8 ranges" in words["gemm_split_k"]
    assert "A transposed, B transposed" in words["gemm_transposed_both"]


def test_the_split_is_sized_to_the_tiles():
    """Cut K only when the output has few tiles and K is long; about two tiles per SM, ranges >= 2048."""
    assert tunable.split_for(4096, 4096, 4096) == 1 and tunable.split_for(256, 256, 8192) == 1
    assert tunable.split_for(256, 256, 1 << 19) == 64  # 4 tiles: 256 programs over 132 SMs
    assert tunable.split_for(64, 48, 20000) == 8  # one tile; 20000 // 16 < 2048


def test_the_variants_are_correct_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    cases = []
    for name in sorted(VARIANTS):
        source = _source(name)
        (m,) = template_match.matches(source)
        cfgs = tunable.all_configs(m.kernel, m.shape)
        for cfg in (cfgs[0], cfgs[-1]):  # the smallest blocks (several tiles, masks, skipped tiles) and the largest
            p = tmp_path / f"{name}_{len(cases)}.py"
            p.write_text(tunetemplates.candidate_source(source, m, cfg))
            cases.append((source, str(p)))
    assert triton_interpreter.wrong_candidates(cases, tmp_path) == []


def test_strided_views_are_multiplied_right_in_the_interpreter(tmp_path):
    """Operands that are views (a column slice of a wider matrix, a transposed slice, a batch of slices), as a
    GEMM region inside a larger forward receives them: the launcher copies what a wrapping tile could read
    unaligned, and the products are right."""
    pytest.importorskip("triton")
    kernels = {"plain": tunable.Kernel("gemm", "float32"), "a_trans": tunable.Kernel("gemm", "float32", a_trans=True),
               "batched": tunable.Kernel("gemm", "float32", batched=True)}
    for name, k in kernels.items():
        (tmp_path / f"k_{name}.py").write_text(tunetemplates.kernel_module(k))
    proc = triton_interpreter.run(f"""
        import importlib.util, torch
        def load(name):
            spec = importlib.util.spec_from_file_location(name, {str(tmp_path)!r} + f"/k_{{name}}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        cfg = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2)
        torch.manual_seed(0)
        wide_a, wide_b = torch.randn(70, 80), torch.randn(40, 64)
        a, b = wide_a[:, :40], wide_b[:, :50]  # rows 16-aligned, 50 columns: the N tile wraps mid-vector
        got = load("plain")._kc_run(a, b, (), cfg)
        assert torch.allclose(got, a @ b, atol=1e-4), "plain"
        at = torch.randn(40, 80)[:, :70].t()  # A M-major, 70 rows on 80-element strides
        got = load("a_trans")._kc_run(at, b, (), cfg)
        assert torch.allclose(got, at @ b, atol=1e-4), "a_trans"
        ab, bb = torch.randn(2, 70, 40), torch.randn(2, 40, 64)[:, :, :50]
        got = load("batched")._kc_run(ab, bb, (), cfg)
        assert torch.allclose(got, torch.bmm(ab, bb), atol=1e-4), "batched"
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
