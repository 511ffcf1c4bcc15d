"""The simplification rules (`search/recipes/simplify.py`, `reductions.py`, `activations.py`, `reduce_linear`
on x @ W.T): each one fires on the pattern it is for, leaves the near misses alone, and the rewritten graph
computes the reference's values (run here on real CPU tensors); the whole pipeline on a level-2-style
fixture, rendered and judged."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kernelcraft.search.recipes import render as wrappers
from kernelcraft.search.recipes import rewrite
from kernelcraft.task import load_task

from conftest import FIXTURES

CHAIN = FIXTURES / "tasks" / "simplify_chain.py"


def _prop(gm, inputs):
    from torch.fx.passes.shape_prop import ShapeProp
    gm.recompile()
    ShapeProp(gm).propagate(*inputs)


def _apply(model, inputs, rules):
    gm = rewrite.symbolic_trace(model)
    _prop(gm, inputs)
    changed = []
    for r in rules:
        changed.append(rewrite.RULES[r](gm))
        gm.graph.lint()
        _prop(gm, inputs)
    return gm, changed


def _check(model, inputs, rule, applies=True):
    """Apply one rule; it must (not) change the graph, and the result must match the reference. Returns the
    rewritten graph's operations and source."""
    gm, changed = _apply(model, inputs, [rule])
    assert changed == [applies], (rule, gm.code)
    with torch.no_grad():
        torch.manual_seed(1)
        want = model(*inputs)
        torch.manual_seed(1)
        got = gm(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
    rewrite.render_graph(gm, model)  # renderable: every name it uses can be bound in generated source
    return _ops(gm), gm.code


def _ops(gm) -> list[str]:
    """The graph's operations in order: module class names, function and method names."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            out.append(type(gm.get_submodule(n.target)).__name__)
        elif n.op in ("call_function", "call_method"):
            out.append(n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target)))
    return out


def _analysed(task_file: str, rules: set):
    """A task fixture and the recipes' analysis of it, which must trace and find at least `rules`."""
    task = load_task(FIXTURES / "tasks" / task_file)
    a = rewrite.analyze(task.source)
    assert a.traced, a.error
    assert rules <= set(a.rules), a.rules
    return task, a


def _every_variant_is_the_reference(task, a) -> int:
    """Every rendered rewrite variant of the analysis computes the reference's values; how many there were."""
    from test_recipes import _same_as_reference
    checked = 0
    for key in a.variants:
        rules = [r for r in key.split("+") if r]
        if rules:
            assert _same_as_reference(task, wrappers.render(task.source, [f"rewrite:{r}" for r in rules], a)), key
            checked += 1
    return checked


class Lambda(nn.Module):
    def __init__(self, fn, *mods, **params):
        super().__init__()
        self.fn = fn
        self.mods = nn.ModuleList(mods)
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v))

    def forward(self, x):
        return self.fn(self, x)


def _m(fn, *mods, **params):
    return Lambda(fn, *mods, **params)


X = torch.randn(8, 16, 6, 6)
V = torch.randn(32, 40)


# ---- identities --------------------------------------------------------------------------------------

def test_identities_fire():
    ops, code = _check(_m(lambda s, x: torch.tanh(x * 1.0 + 0) / 1), [X], "identities")
    assert ops == ["tanh"]
    ops, _ = _check(_m(lambda s, x: torch.sin(x) - 0.0), [X], "identities")
    assert ops == ["sin"]
    ops, _ = _check(_m(lambda s, x: s.mods[0](torch.relu(x)) * 2, nn.Dropout(p=0.0)), [X], "identities")
    assert ops == ["relu", "mul"]
    ops, _ = _check(_m(lambda s, x: torch.sin(x).transpose(1, 2).transpose(2, 1) + 1), [X], "identities")
    assert ops == ["sin", "add"]
    ops, _ = _check(_m(lambda s, x: torch.sin(x).permute(0, 2, 3, 1).permute(0, 3, 1, 2) * 3), [X], "identities")
    assert ops == ["sin", "mul"]
    ops, _ = _check(_m(lambda s, x: torch.sin(x).T.T * 2), [V], "identities")
    assert ops == ["sin", "mul"]
    ops, _ = _check(_m(lambda s, x: (lambda y: y * 0.5 + y.clone().detach())(torch.sin(x))), [X], "identities")
    assert "clone" not in ops
    ops, code = _check(_m(lambda s, x: (lambda y: y + y)(torch.sin(x))), [X], "identities")
    assert ops == ["sin", "mul"] and "2.0" in code


