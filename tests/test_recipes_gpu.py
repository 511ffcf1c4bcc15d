"""GPU-only recipes (CUDA graphs, Triton fusion, reduce-overhead, cudnn benchmark) produce correct
candidates on a GPU task, and the recipes search wins on GPU tasks. Run on a CUDA machine:
`pytest -m gpu tests/test_recipes_gpu.py`."""
from __future__ import annotations

import pytest

from kernelcraft import rewrite, wrappers
from kernelcraft.evaluate import evaluate
from kernelcraft.optimize import Options, optimize
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
    ["compile:default"],
    ["compile:reduce-overhead"],
], ids=lambda r: "+".join(r))
def test_gpu_recipe_is_correct(conv, recipe, cache_dir):
    task, a = conv
    src = wrappers.render(task.source, recipe, a, output_dtypes=a.features.get("output_dtypes"))
    v = evaluate(task, src, device="cuda", time_budget_s=1.0)
    assert v.status == "correct", (recipe, v.reasons, v.message)
    assert v.speedup and v.speedup > 0


def test_triton_fusion_on_an_elementwise_chain(cache_dir):
    task = load_task("gpu/level2/elementwise_chain")
    a = rewrite.analyze(task.source)
    src = wrappers.render(task.source, ["triton"], a)
    v = evaluate(task, src, device="cuda", time_budget_s=1.0, remeasure_above=None)
    assert v.status == "correct", v.message
    assert v.speedup > 1.5  # four memory-bound passes fused into one


def test_recipes_find_the_diag_rewrite_on_gpu(tmp_path, cache_dir):
    res = optimize("gpu/level1/diag_matmul", tmp_path, Options(device="cuda", budget=6, confirm=1))
    assert res.status == "improved" and res.best_speedup >= 5.0, res


def test_recipes_win_on_a_conv_task_on_gpu(tmp_path, cache_dir):
    res = optimize(CONV, tmp_path, Options(device="cuda", budget=8, confirm=1))
    assert res.status == "improved" and res.best_speedup > 1.0, res
