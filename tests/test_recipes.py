"""Recipes: FX rewrites found and rendered to correct standalone source; the search policy's choices."""
from __future__ import annotations

import ast
import math
import os
import random
import subprocess
import sys
import types

import pytest
import torch

from kernelcraft.search.recipes import rewrite, render as wrappers
from kernelcraft.search.exemplars import Exemplar
from kernelcraft.search.policies import Context, make_policy
from kernelcraft.search.prompt import DeviceInfo
from kernelcraft.search.recipes.policy import RecipesPolicy
from kernelcraft.search.rundb import Row
from kernelcraft.task import load_task

from conftest import FIXTURES

ALGEBRA = FIXTURES / "tasks" / "algebra_mix.py"
DIAG = FIXTURES / "tasks" / "diag_matmul_1024.py"
CPU = DeviceInfo("cpu", "test cpu", cores=2)
GPU = DeviceInfo("cuda", "NVIDIA H100", 132, 79.0, "9.0")


@pytest.fixture(scope="module")
def analyses():
    tasks = {"algebra": load_task(ALGEBRA), "diag": load_task(DIAG), "matmul_sum": load_task("tiny/level2/matmul_sum"),
             "conv": load_task("tiny/level2/conv2d_relu_bias")}
    return {k: (t, rewrite.analyze(t.source)) for k, t in tasks.items()}


def _module(source: str, name: str):
    mod = types.ModuleType(name)
    exec(compile(source, name, "exec"), mod.__dict__)
    return mod


def _same_as_reference(task, source) -> bool:
    ref, cand = _module(task.source, "ref"), _module(source, "cand")
    torch.manual_seed(0)
    init = ref.get_init_inputs()
    torch.manual_seed(1)
    m_ref = ref.Model(*init)
    torch.manual_seed(1)
    m_new = cand.ModelNew(*init)
    for seed in (2, 3):
        torch.manual_seed(seed)
        inputs = ref.get_inputs()
        with torch.no_grad():
            want = m_ref(*[i.clone() for i in inputs])
            got = m_new(*[i.clone() for i in inputs])
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(want.pow(2).mean().sqrt()))):
            return False
    return True


def test_rules_found(analyses):
    assert analyses["diag"][1].rules == ["diag_matmul"]
    assert analyses["matmul_sum"][1].rules == ["reduce_linear", "inplace"]  # the GEMV's bias add, once it exists
    assert set(analyses["algebra"][1].rules) == {"fold_scalars", "dead_code", "inplace"}
    assert analyses["conv"][1].features["conv"] and analyses["conv"][1].features["conv2d"]
    assert not analyses["conv"][1].features["conv3d"]
    assert not analyses["diag"][1].features["conv"]


def test_rewritten_code_is_the_algebraic_rewrite(analyses):
    code = analyses["diag"][1].variant(["diag_matmul"])["code"]
    assert "unsqueeze" in code and "diag" not in code and "@" not in code and "matmul" not in code
    algebra = analyses["algebra"][1].variant(["fold_scalars", "dead_code"])["code"]
    assert "* 1.5" in algebra and "+ 0.5" in algebra  # a*2*3/4 + 1 - 0.5 folded to one multiply-add
    assert "softmax" not in algebra  # unused result removed
    assert algebra.count("self.linear(") == 1  # recomputed linear removed
    assert ".add_(" in analyses["algebra"][1].variant(["inplace"])["code"]


def test_every_cpu_recipe_renders_correct_source(analyses):
    checked = 0
    for key, (task, a) in analyses.items():
        extras = [[], ["channels_last"]] if a.features.get("conv2d") else [[]]
        for rules in [[r for r in k.split("+") if r] for k in a.variants]:  # every rendered subset of the rules
            for extra in extras:
                recipe = [f"rewrite:{x}" for x in rules] + extra
                if not recipe:
                    continue
                src = wrappers.render(task.source, recipe, a)
                assert "get_inputs" not in src and "class ModelNew(Model)" in src
                assert _same_as_reference(task, src), (key, recipe)
                checked += 1
    assert checked >= 12