def test_identities_near_misses():
    _check(_m(lambda s, x: x * 1.5 + 0.25), [X], "identities", applies=False)
    _check(_m(lambda s, x: s.mods[0](x), nn.Dropout(p=0.2)), [X], "identities", applies=False)  # random: kept
    _check(_m(lambda s, x: torch.sin(x).transpose(1, 2).transpose(1, 3)), [X], "identities", applies=False)
    _check(_m(lambda s, x: torch.sin(x).clone()), [X], "identities", applies=False)  # the copy is returned
    _check(_m(lambda s, x: (lambda y: y.clone().add_(1.0) + y)(torch.sin(x))), [X], "identities",
           applies=False)  # something is mutated: a copy may be what keeps the original intact
    gm, changed = _apply(_m(lambda s, x: x * 1.0), [X], ["identities"])  # would return the caller's own input
    assert changed == [False]


# ---- clamp chains --------------------------------------------------------------------------------------

def test_clamp_chain_merges_and_drops():
    ops, code = _check(_m(lambda s, x: torch.clamp(torch.clamp(x + s.b, 0.0, 1.0) * 2.0, min=0.0, max=1.0) / 2.0,
                          b=torch.randn(16, 1, 1)), [X], "clamp_chain")
    assert ops == ["add", "clamp"] and "max = 0.5" in code  # clamp, *2, clamp, /2 is clamp(0, 0.5)
    ops, _ = _check(_m(lambda s, x: torch.clamp(torch.tanh(x / 2.0), -1.0, 1.0) * 3), [X], "clamp_chain")
    assert ops == ["truediv", "tanh", "mul"]  # tanh is already in [-1, 1]
    ops, _ = _check(_m(lambda s, x: F.relu(torch.relu(x * 3.0))), [X], "clamp_chain")
    assert ops == ["mul", "relu"]
    ops, _ = _check(_m(lambda s, x: s.mods[0](torch.sigmoid(x)), nn.ReLU()), [X], "clamp_chain")
    assert ops == ["sigmoid"]
    ops, _ = _check(_m(lambda s, x: F.hardtanh(torch.clamp(x, min=-0.5) * -2.0, -3.0, 0.5)), [X], "clamp_chain")
    assert ops == ["mul", "clamp"]  # a negative scale swaps the bounds
    ops, _ = _check(_m(lambda s, x: s.mods[0](torch.relu(x) - 1.0), nn.Hardtanh(-2.0, 2.0)), [X], "clamp_chain")
    assert ops == ["add", "clamp"]
    ops, _ = _check(_m(lambda s, x: (lambda r: torch.relu(r) + r)(torch.relu(x))), [X], "clamp_chain")
    assert ops == ["relu", "add"]  # relu of a relu's output is that output


def test_clamp_chain_near_misses():
    _check(_m(lambda s, x: torch.clamp(x, 0.0, 1.0) * 2.0), [X], "clamp_chain", applies=False)  # nothing to save
    _check(_m(lambda s, x: torch.clamp(torch.clamp(x, 0.0, 1.0) + 5.0, 0.0, 1.0)), [X], "clamp_chain",
           applies=False)  # disjoint: a constant, left alone
    _check(_m(lambda s, x: torch.clamp(torch.tanh(x), -0.5, 0.5)), [X], "clamp_chain", applies=False)
    _check(_m(lambda s, x: (lambda r: torch.clamp(r, max=0.5) + r)(torch.relu(x))), [X], "clamp_chain",
           applies=False)  # the inner relu has another user and its range does not make the clamp redundant
    _check(_m(lambda s, x: torch.clamp(torch.sigmoid(x) * 1.0000001, max=1.0)), [X], "clamp_chain",
           applies=False)  # may exceed 1 after rounding: the bound stays


