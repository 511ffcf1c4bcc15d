"""GPU-only recipes (CUDA graphs, Triton fusion, reduce-overhead, cudnn benchmark) produce correct
candidates on a GPU task, and the recipes search wins on GPU tasks. Run on a CUDA machine:
`pytest -m gpu tests/test_recipes_gpu.py`."""
from __future__ import annotations

import pytest

from kernelcraft.search.recipes import render, rewrite
from kernelcraft.evaluate import evaluate
from kernelcraft.search.optimize import Options, optimize
from kernelcraft.task import load_task

pytestmark = pytest.mark.gpu

CONV = "gpu/level2/conv2d_relu_bias"


@pytest.fixture(scope="module")
def conv():
    task = load_task(CONV)
    return task, rewrite.analyze(task.source)


@pytest.mark.parametrize("recipe", [
    ["cudagraph"],
    ["triton"],
    ["triton", "cudagraph"],
    ["rewrite:inplace", "cudagraph", "cudnn_benchmark"],
    ["channels_last", "cudnn_benchmark"],
    pytest.param(["compile:default"], marks=pytest.mark.slow),  # an inductor compile each: tens of seconds
    pytest.param(["compile:reduce-overhead"], marks=pytest.mark.slow),
    pytest.param(["compile:default", "cudagraph"], marks=pytest.mark.slow),  # compiled, then captured as one graph
], ids=lambda r: "+".join(r))
def test_gpu_recipe_is_correct(conv, recipe, cache_dir):
    task, a = conv
    src = render.render(task.source, recipe, a, output_dtypes=a.features.get("output_dtypes"))
    v = evaluate(task, src, device="cuda", time_budget_s=0.5)  # plumbing: correct and timed, not how fast
    assert v.status == "correct", (recipe, v.reasons, v.message)
    assert v.speedup and v.speedup > 0


def test_simplification_rules_on_gpu(cache_dir):
    """Every simplification rule at once (tests/fixtures/tasks/simplify_chain.py), eager and CUDA-graph replayed."""
    from conftest import FIXTURES
    task = load_task(FIXTURES / "tasks" / "simplify_chain.py")
    a = rewrite.analyze(task.source)
    largest = max((k for k in a.variants if k), key=lambda k: len(k.split("+")))  # every rule that renders together
    rules = [f"rewrite:{r}" for r in largest.split("+")]
    assert {"rewrite:size1_reduce", "rewrite:sink_pointwise", "rewrite:reduce_linear"} <= set(rules)
    for recipe in (rules, rules + ["cudagraph"]):
        src = render.render(task.source, recipe, a)
        v = evaluate(task, src, device="cuda", time_budget_s=0.5, remeasure_above=None)
        assert v.status == "correct", (recipe, v.reasons, v.message)


def test_triton_fusion_on_an_elementwise_chain(cache_dir):
    task = load_task("gpu/level2/elementwise_chain")
    a = rewrite.analyze(task.source)
    src = render.render(task.source, ["triton"], a)
    v = evaluate(task, src, device="cuda", time_budget_s=1.0, remeasure_above=None)
    assert v.status == "correct", v.message
    assert v.speedup > 1.5  # four memory-bound passes fused into one


@pytest.mark.slow  # a whole search (compile recipes among its candidates): minutes
def test_recipes_find_the_diag_rewrite_on_gpu(tmp_path, cache_dir):
    res = optimize("gpu/level1/diag_matmul", tmp_path, Options(device="cuda", budget=6, confirm=1))
    assert res.status == "improved" and res.best_speedup >= 5.0, res


@pytest.mark.slow
def test_recipes_win_on_a_conv_task_on_gpu(tmp_path, cache_dir):
    res = optimize(CONV, tmp_path, Options(device="cuda", budget=8, confirm=1))
    assert res.status == "improved" and res.best_speedup > 1.0, res


def test_triton_fusion_of_a_loss_into_one_reduction(cache_dir):
    """An elementwise chain ending in a full mean (tests/fixtures/tasks/loss_hinge.py) becomes one Triton kernel
    writing partial sums (tritonfuse's reduction epilogue): correct on the GPU, eager and CUDA-graph replayed."""
    from conftest import FIXTURES
    task = load_task(FIXTURES / "tasks" / "loss_hinge.py")
    a = rewrite.analyze(task.source)
    for recipe in (["triton"], ["triton", "cudagraph"]):
        src = render.render(task.source, recipe, a)
        assert "partials" in src, src
        v = evaluate(task, src, device="cuda", time_budget_s=1.0, remeasure_above=None)
        assert v.status == "correct", (recipe, v.reasons, v.message)


@pytest.mark.parametrize("name,kernel", [("sum_reduction", "_kc_dimreduce_kernel"),
                                         ("mean_reduction", "_kc_dimreduce_kernel"),
                                         ("max_reduction", "_kc_dimreduce_kernel"),
                                         ("argmax_reduction", "_kc_dimreduce_kernel"),
                                         ("maxpool2d", "_kc_pool_kernel"), ("avgpool2d", "_kc_pool_kernel"),
                                         ("depthwise_conv2d", "_kc_dwconv_kernel")])
def test_reductions_and_poolings_as_triton_kernels(name, kernel, cache_dir):
    """A reduction over one dimension (dimreduce), a pooling (pooling) or a depthwise convolution (depthwise), the
    built-in level-1 tasks, lowered under the `triton` recipe: correct on the GPU."""
    task = load_task(f"gpu/level1/{name}")
    a = rewrite.analyze(task.source)
    src = render.render(task.source, ["triton"], a)
    assert kernel in src, src
    v = evaluate(task, src, device="cuda", time_budget_s=0.5, remeasure_above=None)
    assert v.status == "correct", (name, v.reasons, v.message)


@pytest.mark.parametrize("name", ["attention_causal.py", "attention_mha.py"])
def test_attention_as_one_kernel_on_gpu(name, cache_dir):
    """The `attention` rule's candidates on the GPU: correct alone and replayed from a CUDA graph (the causal mask
    is recognised before the capture, so the graph holds no synchronisation)."""
    from conftest import FIXTURES
    task = load_task(FIXTURES / "tasks" / name)
    a = rewrite.analyze(task.source)
    assert "attention" in a.rules, a.rules
    for recipe in (["rewrite:attention"], ["rewrite:attention", "cudagraph"]):
        src = render.render(task.source, recipe, a)
        v = evaluate(task, src, device="cuda", time_budget_s=0.5, remeasure_above=None)
        assert v.status == "correct", (name, recipe, v.reasons, v.message)


def test_the_fused_attention_kernels_match_the_written_out_attention():
    """The helper on CUDA tensors: the causal path (is_causal) and the general mask path against the written-out
    computation in float64, at a length where the fused kernels tile."""
    import torch
    from kernelcraft.search.recipes import attention
    ns = {"torch": torch}
    exec(attention.HELPER, ns)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda") for _ in range(3))
    causal = torch.tril(torch.ones(1, 1, 512, 512, device="cuda"))
    general = (torch.rand(1, 1, 300, 300, device="cuda") > 0.5) & ~torch.eye(300, dtype=torch.bool, device="cuda")
    for masked_out, fixed, key in ((causal[:, :, :300, :300] == 0, True, (causal, 300)), (general, False, ())):
        got = ns["_kc_attention"](q, k, v, 0.125, masked_out, fixed, *key)
        s = (q.double() @ k.double().transpose(-2, -1)) * 0.125
        want = torch.softmax(s.masked_fill(masked_out, float("-inf")), -1) @ v.double()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    assert [c for c, _ in ns["_kc_attention_causal"].values()] == [True]