def test_a_parameter_left_at_its_default_is_traced_as_that_value():
    """get_inputs() passes x only: `h=None` must take the reference's `if h is None` branch in the rewritten
    forward (traced as a proxy it was dropped, and the candidate called the layer on None)."""
    task = load_task(FIXTURES / "tasks" / "optional_state.py")
    a = rewrite.analyze(task.source)
    assert a.rules == ["fold_scalars", "inplace"]  # dead code is not the assertion that h is still None
    src = wrappers.render(task.source, ["rewrite:fold_scalars", "rewrite:inplace"], a)
    assert "zeros_like" in src and "6.0" in src and "_assert_is_none(h" in src
    assert _same_as_reference(task, src)
    cand = _module(src, "cand").ModelNew(32)
    with pytest.raises(AssertionError, match="specialized"):  # a caller's h is never silently dropped
        cand(torch.randn(8, 32), torch.randn(8, 32))


def test_gpu_and_compile_recipes_render_valid_source(analyses):
    task, a = analyses["conv"]
    for recipe, needles in [
        (["cudagraph"], ["torch.cuda.CUDAGraph()", "_kc_clone(self.static_out)", "wait_stream"]),
        (["compile:reduce-overhead"], ["mode='reduce-overhead'", "cudagraph_mark_step_begin"]),
        (["compile:max-autotune", "channels_last"], ["mode='max-autotune'", "memory_format=torch.channels_last"]),
        (["cudnn_benchmark"], ["torch.backends.cudnn.benchmark = True", "finally:", "_kc_saved"]),
        (["bf16", "rewrite:inplace"], ["torch.autocast", "torch.bfloat16", ".to(torch.float32)"]),
        (["triton", "cudagraph"], ["@triton.jit", "_kc_ew0_kernel[", "_KcCudaGraph(self._kc_inner)"]),
        (["compile:default", "cudagraph", "rewrite:inplace"],
         ["_KcCudaGraph(torch.compile(self._kc_inner, mode='default', dynamic=False))", "_kc_body"]),
    ]:
        src = wrappers.render(task.source, recipe, a, output_dtypes=a.features.get("output_dtypes"))
        tree = ast.parse(src)
        assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
        for needle in needles:
            assert needle in src, (recipe, needle)
    # without triton installed the module still cannot be imported, but every other recipe imports on CPU
    mod = _module(wrappers.render(task.source, ["cudagraph", "cudnn_benchmark"], a), "gpu_cand")
    assert "x" in str(__import__("inspect").signature(mod.ModelNew.forward))


def test_signature_is_preserved_with_defaults():
    src = ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self, k: int = 2):\n        super().__init__()\n"
           "    def forward(self, x, scale=1.0, *rest, flag=False, **kw):\n        return x * scale\n"
           "def get_inputs():\n    return [torch.randn(3)]\ndef get_init_inputs():\n    return []\n")
    out = wrappers.render(src, ["compile:default"])
    mod = _module(out, "sig")
    import inspect
    assert str(inspect.signature(mod.ModelNew.forward)) == "(self, x, scale=1.0, *rest, flag=False, **kw)"
    assert "self._kc_run(x, scale, *rest, flag=flag, **kw)" in out


def test_untraceable_reference_still_gets_wrappers():
    a = rewrite.analyze(load_task("tiny/level3/gru_cell_loop").source)
    assert not a.traced and a.rules == [] and "symbolic_trace failed" in a.error
    task = load_task("tiny/level3/gru_cell_loop")
    assert "Model.forward(self, x)" in wrappers.render(task.source, ["compile:default"], a)


@pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None, reason="triton not installed")
def test_triton_fusion_is_correct_in_the_interpreter(analyses, tmp_path):
    task, a = analyses["algebra"]
    src = wrappers.render(task.source, ["triton", "rewrite:fold_scalars", "rewrite:dead_code"], a)
    (tmp_path / "cand.py").write_text(src)
    (tmp_path / "ref.py").write_text(task.source)
    check = (f"import sys; sys.path.insert(0, {str(os.path.dirname(__file__))!r})\n"
             "import test_recipes as t, pathlib\n"
             f"d = pathlib.Path({str(tmp_path)!r})\n"
             "task = type('T', (), {'source': (d / 'ref.py').read_text()})\n"
             "assert t._same_as_reference(task, (d / 'cand.py').read_text())\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---- the search policy ---------------------------------------------------------------------------------

def _row(i, recipe, status="correct", speedup=None, lo=None):
    ok = status == "correct"
    return Row(id=i, round=1, policy="recipes", source=f"# {i}", sha256=None, state="done", status=status,
               speedup=speedup if ok else None, ci_low=(lo if lo is not None else speedup * 0.95) if ok else None,
               ci_high=speedup * 1.05 if ok else None, meta={"recipe": sorted(recipe)})


BASELINES_MEASURED = [_row(1, ["compile:default"], speedup=1.0), _row(2, ["cudagraph"], speedup=0.9)]


def _ctx(task, device, history, k=4, allow=False, seed=0):
    rng = random.Random(seed)
    items = [Exemplar(r.id, r.source, r.speedup, [], r.meta) for r in history if r.correct]

    def sample():
        from kernelcraft.search.exemplars import contrastive
        return contrastive(items, rng, n=2, tau=1.0)

    return Context(task=task, device=device, round=len(history) + 1, k=k, history=history, failures=[],
                   sample_exemplars=sample, rng=rng, allow_precision_change=allow)


def test_first_round_seeds_baselines_and_the_best_prior(analyses):
    task, a = analyses["diag"]
    pol = RecipesPolicy(analysis=a)
    first = [tuple(p.meta["recipe"]) for p in pol.propose(_ctx(task, GPU, [], k=4))]
    assert first == [("compile:default",), ("cudagraph",)]  # on a GPU the baselines go first, alone
    measured = [_row(1, ["compile:default"], speedup=1.0), _row(2, ["cudagraph"], speedup=1.1)]
    props = pol.propose(_ctx(task, GPU, measured, k=2))
    recipes = [tuple(p.meta["recipe"]) for p in props]
    # then the composite (every rewrite + compile + CUDA graph) ranks first by the additive model, then the singles
    assert recipes == [("compile:default", "cudagraph", "rewrite:diag_matmul"), ("rewrite:diag_matmul",)], recipes
    assert props[0].meta["operator"] == "compose" and props[1].meta["operator"] == "seed"
    assert "_KcCudaGraph(torch.compile(self._kc_inner" in props[0].source and "class ModelNew" in props[1].source
    cpu = [tuple(p.meta["recipe"]) for p in pol.propose(_ctx(task, CPU, [], k=8))]
    assert not any(t in ("cudagraph", "compile:reduce-overhead", "triton") for r in cpu for t in r)
    assert cpu[:2] == [("compile:default", "rewrite:diag_matmul"), ("rewrite:diag_matmul",)]


def test_what_cuda_graphs_cost_steers_the_graph_recipes(analyses):
    """A task whose inputs are large: capturing it in a CUDA graph costs more than its launches (the inputs are
    copied into the graph's buffers). Once `cudagraph` alone measured that, the modes that capture graphs themselves
    and the composite rank by it; where graphs pay, they lead."""
    task, a = analyses["conv"]
    pol = RecipesPolicy(analysis=a)

    def after(compile_speedup, graph_speedup):
        rows = [_row(1, ["compile:default"], speedup=compile_speedup), _row(2, ["cudagraph"], speedup=graph_speedup)]
        return [frozenset(p.meta["recipe"]) for p in pol.propose(_ctx(task, GPU, rows, k=2))]

    slow_graphs = after(0.95, 0.4)
    assert not any("cudagraph" in r or "compile:reduce-overhead" in r or "compile:max-autotune" in r
                   for r in slow_graphs), slow_graphs
    fast_graphs = after(1.1, 1.6)
    assert any("cudagraph" in r and len(r) > 1 for r in fast_graphs), fast_graphs
    # the composite leaves out a token measured as a loss alone (graphs at 0.5x, compile at 1.3x) and is proposed
    composite = [r for r in after(1.3, 0.5) if "compile:default" in r and len(r) > 1]
    assert composite and not any("cudagraph" in r for r in composite), composite


def test_graph_recipes_measured_to_lose_are_not_proposed(analyses):
    """CUDA graphs alone at 0.5x, compile at 1.8x: every recipe that captures a graph adds up to at most 0.9x, so
    none is proposed, to the end of the search, and the reason is given when it ends. Rewrites and the other
    tokens, measured alone or not, are still combined (their estimates do not hold well enough to rule them out)."""
    task, a = analyses["conv"]
    pol = RecipesPolicy(analysis=a)
    alone = {"compile:default": 1.8, "cudagraph": 0.5}
    rows = [_row(1, ["compile:default"], speedup=1.8), _row(2, ["cudagraph"], speedup=0.5)]
    for _ in range(40):  # what each recipe measures: the product of its tokens' speedups alone (1x where unlisted)
        props = pol.propose(_ctx(task, GPU, rows, k=4))
        if not props:
            break
        rows += [_row(len(rows) + i + 1, p.meta["recipe"],
                      speedup=math.prod(alone.get(t, 1.0) for t in p.meta["recipe"])) for i, p in enumerate(props)]
    else:
        raise AssertionError("the search never ended")
    tried = [frozenset(r.meta["recipe"]) for r in rows[2:]]
    assert not any(r & {"cudagraph", "compile:reduce-overhead", "compile:max-autotune"} for r in tried), tried
    assert {"compile:default", "cudnn_benchmark", "rewrite:inplace"} in tried  # combinations without graphs go on
    assert "capturing CUDA graphs, which lost alone" in pol.exhausted(_ctx(task, GPU, rows))


def test_mutations_follow_the_exemplars_and_avoid_failed_tokens(analyses):
    task, a = analyses["diag"]
    pol = RecipesPolicy(analysis=a)
    history = [_row(1, ["rewrite:diag_matmul"], speedup=60.0), _row(2, ["compile:default"], speedup=1.3),
               _row(3, ["cudagraph"], status="runtime_error"), _row(4, ["compile:reduce-overhead"], speedup=1.5)]
    props = pol.propose(_ctx(task, GPU, history, k=4))
    assert props
    tried = {frozenset(r.meta["recipe"]) for r in history}
    for p in props:
        rec = frozenset(p.meta["recipe"])
        assert rec not in tried and "cudagraph" not in rec  # never the banned token, never a repeat
        assert p.meta["operator"] in ("compose", "extend", "combine", "swap", "ablate", "explore")
    # the best exemplar (the rewrite) is built upon: its children carry it and name it as parent
    assert sum("rewrite:diag_matmul" in p.meta["recipe"] for p in props) >= 3
    assert any(1 in p.parents for p in props)


def test_exhaustion_and_precision_and_skip(analyses):
    task, a = analyses["diag"]
    pol = RecipesPolicy(analysis=a)
    assert "bf16" not in pol.tokens(_ctx(task, GPU, []))
    assert "bf16" in pol.tokens(_ctx(task, GPU, [], allow=True))
    skip = RecipesPolicy(analysis=a, skip="compile,cudagraph")
    assert skip.tokens(_ctx(task, GPU, [])) == ["rewrite:diag_matmul", "tuned_gemm"]  # diag(a) @ B: a GEMM region
    # CPU, no compile: the only recipe is the rewrite; once tried, nothing is left
    only = RecipesPolicy(analysis=a, skip=["compile"])
    first = only.propose(_ctx(task, CPU, []))
    assert [p.meta["recipe"] for p in first] == [["rewrite:diag_matmul"]]
    assert only.propose(_ctx(task, CPU, [_row(1, ["rewrite:diag_matmul"], speedup=50.0)])) == []
    assert pol.valid(frozenset(["compile:default", "cudagraph"]), _ctx(task, GPU, []))  # compiled, then captured
    assert not pol.valid(frozenset(["compile:reduce-overhead", "cudagraph"]), _ctx(task, GPU, []))
    assert not pol.valid(frozenset(["compile:max-autotune", "cudagraph"]), _ctx(task, GPU, []))
    assert not pol.valid(frozenset(["compile:default", "compile:max-autotune"]), _ctx(task, GPU, []))


def test_unreproduced_speedup_does_not_ban_a_token(analyses):
    task, a = analyses["diag"]
    pol = RecipesPolicy(analysis=a)
    flaky = _row(1, ["rewrite:diag_matmul"], status="rejected")
    flaky.reasons = ["suspicious_speedup"]
    broken = _row(2, ["cudagraph"], status="runtime_error")
    props = pol.propose(_ctx(task, GPU, [flaky, broken, _row(3, ["compile:default"], speedup=1.2)], k=6))
    recipes = [set(p.meta["recipe"]) for p in props]
    assert any("rewrite:diag_matmul" in r for r in recipes)  # still combined with others
    assert not any("cudagraph" in r for r in recipes)  # a real failure still bans


def test_one_policy_analyses_each_task_it_serves():
    """A bench shares one policy between tasks: each task gets its own rewrites, not the first task's."""
    pol = RecipesPolicy(skip="compile")
    diag, mm = load_task("tiny/level1/diag_matmul"), load_task("tiny/level2/matmul_sum")
    assert pol.tokens(_ctx(diag, CPU, [])) == ["rewrite:diag_matmul"]
    assert pol.tokens(_ctx(mm, CPU, [])) == ["rewrite:reduce_linear", "rewrite:inplace"]
    assert [p.meta["recipe"] for p in pol.propose(_ctx(diag, CPU, []))] == [["rewrite:diag_matmul"]]


def test_recipes_refuse_strict_mode(analyses):
    from kernelcraft.search.policies import PolicyError
    task, a = analyses["diag"]
    ctx = _ctx(task, GPU, [])
    ctx.mode = "strict"
    with pytest.raises(PolicyError, match="strict"):
        RecipesPolicy(analysis=a).propose(ctx)


def test_generated_candidates_pass_the_static_screen(analyses):
    from kernelcraft.judge.caller.screen import screen
    task, a = analyses["conv"]
    for recipe in (["cudagraph"], ["triton"], ["compile:reduce-overhead"], ["channels_last", "cudnn_benchmark"],
                   ["bf16"], ["rewrite:inplace", "compile:default"], ["compile:default", "cudagraph"]):
        src = wrappers.render(task.source, recipe, a, output_dtypes=a.features.get("output_dtypes"))
        assert screen(src, "open").findings == [], recipe


def test_composite_on_a_conv_net(analyses):
    task, a = analyses["conv"]
    pol = RecipesPolicy(analysis=a)
    rewrites = {f"rewrite:{r}" for r in max((k for k in a.variants if k), key=lambda k: len(k.split("+")),
                                            default="").split("+") if r}
    gpu = pol.composite(pol.tokens(_ctx(task, GPU, [])), _ctx(task, GPU, []))
    assert gpu == {"compile:default", "cudagraph", "cudnn_benchmark"} | (rewrites - {"rewrite:inplace"})
    no_compile = RecipesPolicy(analysis=a, skip="compile")
    cpu = no_compile.composite(no_compile.tokens(_ctx(task, CPU, [])), _ctx(task, CPU, []))
    assert cpu == {"channels_last"} | rewrites


def test_cudnn_benchmark_leads_on_3d_convolutions_only(analyses):
    """cuDNN's benchmark picked 1.9x faster algorithms for 3-D convolutions and ~1.0x for 2-D ones: on a 3-D conv
    net it is proposed alone in the first round, beside the baselines; on a 2-D one it rides in the composite."""
    task, a = analyses["conv"]
    a3 = rewrite.Analysis(traced=True, features={**a.features, "conv3d": True}, variants=a.variants, rules=a.rules)

    def first_round(analysis):  # after the baselines
        return [frozenset(p.meta["recipe"]) for p in
                RecipesPolicy(analysis=analysis).propose(_ctx(task, GPU, BASELINES_MEASURED, k=2))]

    assert frozenset(["cudnn_benchmark"]) in first_round(a3)
    assert frozenset(["cudnn_benchmark"]) not in first_round(a)
    assert all("channels_last" not in r for r in first_round(a))  # 0.38x alone on fp32 2-D convolutions


def test_triton_ranks_as_a_template_only_where_it_replaces_the_main_work():
    """A pooling, a reduction or a depthwise convolution lowered to a generated kernel is a template in place of a
    library call (`TRITON_TEMPLATE_PRIOR`); the same pooling after a cuDNN convolution is a tail that inductor fuses
    as well, so it keeps the elementwise prior."""
    from kernelcraft.search.recipes.policy import PRIORS, TRITON_TEMPLATE_PRIOR

    def triton_prior(name):
        return RecipesPolicy().prior("triton", _ctx(load_task(name), GPU, []))

    for alone in ("gpu/level1/maxpool2d", "gpu/level1/sum_reduction", "gpu/level1/depthwise_conv2d"):
        assert triton_prior(alone) == TRITON_TEMPLATE_PRIOR, alone
    for chain in ("gpu/level2/conv2d_scale_maxpool", "gpu/level2/conv2d_min_tanh"):
        assert triton_prior(chain) == PRIORS["cuda"]["triton"], chain


def test_channels_last_only_for_4d_convolutions(analyses):
    """`module.to(channels_last)` raises on a Conv3d's 5-D weight: the token is not offered there."""
    task, a = analyses["conv"]
    assert "channels_last" in RecipesPolicy(analysis=a).tokens(_ctx(task, CPU, []))
    a3 = rewrite.Analysis(traced=True, features={**a.features, "conv3d": True}, variants=a.variants, rules=a.rules)
    assert "channels_last" not in RecipesPolicy(analysis=a3).tokens(_ctx(task, CPU, []))


def test_policy_registry():
    assert isinstance(make_policy("recipes"), RecipesPolicy)
    from kernelcraft.search.policies import PolicyError
    for bad in ("nope", "openai", "recipes:x"):
        with pytest.raises(PolicyError):
            make_policy(bad)


def test_triton_ranks_as_a_template_where_its_kernels_replace_a_reduction():
    """`triton` whose kernels replace a library reduction (here a loss's mean, fused into its elementwise kernel) is
    tried right after the baselines; elementwise fusion alone keeps its low prior and waits behind the composite."""
    pol = RecipesPolicy()

    def first_round(name):  # after the baselines
        ctx = _ctx(load_task(FIXTURES / "tasks" / name), GPU, BASELINES_MEASURED, k=1)
        return ctx, [tuple(p.meta["recipe"]) for p in pol.propose(ctx)]

    _, loss = first_round("loss_hinge.py")
    assert loss == [("triton",)], loss
    ctx, add = first_round("gpu_add_relu.py")
    assert "triton" in pol.tokens(ctx) and ("triton",) not in add, add


def test_max_autotune_is_left_out_where_it_would_autotune_many_problems():
    """max-autotune benchmarks each distinct convolution and matrix-product problem in the first call: a stack of
    five convolution shapes is past `MAX_AUTOTUNE_SHAPES`, a single convolution is not, and the
    exhaustion message says so, on any device."""
    from kernelcraft.search.recipes.policy import AUTOTUNE_MODES, MAX_AUTOTUNE_SHAPES

    pol = RecipesPolicy()
    stack, single = _ctx(load_task("gpu/level3/vgg_stack"), GPU, []), _ctx(load_task("gpu/level1/conv2d"), GPU, [])
    assert pol.analysis(stack).features["autotune_shapes"] == 5 > MAX_AUTOTUNE_SHAPES
    assert pol.analysis(single).features["autotune_shapes"] == 1
    assert not AUTOTUNE_MODES & set(pol.tokens(stack)) and "compile:reduce-overhead" in pol.tokens(stack)
    assert AUTOTUNE_MODES <= set(pol.tokens(single))
    assert "max-autotune modes are left out: they would autotune 5 distinct" in pol.exhausted(stack)
    assert "left out: they would autotune" not in pol.exhausted(single)
    on_cpu = _ctx(load_task("gpu/level3/vgg_stack"), CPU, [])
    assert "compile:default" in pol.tokens(on_cpu) and not AUTOTUNE_MODES & set(pol.tokens(on_cpu))


def test_every_recipe_token_has_a_name_for_people():
    """What won is printed by name (`techniques`): every rule and every token the policy can offer has one."""
    from kernelcraft.search.recipes.policy import PRIORS
    from kernelcraft.search.techniques import TOKEN_TECHNIQUES
    tokens = {f"rewrite:{r}" for r in rewrite.RULE_ORDER} | {t for kind in PRIORS.values() for t in kind}
    assert not tokens - set(TOKEN_TECHNIQUES), sorted(tokens - set(TOKEN_TECHNIQUES))