# ---- reductions over size-1 dims ---------------------------------------------------------------------------

def test_size1_reductions_are_the_input():
    def chain(s, x):
        y = torch.sum(torch.sin(x), dim=1, keepdim=True)
        y = torch.max(y, dim=1, keepdim=True)[0]
        y = torch.mean(y, dim=1, keepdim=True)
        y = torch.logsumexp(y, dim=1, keepdim=True)
        return torch.logsumexp(y, dim=1, keepdim=True).amax(dim=(1,), keepdim=True)
    ops, _ = _check(_m(chain), [V], "size1_reduce")
    assert ops == ["sin", "sum"]
    ops, _ = _check(_m(lambda s, x: torch.mean(torch.sin(x).mean(dim=[2, 3], keepdim=True), dim=[2, 3])), [X],
                    "size1_reduce")
    assert ops == ["sin", "mean", "squeeze"]
    ops, _ = _check(_m(lambda s, x: torch.min(torch.sin(x).sum(1, keepdim=True), dim=1).values), [X], "size1_reduce")
    assert ops == ["sin", "sum", "squeeze"]


def test_size1_reduction_near_misses():
    _check(_m(lambda s, x: torch.logsumexp(torch.sin(x), dim=1, keepdim=True)), [X], "size1_reduce", applies=False)
    _check(_m(lambda s, x: torch.max(torch.sin(x).sum(1, keepdim=True), dim=1)[1].float()), [X], "size1_reduce",
           applies=False)  # the indices are read
    gm, changed = _apply(_m(lambda s, x: torch.sum(x, dim=1, keepdim=True)), [torch.randn(4, 1, 3)], ["size1_reduce"])
    assert changed == [False]  # would return the caller's input itself


# ---- consecutive pools merged ------------------------------------------------------------------------------

X3 = torch.randn(2, 3, 13, 14, 12)  # sizes that pools do not divide: the floor of the floor must match


def test_pool_merge():
    ops, code = _check(_m(lambda s, x: s.mods[1](s.mods[0](torch.sin(x))), nn.MaxPool3d(2), nn.MaxPool3d(3)), [X3],
                       "pool_merge")
    assert ops == ["sin", "max_pool3d"] and "(6, 6, 6)" in code
    ops, _ = _check(_m(lambda s, x: s.mods[1](s.mods[0](torch.sin(x))), nn.AvgPool3d(2), nn.AvgPool3d(2)), [X3],
                    "pool_merge")
    assert ops == ["sin", "avg_pool3d"]
    ops, code = _check(_m(lambda s, x: F.max_pool2d(F.max_pool2d(F.max_pool2d(torch.sin(x), 2), (1, 2)), 3)),
                       [torch.randn(2, 3, 37, 41)], "pool_merge")
    assert ops == ["sin", "max_pool2d"] and "(6, 12)" in code  # three in a row: one pool
    ops, _ = _check(_m(lambda s, x: F.avg_pool1d(F.avg_pool1d(torch.sin(x), 2, stride=2), kernel_size=3)),
                    [torch.randn(4, 5, 50)], "pool_merge")
    assert ops == ["sin", "avg_pool1d"]


