"""The `tuned_gemm` recipe on a CPU: which GEMM regions of a forward are found (the product plus the epilogue
it can fuse, stopped where an inner value is read outside), the spliced candidates' correctness in Triton's
interpreter, and the token's plumbing in the offline policy."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kernelcraft.search.policies import Context
from kernelcraft.search.recipes import gemmsplice, render, rewrite, tunable
from kernelcraft.search.recipes.policy import RecipesPolicy
from kernelcraft.task import load_task

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(ROOT / "tests"))
import triton_interpreter  # noqa: E402
from test_tune_recipe import CPU, GPU  # noqa: E402


def _source(name: str) -> str:
    return (TASKS / f"{name}.py").read_text()


BMM_SOFTMAX = _source("gemm_bmm").replace("torch.bmm(A, B)", "torch.softmax(torch.bmm(A, B) * 0.5, dim=-1)")
CHAINED = _source("gemm_transposed_both").replace("torch.matmul(A.T, B.T)", "torch.relu(torch.matmul(A.T, B.T)) @ B")
# source -> [(ops, shape, epilogue lines with a `v` vector operand or a scalar, layout fields set)] per region
REGIONS = {
    "splice_linear_groupnorm": [(["Linear", "sigmoid", "mul"], {"M": 70, "N": 88, "K": 40}, 1, {"b_trans": True})],
    "splice_two_linears": [(["Linear", "relu", "add"], {"M": 66, "N": 80, "K": 48}, 2, {"b_trans": True}),
                           (["Linear"], {"M": 66, "N": 72, "K": 80}, 0, {"b_trans": True})],
    "splice_residual": [(["matmul", "relu", "add"], {"M": 90, "N": 72, "K": 56}, 0, {})],
    "splice_inner_read": [(["Linear", "sigmoid"], {"M": 50, "N": 100, "K": 36}, 1, {"b_trans": True})],
    "gemm_triu_then_add": [(["matmul", "triu"], {"M": 64, "N": 64, "K": 64}, 0, {"tri": "upper"})],
    "bmm_softmax": [(["bmm", "mul"], {"M": 70, "N": 90, "K": 40, "batch": 3}, 0, {"batched": True})],
    "chained": [(["matmul", "relu"], {"M": 80, "N": 72, "K": 64}, 0, {"a_trans": True, "b_trans": True}),
                (["matmul"], {"M": 80, "N": 64, "K": 72}, 0, {})],
}
SOURCES = {**{n: _source(n) for n in REGIONS if n.startswith(("splice_", "gemm_"))},
           "bmm_softmax": BMM_SOFTMAX, "chained": CHAINED}
LAYOUT = {"a_trans": False, "b_trans": False, "batched": False, "tri": "", "tri_diag": 0, "split_k": 1}


def _graph(source: str):
    mod = rewrite._load_reference(source)
    model, inputs = rewrite._build(mod)
    return rewrite._trace(model, inputs), model


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_the_regions_found(name):
    gm, _ = _graph(SOURCES[name])
    found = gemmsplice.regions(gm)
    assert [(r.ops, r.match.shape) for r in found] == [(ops, shape) for ops, shape, _, _ in REGIONS[name]]
    for r, (ops, _, vectors, layout) in zip(found, REGIONS[name]):
        k = r.match.kernel
        assert k.vectors == vectors and len(r.vectors) == vectors
        assert {f: getattr(k, f) for f, d in LAYOUT.items() if getattr(k, f) != d and f != "tri_diag"} == layout
        computed = [ln for ln in k.epilogue.splitlines() if ln.startswith("e")]
        assert len(computed) == len([o for o in ops[1:] if o not in ("triu", "tril")])
        assert k.epilogue.splitlines()[-1].startswith("out = ") and r.match.kernel.dtype == "float32"


def test_an_inner_value_read_outside_ends_the_region():
    """The sigmoid is read by the row mean too: the fused kernel would never write it, so the region stops there
    and the scale after it stays a PyTorch op reading the region's output."""
    gm, _ = _graph(SOURCES["splice_inner_read"])
    (r,) = gemmsplice.regions(gm)
    assert r.output.target.__name__ == "sigmoid" and len(r.output.users) == 2
    whole = SOURCES["splice_inner_read"].replace(" + torch.mean(s, dim=1, keepdim=True)", "")
    (r,) = gemmsplice.regions(_graph(whole)[0])
    assert r.ops == ["Linear", "sigmoid", "mul"] and r.match.kernel.vectors == 2  # nothing else reads it


@pytest.mark.parametrize("source, ops", [
    (load_task("tiny/level2/conv2d_relu_bias").source, []),  # no product
    (load_task("tiny/level1/matrix_vector").source, []),  # N = 1: not a GEMM tile's work
    (_source("splice_residual").replace("torch.matmul(x, self.weight)",  # a cast is no epilogue op
                                        "torch.matmul(x, self.weight).to(torch.float16)"), [["matmul"]]),
])
def test_what_is_no_region_or_ends_one(source, ops):
    assert [r.ops for r in gemmsplice.regions(_graph(source)[0])] == ops


