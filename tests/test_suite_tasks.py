"""The built-in task suite: every task loads, runs on CPU at the tiny tier and is non-degenerate;
the GPU tier is structurally sound and sized for an H100 (checked on the meta device, nothing allocated)."""
from __future__ import annotations

import ast
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from kernelcraft.task import LEVELS, builtin_names, load_task, tiny_overrides

TINY = builtin_names("tiny")
GPU = builtin_names("gpu")
GIB = 2 ** 30


def _namespace(task) -> dict:
    ns: dict = {}
    exec(compile(task.source, task.name, "exec"), ns)
    return ns


def _build(ns: dict, model_seed: int = 0):
    torch.manual_seed(model_seed)
    return ns["Model"](*ns["get_init_inputs"]())


def _inputs(ns: dict, seed: int):
    torch.manual_seed(seed)
    inputs = ns["get_inputs"]()
    assert isinstance(inputs, list)
    return inputs


def _forward(model, inputs):
    with torch.no_grad():
        return model(*inputs)


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    assert isinstance(out, tuple) and out, f"output must be a tensor or a tuple of tensors, got {type(out)}"
    assert all(isinstance(t, torch.Tensor) for t in out)
    return list(out)


def _same(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.allclose(x.double(), y.double(), rtol=1e-5, atol=1e-6) for x, y in zip(ta, tb))


def _nbytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


def _constants(source: str) -> dict[str, object]:
    out = {}
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return out


# ---------------------------------------------------------------------------------------------- suite


def test_suite_shape():
    assert len(GPU) >= 40
    assert [n.replace("tiny/", "gpu/", 1) for n in TINY] == GPU
    for lv, minimum in zip(LEVELS, (18, 14, 8)):
        assert len(builtin_names("gpu", level=int(lv[-1]))) >= minimum, lv
    assert "gpu/level1/diag_matmul" in GPU
    task = load_task("level1/diag_matmul")
    assert task.name == "gpu/level1/diag_matmul" and task.level == 1 and task.tier == "gpu"
    assert "torch.diag(A) @ B" in task.source
    stems = [n.rsplit("/", 1)[-1] for n in GPU]
    assert len(stems) == len(set(stems)), "task names must be unique across levels"


# ---------------------------------------------------------------------------------------------- tiny tier


@pytest.mark.parametrize("name", TINY)
def test_tiny_task_runs_and_is_non_degenerate(name):
    task = load_task(name)
    assert task.tier == "tiny"
    ns = _namespace(task)
    model = _build(ns)
    assert isinstance(model, torch.nn.Module)
    inputs = _inputs(ns, seed=0)
    assert all(not isinstance(i, torch.Tensor) or i.device.type == "cpu" for i in inputs)

    out = _forward(model, inputs)  # warm-up (one-time library initialisation)
    t0 = time.perf_counter()
    again = _forward(model, _inputs(ns, seed=0))
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, f"tiny forward took {elapsed:.3f} s"
    assert _same(out, again), "same seed, different output: forward is not deterministic"

    for t in _tensors(out):
        assert t.numel() > 0
        if t.is_floating_point():
            assert torch.isfinite(t).all(), "non-finite output"
        td = t.double()
        if t.numel() > 1:
            assert td.std() > 1e-6 * (td.mean().abs() + 1), "output is constant"
        assert td.abs().max() > 1e-4, "output is (near) zero"

    other = _forward(model, _inputs(ns, seed=1))
    assert not _same(out, other), "output does not depend on the inputs"

    if any(True for _ in model.parameters()):
        reweighted = _forward(_build(ns, model_seed=1), inputs)
        assert not _same(out, reweighted), "output does not depend on the weights"


# ---------------------------------------------------------------------------------------------- GPU tier


@pytest.mark.parametrize("name", GPU)
def test_gpu_tier_is_sized_for_a_gpu(name):
    task = load_task(name)
    tiny = load_task(name.replace("gpu/", "tiny/", 1))
    assert task.tier == "gpu" and task.source != tiny.source
    assert task.source.startswith("# tiny:"), "the tiny directive must be the first line"

    # the source is self-contained: torch only
    tree = ast.parse(task.source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] == "torch" for a in node.names), ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] in ("torch", "__future__"), ast.unparse(node)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
    assert classes and ast.get_docstring(classes[0]), "Model needs a one-line docstring"

    overrides = tiny_overrides(task.source)
    assert overrides
    gpu_consts = _constants(task.source)
    for key, text in overrides.items():
        value = ast.literal_eval(text)
        assert gpu_consts[key] >= value, f"{key}: gpu {gpu_consts[key]} < tiny {value}"

    # shapes, memory and a roofline time estimate on the meta device (nothing is allocated or computed)
    ns = _namespace(task)
    with torch.device("meta"):
        model = ns["Model"](*ns["get_init_inputs"]())
        inputs = ns["get_inputs"]()
        with FlopCounterMode(display=False) as counter:
            out = _forward(model, inputs)
    _tensors(out)
    nbytes = _nbytes(inputs) + _nbytes(out) + sum(_nbytes(p) for p in model.parameters())
    assert nbytes < 1.5 * GIB, f"inputs + outputs + weights = {nbytes / GIB:.2f} GiB"
    half = any(isinstance(i, torch.Tensor) and i.dtype == torch.float16 for i in inputs)
    flop_rate = 400e12 if half else 25e12  # tensor-core fp16 vs. effective fp32
    est_ms = max(counter.get_total_flops() / flop_rate, nbytes / 3e12) * 1e3
    assert 0.08 <= est_ms <= 10, f"estimated {est_ms:.3f} ms on an H100"