def test_pool_merge_near_misses():
    pair = lambda a, b: _m(lambda s, x: s.mods[1](s.mods[0](torch.sin(x))), a, b)  # noqa: E731
    _check(pair(nn.MaxPool3d(2), nn.AvgPool3d(2)), [X3], "pool_merge", applies=False)  # a max and an average
    _check(pair(nn.MaxPool3d(3, stride=2), nn.MaxPool3d(2)), [X3], "pool_merge", applies=False)  # windows overlap
    _check(pair(nn.AvgPool3d(2), nn.AvgPool3d(2, padding=1)), [X3], "pool_merge", applies=False)  # padded
    _check(pair(nn.MaxPool3d(2, ceil_mode=True), nn.MaxPool3d(2)), [X3], "pool_merge", applies=False)
    _check(pair(nn.MaxPool3d(2, dilation=2), nn.MaxPool3d(2)), [X3], "pool_merge", applies=False)
    _check(pair(nn.AvgPool3d(2, divisor_override=3), nn.AvgPool3d(2)), [X3], "pool_merge", applies=False)
    _check(_m(lambda s, x: (lambda y: F.max_pool2d(y, 2) + F.max_pool2d(y, 2).mean())(F.max_pool2d(torch.sin(x), 2)),),
           [torch.randn(2, 3, 16, 16)], "pool_merge", applies=False)  # the inner pool is read twice
    _check(_m(lambda s, x: F.max_pool1d(F.max_pool2d(torch.sin(x), 2), 2)), [torch.randn(3, 8, 8)], "pool_merge",
           applies=False)  # different ranks (a 2-D pool of an unbatched image, then a 1-D pool of its rows)


def test_pool_merge_after_a_sink():
    """A monotone activation between two max pools sinks past the second; the pools then merge."""
    model = _m(lambda s, x: F.max_pool2d(torch.relu(F.max_pool2d(torch.sin(x), 2)), 2))
    x = torch.randn(2, 3, 18, 18)
    gm, changed = _apply(model, [x], ["sink_pointwise", "pool_merge"])
    assert changed == [True, True] and _ops(gm) == ["sin", "max_pool2d", "relu"]
    torch.testing.assert_close(gm(x), model(x))


def test_pool_merge_pipeline_renders_correct_source():
    task, a = _analysed("pool_chain.py", {"sink_pointwise", "pool_merge"})
    code = a.variant(["sink_pointwise", "pool_merge"])["code"]
    assert code.count("max_pool2d(") == 1 and code.count("avg_pool2d(") == 1 and "pool1" not in code, code
    _every_variant_is_the_reference(task, a)


# ---- average pools over a linear map's outputs ----------------------------------------------------------------

def test_pool_linear():
    lin = nn.Linear(32, 64)
    ops, code = _check(_m(lambda s, x: s.mods[0](s.mods[1](x).unsqueeze(1)).squeeze(1), nn.AvgPool1d(4), lin),
                       [V[:, :32]], "pool_linear")  # KernelBench's form: pool(linear(x).unsqueeze(1)).squeeze(1)
    assert "Linear" not in ops and "avg_pool1d" not in ops and {"unflatten", "mean", "matmul"} <= set(ops)
    ops, _ = _check(_m(lambda s, x: F.avg_pool1d(s.mods[0](x), 3, stride=3), nn.Linear(32, 66)),
                    [torch.randn(4, 5, 32)], "pool_linear")  # a 3-D input; 66 / 3 pools all features
    assert "Linear" not in ops
    ops, _ = _check(_m(lambda s, x: F.avg_pool1d(s.mods[0](x).unsqueeze(0), 4).squeeze(0), nn.Linear(32, 70)),
                    [V[:, :32]], "pool_linear")  # floor mode: the last 70 % 4 = 2 features are dropped, as in the pool
    ops, _ = _check(_m(lambda s, x: F.avg_pool1d((x @ s.w.T).unsqueeze(1), 8).squeeze(1), w=torch.randn(64, 40)),
                    [V], "pool_linear")  # x @ W.T with a parameter W [out, in]
    assert "avg_pool1d" not in ops and "getattr" not in ops, ops  # the reference's W.T is gone with its matmul
    _check(_m(lambda s, x: F.avg_pool1d((x @ s.w).unsqueeze(1), 8).squeeze(1), w=torch.randn(40, 64)), [V],
           "pool_linear")  # x @ W, W [in, out]