def test_the_spliced_forward_calls_one_kernel_per_region():
    gm, model = _graph(SOURCES["splice_two_linears"])
    spliced = gemmsplice.splice(gm)
    _, code = rewrite.render_graph(gm, model)
    assert [r["name"] for r in spliced.regions] == ["_kc_gemm0", "_kc_gemm1"]
    assert code.count("_kc_gemm0(") == 1 and code.count("_kc_gemm1(") == 1 and "logsumexp" in code
    assert "relu" not in code and "fc1" in code  # the epilogue is in the kernel; the weights are the model's
    for i in (0, 1):
        assert f"def _kc_g{i}_kernel(" in spliced.source and f"_KC_GEMM{i}_CONFIG" in spliced.source
    assert "def _kc_run(" not in spliced.source and "_kc_gemm_kernel" not in spliced.source


def _with_configs(tmp_path, source: str, a: rewrite.Analysis, pick: int, rules=()) -> str:
    """The tuned_gemm candidate with each region at its smallest (pick 0) or largest (-1) valid configuration,
    read from a tuned-configuration store as the recipe does."""
    store = tmp_path / f"tuned{pick}.json"
    for r in a.variant(rules)["gemm"]["regions"]:
        m = tunable.Match.from_json(r["match"])
        tunable.record_tuned(m.kernel, m.shape, tunable.all_configs(m.kernel, m.shape)[pick], ms=1.0, gpu="H100",
                             source="t", path=store)
    old = os.environ.get(tunable.TUNED_ENV)
    os.environ[tunable.TUNED_ENV] = str(store)
    try:
        return render.render(source, ["tuned_gemm", *(f"rewrite:{r}" for r in rules)], a)
    finally:
        os.environ.pop(tunable.TUNED_ENV) if old is None else os.environ.__setitem__(tunable.TUNED_ENV, old)


def test_the_spliced_candidates_are_correct_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    cases = []
    for name in sorted(REGIONS):
        source = SOURCES[name]
        a = rewrite.analyze(source)
        for pick in (0, -1):  # the smallest blocks (several tiles, masks) and the largest
            rules = a.rules if pick == -1 and a.rules and a.variant(a.rules).get("gemm") else ()
            p = tmp_path / f"{name}_{len(cases)}.py"
            p.write_text(_with_configs(tmp_path, source, a, pick, rules))
            cases.append((source, str(p)))
    assert triton_interpreter.wrong_candidates(cases, tmp_path, timeout=900) == []


def _ctx(task, device):
    return Context(task=task, device=device, round=1, k=4, history=[], failures=[], sample_exemplars=lambda: [],
                   rng=None)


def test_tuned_gemm_recipe_plumbing(tmp_path, monkeypatch):
    monkeypatch.setenv(tunable.TUNED_ENV, str(tmp_path / "tuned.json"))
    task = load_task(TASKS / "splice_two_linears.py")
    a = rewrite.analyze(task.source)
    pol = RecipesPolicy(analysis=a)
    gpu, cpu = _ctx(task, GPU), _ctx(task, CPU)
    assert "tuned_gemm" in pol.tokens(gpu) and "tuned_gemm" not in pol.tokens(cpu)
    assert pol.valid(frozenset(["tuned_gemm"]), gpu) and pol.valid(frozenset(["tuned_gemm", "cudagraph"]), gpu)
    assert pol.valid(frozenset(["tuned_gemm", "rewrite:inplace", "cudagraph"]), gpu)
    for other in ("compile:default", "compile:max-autotune-no-cudagraphs", "triton", "tuned", "bf16"):
        assert not pol.valid(frozenset(["tuned_gemm", other]), gpu), other
    regions = a.variant([])["gemm"]["regions"]
    m = tunable.Match.from_json(regions[1]["match"])
    mine = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 8, "num_stages": 2}
    tunable.record_tuned(m.kernel, m.shape, mine, ms=0.1, gpu="NVIDIA H100", source=task.name)
    src = pol.render(frozenset(["tuned_gemm", "cudagraph"]), gpu)
    assert f"_KC_GEMM1_CONFIG = {mine!r}".replace('"', "'") in src and "exact" in src
    assert "_KC_GEMM0_CONFIG = {" in src and "class ModelNew(Model)" in src and "_KcCudaGraph(self._kc_inner)" in src
    from kernelcraft.judge.caller.screen import screen
    assert screen(src, "open").findings == []
    assert screen(pol.render(frozenset(["tuned_gemm", "rewrite:inplace"]), gpu), "open").findings == []
    whole = load_task("tiny/level2/linear_gelu_scale")  # one template already: the `tuned` token's
    wa = rewrite.analyze(whole.source)
    assert wa.variant([])["gemm"] and "tuned_gemm" not in RecipesPolicy(analysis=wa).tokens(_ctx(whole, GPU))
    conv = load_task("tiny/level2/conv2d_relu_bias")
    assert "tuned_gemm" not in RecipesPolicy(analysis=rewrite.analyze(conv.source)).tokens(_ctx(conv, GPU))
    with pytest.raises(ValueError, match="do not compose"):
        render.render(task.source, ["tuned_gemm", "triton"], a)