def test_pool_linear_near_misses():
    pooled = lambda pool: _m(lambda s, x: pool(s.mods[0](x).unsqueeze(1)).squeeze(1), nn.Linear(40, 64))  # noqa: E731
    _check(pooled(lambda y: F.avg_pool1d(y, 4, stride=2)), [V], "pool_linear", applies=False)  # windows overlap
    _check(pooled(lambda y: F.avg_pool1d(y, 4, padding=1)), [V], "pool_linear", applies=False)
    _check(pooled(lambda y: F.avg_pool1d(y, 4, ceil_mode=True)), [V], "pool_linear", applies=False)
    _check(pooled(lambda y: F.max_pool1d(y, 4)), [V], "pool_linear", applies=False)  # a max is not affine
    _check(_m(lambda s, x: (lambda y: F.avg_pool1d(y.unsqueeze(1), 4).squeeze(1) + y.mean())(s.mods[0](x)),
              nn.Linear(40, 64)), [V], "pool_linear", applies=False)  # the outputs are read again
    _check(_m(lambda s, x: F.avg_pool1d(s.mods[0](x).unsqueeze(-1), 1).squeeze(-1), nn.Linear(40, 64)), [V],
           "pool_linear", applies=False)  # the pool runs along a new size-1 dim, not the features
    _check(_m(lambda s, x: F.avg_pool1d(torch.sin(x).unsqueeze(1), 4).squeeze(1)), [V], "pool_linear", applies=False)


def test_pool_linear_pipeline_renders_correct_source():
    task, a = _analysed("linear_avgpool.py", {"pool_linear"})
    code = a.variant(["pool_linear"])["code"]
    assert "unflatten(" in code and "matmul(" in code and "self.avg_pool(" not in code, code
    from kernelcraft.search.recipes.policy import RecipesPolicy
    from test_recipes import BASELINES_MEASURED, GPU, _ctx
    first = [tuple(p.meta["recipe"]) for p in
             RecipesPolicy(analysis=a).propose(_ctx(task, GPU, BASELINES_MEASURED, k=2))]
    # after the baselines (CUDA graphs at 0.9x alone, so not in the composite), budget 4: the composite, the rule alone
    assert first == [("compile:default", "rewrite:pool_linear", "rewrite:sink_pointwise"), ("rewrite:pool_linear",)]
    _every_variant_is_the_reference(task, a)


# ---- a convolution's global sum or mean -------------------------------------------------------------------------

def test_conv_reduce_helper_matches_pytorch_convolutions():
    """The helper against PyTorch's own convolutions in float64, over random strides, paddings, dilations, output
    paddings, kernel and input sizes, 1-3 spatial dims, with and without a bias."""
    import random

    from kernelcraft.search.recipes.convreduce import _helper
    rng, ran = random.Random(0), 0
    for _ in range(120):
        nd, transposed = rng.choice([1, 2, 3]), rng.random() < 0.5
        k, s, d, p = rng.choice([1, 2, 3, 5]), rng.choice([1, 2, 3]), rng.choice([1, 2]), rng.choice([0, 1, 2])
        kw = dict(stride=s, padding=p, dilation=d, bias=rng.random() < 0.7)
        if transposed:
            kw["output_padding"] = rng.randrange(0, max(s, d))
        size = rng.randrange(d * (k - 1) + 1, 10 if nd == 3 else 18)
        conv = getattr(nn, ("ConvTranspose" if transposed else "Conv") + f"{nd}d")(3, 4, k, **kw).double()
        x = torch.randn(2, 3, *([size] * nd), dtype=torch.float64)
        try:
            y = conv(x)
        except RuntimeError:
            continue  # a configuration PyTorch refuses (an empty output)
        ran += 1
        got = _helper()(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation,
                        getattr(conv, "output_padding", (0,) * nd), transposed, True, False)
        torch.testing.assert_close(got, y.mean(dim=list(range(2, 2 + nd))), rtol=1e-9, atol=1e-9)
    assert ran > 100


def test_conv_reduce():
    x = torch.randn(2, 3, 17, 15)
    ops, code = _check(_m(lambda s, x: s.mods[0](x).mean(dim=[2, 3], keepdim=True),
                          nn.ConvTranspose2d(3, 8, 3, stride=2, padding=1, output_padding=1)), [x], "conv_reduce")
    assert ops == ["_kc_conv_reduce"], ops
    ops, _ = _check(_m(lambda s, x: s.mods[1](s.mods[0](x)), nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1)),
                    [x], "conv_reduce")
    assert ops == ["_kc_conv_reduce"]
    ops, _ = _check(_m(lambda s, x: torch.sum(s.mods[0](x), dim=(-1,)), nn.Conv1d(3, 5, 4, stride=3)),
                    [torch.randn(4, 3, 50)], "conv_reduce")
    ops, _ = _check(_m(lambda s, x: F.adaptive_avg_pool3d(s.mods[0](x), (1, 1, 1)).flatten(1),
                       nn.Conv3d(3, 4, 3, dilation=2, bias=False)), [torch.randn(2, 3, 9, 8, 7)], "conv_reduce")
    assert "Conv3d" not in ops


def test_conv_reduce_near_misses():
    x = torch.randn(2, 4, 12, 12)
    _check(_m(lambda s, x: s.mods[0](x).mean(dim=[2, 3]), nn.Conv2d(4, 8, 3, groups=2)), [x], "conv_reduce",
           applies=False)  # grouped
    _check(_m(lambda s, x: s.mods[0](x).mean(dim=[2, 3]), nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect")),
           [x], "conv_reduce", applies=False)
    _check(_m(lambda s, x: s.mods[0](x).mean(dim=2), nn.Conv2d(4, 8, 3)), [x], "conv_reduce", applies=False)  # one dim
    _check(_m(lambda s, x: s.mods[0](x).mean(dim=[1, 2, 3]), nn.Conv2d(4, 8, 3)), [x], "conv_reduce", applies=False)
    _check(_m(lambda s, x: (lambda y: y.mean(dim=[2, 3]) + y.amax())(s.mods[0](x)), nn.Conv2d(4, 8, 3)), [x],
           "conv_reduce", applies=False)  # the convolution's output is read again
    _check(_m(lambda s, x: torch.relu(s.mods[0](x)).mean(dim=[2, 3]), nn.Conv2d(4, 8, 3)), [x], "conv_reduce",
           applies=False)  # not linear
    _check(_m(lambda s, x: F.adaptive_avg_pool2d(s.mods[0](x), 2), nn.Conv2d(4, 8, 3)), [x], "conv_reduce",
           applies=False)  # not global


def test_conv_reduce_pipeline_renders_correct_source():
    task, a = _analysed("convtranspose_global_mean.py", {"size1_reduce", "sink_pointwise", "conv_reduce"})
    code = a.variant(["size1_reduce", "sink_pointwise", "conv_reduce"])["code"]
    assert "conv_transpose(" not in code and "_kc_conv_reduce" in code, code
    _every_variant_is_the_reference(task, a)
    from kernelcraft.judge.caller.screen import screen
    src = wrappers.render(task.source, ["rewrite:size1_reduce", "rewrite:sink_pointwise", "rewrite:conv_reduce"], a)
    assert "def _kc_conv_reduce(" in src and screen(src, "open").findings == []  # standalone, and it screens clean


# ---- pointwise ops sunk past reductions / pools -------------------------------------------------------------

def test_sink_pointwise():
    ops, _ = _check(_m(lambda s, x: torch.min(s.mods[0](x) * 2.0, dim=1, keepdim=True)[0], nn.Conv2d(16, 8, 3)), [X],
                    "sink_pointwise")
    assert ops == ["Conv2d", "min", "getitem", "mul"]
    ops, _ = _check(_m(lambda s, x: s.mods[0](torch.tanh(x) - 0.2), nn.AvgPool2d(2)), [X], "sink_pointwise")
    assert ops == ["tanh", "AvgPool2d", "add"]
    ops, _ = _check(_m(lambda s, x: F.max_pool2d(torch.sin(x) / 2.0, 2)), [X], "sink_pointwise")
    assert ops == ["sin", "max_pool2d", "mul"]
    ops, _ = _check(_m(lambda s, x: s.mods[1](s.mods[0](torch.sin(x))), nn.LeakyReLU(0.2), nn.MaxPool2d(2)), [X],
                    "sink_pointwise")
    assert ops == ["sin", "MaxPool2d", "LeakyReLU"]
    net = nn.Sequential(nn.Conv2d(16, 8, 3), nn.ReLU(inplace=True), nn.MaxPool2d(2))  # a VGG-style stage
    ops, _ = _check(net, [X], "sink_pointwise")
    assert ops == ["Conv2d", "MaxPool2d", "ReLU"]
    ops, _ = _check(_m(lambda s, x: torch.sum(torch.sin(x) / 2, dim=1, keepdim=True) * 1.5), [V], "sink_pointwise")
    assert ops == ["sin", "sum", "mul", "mul"]
    ops, _ = _check(_m(lambda s, x: torch.mean(s.mods[0](x) - s.p, dim=1, keepdim=True), nn.Linear(40, 24),
                       p=torch.randn(24)), [V], "sink_pointwise")
    assert ops == ["Linear", "mean", "mean", "sub"]
    ops, _ = _check(_m(lambda s, x: torch.softmax(torch.sin(x) + 3.0, dim=1)), [V], "sink_pointwise")
    assert ops == ["sin", "softmax"]
    ops, _ = _check(_m(lambda s, x: torch.logsumexp(torch.sin(x) + 3.0, dim=1)), [V], "sink_pointwise")
    assert ops == ["sin", "logsumexp", "add"]


def test_sink_pointwise_near_misses():
    _check(_m(lambda s, x: torch.amax(torch.sin(x) * -2.0, dim=1)), [V], "sink_pointwise", applies=False)  # max(-y)
    _check(_m(lambda s, x: torch.sum(torch.sin(x) + 1.0, dim=1)), [V], "sink_pointwise", applies=False)  # N * t
    _check(_m(lambda s, x: s.mods[0](torch.sin(x) + 1.0), nn.AvgPool2d(2, padding=1)), [X], "sink_pointwise",
           applies=False)  # padded windows average zeros too
    _check(_m(lambda s, x: torch.mean(s.mods[0](x) - s.p, dim=0), nn.Linear(40, 24), p=torch.randn(24)), [V],
           "sink_pointwise", applies=False)  # p varies along a kept dim
    _check(_m(lambda s, x: s.mods[0](torch.sin(x) * 2.0), nn.Conv2d(16, 8, 1)), [X], "sink_pointwise", applies=False)
    _check(_m(lambda s, x: s.mods[0](F.gelu(x)), nn.MaxPool2d(2)), [X], "sink_pointwise", applies=False)  # not monotone
    _check(_m(lambda s, x: s.mods[1](s.mods[0](x)), nn.ReLU(inplace=True), nn.MaxPool2d(2)), [X.clone()],
           "sink_pointwise", applies=False)  # the in-place ReLU writes the caller's input: not moved
    _check(_m(lambda s, x: (lambda c: s.mods[1](s.mods[0](c)) + c.mean())(torch.sin(x)), nn.ReLU(inplace=True),
              nn.MaxPool2d(2)), [X], "sink_pointwise", applies=False)  # another reader sees the in-place result


# ---- composite activations ------------------------------------------------------------------------------

def test_fuse_activation():
    ops, _ = _check(_m(lambda s, x: (lambda y: y * torch.sigmoid(y))(torch.cos(x))), [X], "fuse_activation")
    assert ops == ["cos", "silu"]
    ops, _ = _check(_m(lambda s, x: (lambda y: torch.sigmoid(y) * y)(torch.cos(x))), [X], "fuse_activation")
    assert ops == ["cos", "silu"]
    ops, _ = _check(_m(lambda s, x: (lambda y: torch.multiply(torch.tanh(F.softplus(y)), y))(torch.cos(x))), [X],
                    "fuse_activation")
    assert ops == ["cos", "mish"]
    ops, _ = _check(_m(lambda s, x: (lambda y: y * torch.clamp((y + 3) / 6, 0, 1))(torch.relu(x))), [X],
                    "fuse_activation")
    assert ops == ["relu", "hardswish"]


def test_fuse_activation_near_misses():
    _check(_m(lambda s, x: (lambda y, g: y * g + g)(torch.cos(x), torch.sigmoid(torch.cos(x)))), [X],
           "fuse_activation", applies=False)  # the gate is used again
    _check(_m(lambda s, x: torch.cos(x) * torch.sigmoid(torch.sin(x))), [X], "fuse_activation", applies=False)
    _check(_m(lambda s, x: (lambda y: y * torch.clamp((y + 3) / 5, 0, 1))(torch.cos(x))), [X], "fuse_activation",
           applies=False)


# ---- reduce_linear through a transposed weight -------------------------------------------------------------

def test_reduce_linear_through_transposed_weight_after_sink():
    model = _m(lambda s, x: torch.sum(torch.matmul(x, s.w.T) / 2, dim=1, keepdim=True) * 1.5, w=torch.randn(24, 40))
    gm, changed = _apply(model, [V], ["sink_pointwise", "reduce_linear", "fold_scalars"])
    assert changed == [True, True, True]
    assert "w.T" not in gm.code and "matmul" in gm.code
    with torch.no_grad():
        torch.testing.assert_close(gm(V), model(V), rtol=1e-4, atol=1e-4)
    _, alone = _apply(model, [V], ["reduce_linear"])
    assert alone == [False]  # the divide sits between: only the sink exposes it


# ---- the whole pipeline on a fixture task ------------------------------------------------------------------

@pytest.fixture(scope="module")
def chain_analysis():
    task = load_task(CHAIN)
    return task, rewrite.analyze(task.source)


def test_pipeline_finds_every_rule_and_renders_correct_source(chain_analysis):
    task, a = chain_analysis
    assert a.traced, a.error
    assert {"identities", "clamp_chain", "size1_reduce", "sink_pointwise", "fuse_activation",
            "reduce_linear"} <= set(a.rules), a.rules
    every = [r for r in a.rules if r != "inplace"]
    code = a.variant(every)["code"]
    assert "linear(" not in code and "logsumexp" not in code and "max(" not in code and "sigmoid" not in code
    assert "silu" in code and ".clone(" not in code and code.count("torch.clamp(") == 1
    checked = _every_variant_is_the_reference(task, a)
    assert checked >= len(a.rules) + 1


def test_pipeline_candidate_is_judged_correct_with_perturbed_weights(chain_analysis, cache_dir):
    from kernelcraft.evaluate import evaluate
    task, a = chain_analysis
    every = [f"rewrite:{r}" for r in a.rules]
    src = wrappers.render(task.source, every, a)
    v = evaluate(CHAIN, src, time_budget_s=0.3, trials=2, timeout_s=120.0, remeasure_above=None)
    assert v.status == "correct", (v.status, v.reasons, v.message)
    assert v.to_json().get("weights", {}).get("matched", True)


def test_triton_fusion_chains_a_region_read_twice_by_the_next():
    """Found on the fixture: a fused region (the clamp chain) whose output two ops of a later region read
    (z * sigmoid(z)); the later launcher must read the earlier launcher's result, not the erased node."""
    from kernelcraft.search.recipes import tritonfuse
    model, inputs = rewrite._build(rewrite._load_reference(load_task(CHAIN).source))
    gm = rewrite._trace(model, inputs)
    fused = tritonfuse.fuse(gm)  # lints the graph
    assert fused is not None and len([r for r in fused.regions if r["name"].startswith("_kc_ew")]) == 2
    calls = [n for n in gm.graph.nodes if "_kc_ew" in getattr(n.target, "__name__", "")]
    assert len(calls) == 2 and calls[0] in calls[1].args
