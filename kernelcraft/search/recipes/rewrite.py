"""FX-graph rewrites of a reference model: algebraic simplifications rendered back to Python source.

The reference is traced in a subprocess (`python -m kernelcraft.search.recipes.rewrite`) on the `meta`
device, never in the caller. Only rules that change this reference's graph are offered; the rule subsets
(with and without Triton fusion) are rendered once, in `RULE_ORDER`, as standalone source.
Rationale: docs/design/recipes.md#rewrite
"""
from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field

from kernelcraft.search.recipes import (activations, attention, convreduce, depthwise, dimreduce, fxrules, gemmsplice,
                                        pooling, poollinear, reductions, simplify, tritonfuse, tunematch)
from kernelcraft.search.recipes.fxrules import _dtype, _torch

# simplifications first: they expose work for the others (sum(x @ W.T / 2) -> sum(x @ W.T) / 2 -> a GEMV)
RULE_ORDER = ("identities", "attention", "clamp_chain", "size1_reduce", "sink_pointwise", "pool_merge",
              "pool_linear", "conv_reduce", "fuse_activation") + fxrules.RULE_ORDER
RULES = {**simplify.RULES, **attention.RULES, **reductions.RULES, **poollinear.RULES, **convreduce.RULES,
         **activations.RULES, **fxrules.RULES}
MAX_FULL_SUBSETS = 5  # more applicable rules than this: render singletons, all, and all-but-one only

REF_MODULE = "kc_reference"


@dataclass
class Analysis:
    """What the subprocess found: features of the model and rendered variants keyed by rule subset."""
    traced: bool = False
    error: str | None = None
    rules: list[str] = field(default_factory=list)
    features: dict = field(default_factory=dict)
    variants: dict[str, dict] = field(default_factory=dict)  # "a+b" -> {"code", "prelude", "triton", "gemm"}
    tunable: list[dict] = field(default_factory=list)  # tunematch.Match records: the `tuned` recipe's kernels

    def variant(self, rules) -> dict | None:
        return self.variants.get(variant_key(rules))

    def to_json(self) -> dict:
        return dict(self.__dict__)


def variant_key(rules) -> str:
    return "+".join(r for r in RULE_ORDER if r in set(rules))


def analyze(source: str, *, timeout_s: float = 180.0) -> Analysis:
    """Trace the reference in a subprocess and render every applicable rewrite (see docs/design/recipes.md#rewrite)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run([sys.executable, "-m", "kernelcraft.search.recipes.rewrite"], input=json.dumps({"source": source}),
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return Analysis(error=f"tracing the reference took longer than {timeout_s:g} s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return Analysis(error=f"analysis subprocess failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    return Analysis(**json.loads(lines[-1]))


# ---- everything below runs in the subprocess -----------------------------------------------------


def _load_reference(source: str):
    mod = types.ModuleType(REF_MODULE)
    mod.__file__ = f"<{REF_MODULE}>"
    sys.modules[REF_MODULE] = mod
    exec(compile(source, f"<{REF_MODULE}>", "exec"), mod.__dict__)
    return mod


def _build(mod):
    torch = _torch()
    init = list(mod.get_init_inputs())
    torch.manual_seed(0)
    try:
        with torch.device("meta"):
            model = mod.Model(*init)
    except Exception:  # some constructors do real arithmetic: build on the CPU instead
        model = mod.Model(*init)
    try:
        with torch.device("meta"):
            inputs = list(mod.get_inputs())
    except Exception:
        inputs = None
    return model, inputs


def _propagate(gm, inputs) -> None:
    """Shapes and dtypes on every node (meta tensors: nothing is allocated); cleared when it fails."""
    torch = _torch()
    from torch.fx.passes.shape_prop import ShapeProp

    if inputs is None:
        return
    try:
        ShapeProp(gm).propagate(*[i.to("meta") if isinstance(i, torch.Tensor) else i for i in inputs])
    except Exception:
        for n in gm.graph.nodes:
            n.meta.pop("tensor_meta", None)


def _trace(model, inputs):
    """The forward as called with `inputs`: parameters the inputs leave at their defaults are traced as those
    values (`h0=None` takes its `if h0 is None` branch; a call that passes one fails an assertion, never ignores it)."""
    gm = symbolic_trace(model, _defaulted(model, inputs) or None)
    _propagate(gm, inputs)
    return gm


def symbolic_trace(model, concrete_args=None):
    """torch.fx's trace; when it fails, again with buffers as graph values (`self.mask[:, :T]`, T traced, needs
    the buffer in the graph: a tensor attribute cannot be sliced by a traced size)."""
    torch = _torch()
    try:
        return torch.fx.symbolic_trace(model, concrete_args=concrete_args)
    except Exception:
        tracer = torch.fx.Tracer()
        tracer.proxy_buffer_attributes = True
        return torch.fx.GraphModule(model, tracer.trace(model, concrete_args=concrete_args))


def _defaulted(model, inputs) -> dict:
    import inspect

    if inputs is None:
        return {}
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return {p.name: p.default for p in params[len(inputs):] if p.default is not p.empty}


def _copy(gm):
    """A fresh graph over the same modules, shapes included (cheaper than tracing and propagating again)."""
    import copy

    return _torch().fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _reprop(gm, inputs) -> None:
    gm.recompile()
    _propagate(gm, inputs)


class Unrenderable(Exception):
    pass


def render_graph(gm, root) -> tuple[str, str]:
    """(prelude, code): the rewritten forward as `def forward(self, ...)` and the lines binding its names.
    `root` is the reference model: every attribute the graph reads must exist on it."""
    torch = _torch()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            try:
                _resolve_attr(root, n.target)
            except AttributeError:
                raise Unrenderable(f"attribute {n.target} exists only on the traced graph")
    for n in gm.graph.nodes:  # no annotations in generated code: they would need names of their own
        if n.op in ("placeholder", "output"):
            n.type = None
    pc = gm.graph.python_code(root_module="self")
    lines = []
    used = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", pc.src))
    known = {"torch": "import torch", "inf": "inf = float('inf')", "nan": "nan = float('nan')",
             "NoneType": "NoneType = type(None)", "device": "from torch import device",
             "fx_pytree": "import torch.fx._pytree as fx_pytree", "pytree": "import torch.utils._pytree as pytree"}
    for name, obj in sorted(pc.globals.items()):
        if name not in used:
            continue
        if name in known:
            lines.append(known[name])
        elif getattr(obj, "_kc_source", None):  # a rule's helper (convreduce): its source travels with the forward
            lines.append(obj._kc_source + f"\n{name} = {obj.__name__}")
        elif getattr(obj, "_kc_generated", False) or getattr(obj, "__module__", None) == REF_MODULE:
            lines.append(f"{name} = {obj.__qualname__}")
        elif isinstance(obj, types.ModuleType):
            lines.append(f"import {obj.__name__} as {name}")
        elif isinstance(obj, (torch.dtype,)):
            lines.append(f"{name} = {obj}")
        elif isinstance(obj, (str, int, float, bool)) or obj is None:
            lines.append(f"{name} = {obj!r}")  # e.g. a string annotation
        else:
            mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            try:
                target = __import__(mod, fromlist=["_"]) if mod else None
                for part in (qual or "").split("."):
                    target = getattr(target, part)
            except Exception:
                target = None
            if target is not obj:
                raise Unrenderable(f"cannot name {obj!r} in generated source")
            lines.append(f"import {mod} as _kc_{name}_mod\n{name} = _kc_{name}_mod.{qual}")
    # torch.fx marks the functions it wrapped (math.sqrt of a size) for a later trace of this code: none follows
    src = re.sub(r"(?m)^torch\.fx\._symbolic_trace\.wrap\([^\n]*\)\n", "", pc.src)
    return "\n".join(lines), src.strip() + "\n"


def _resolve_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _features(model, gm, inputs) -> dict:
    torch = _torch()
    mods = list(model.modules())
    feats = {
        "conv": any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in mods),
        "conv2d": any(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) for m in mods),
        "conv3d": any(isinstance(m, (torch.nn.Conv3d, torch.nn.ConvTranspose3d)) for m in mods),
        "n_params": sum(p.numel() for p in model.parameters()),
        "input_ranks": [i.dim() if isinstance(i, torch.Tensor) else None for i in inputs] if inputs else None,
        "input_dtypes": [str(i.dtype) if isinstance(i, torch.Tensor) else None for i in inputs] if inputs else None,
    }
    feats["autotune_shapes"] = _autotune_shapes(model, gm)
    if gm is not None:
        ops = [n for n in gm.graph.nodes if n.op.startswith("call")]
        feats["n_ops"] = len(ops)
        feats["ops"] = sorted({getattr(n.target, "__name__", str(n.target)) if n.op != "call_module"
                               else type(gm.get_submodule(n.target)).__name__ for n in ops})[:40]
        out = [n for n in gm.graph.nodes if n.op == "output"][0]
        res = out.args[0]
        res = res if isinstance(res, (list, tuple)) else [res]
        feats["output_dtypes"] = [str(_dtype(r)) if hasattr(r, "op") and _dtype(r) is not None else None for r in res]
        feats["placeholders"] = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return feats


GEMM_FUNCTIONS = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum"}
LIBRARY_FUNCTIONS = GEMM_FUNCTIONS | {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                                      "conv_transpose3d"}


def _autotune_shapes(model, gm) -> int:
    """How many distinct convolution and matrix-product problems the model poses: what inductor's max-autotune
    benchmarks one by one. Traced: per call (the op, its weight's and its tensor arguments' shapes); untraced:
    per module (the op and its weight's shape, a lower bound)."""
    torch = _torch()
    library = (torch.nn.modules.conv._ConvNd, torch.nn.Linear, torch.nn.Bilinear)

    def arg_shapes(node):
        return tuple(tuple(a.meta["tensor_meta"].shape) for a in node.args
                     if hasattr(a, "meta") and hasattr(a.meta.get("tensor_meta"), "shape"))

    if gm is None:
        return len({(type(m).__name__, tuple(m.weight.shape)) for m in model.modules() if isinstance(m, library)})
    keys = set()
    for n in gm.graph.nodes:
        if n.op == "call_module":
            m = gm.get_submodule(n.target)
            if isinstance(m, library):
                keys.add((type(m).__name__, tuple(m.weight.shape), arg_shapes(n)))
        elif n.op in ("call_function", "call_method"):
            name = getattr(n.target, "__name__", n.target)
            if name in LIBRARY_FUNCTIONS:
                keys.add((name, arg_shapes(n)))
    return len(keys)


def applicable_rules(model, inputs, base=None) -> list[str]:
    """Rules that change this graph alone or after the applicable ones before them (see docs/design/recipes.md#rewrite).
    `base`: the reference already traced and shape-propagated (copied, never changed)."""
    base = base if base is not None else _trace(model, inputs)
    alone = set()
    for rule in RULE_ORDER:
        trial = _copy(base)
        try:
            if RULES[rule](trial):
                trial.graph.lint()
                alone.add(rule)
        except Exception:
            continue
    chained, gm = set(), _copy(base)
    for rule in RULE_ORDER:
        try:
            if RULES[rule](gm):
                gm.graph.lint()
                _reprop(gm, inputs)
                chained.add(rule)
        except Exception:
            break
    return [r for r in RULE_ORDER if r in alone | chained]


def rule_subsets(applicable: list[str]):
    if len(applicable) <= MAX_FULL_SUBSETS:
        for r in range(len(applicable) + 1):
            yield from itertools.combinations(applicable, r)
        return
    yield ()
    yield from ((r,) for r in applicable)
    yield from (tuple(x for x in applicable if x != r) for r in applicable)
    yield tuple(applicable)


def run_analysis(source: str) -> dict:
    torch = _torch()

    torch.set_num_threads(1)
    mod = _load_reference(source)
    model, inputs = _build(mod)
    try:
        gm = _trace(model, inputs)
    except Exception as e:
        return dict(traced=False, error=f"symbolic_trace failed: {type(e).__name__}: {str(e)[:300]}",
                    features=_features(model, None, inputs))
    result = dict(traced=True, error=None, rules=[], features=_features(model, gm, inputs), variants={})
    try:
        result["tunable"] = [m.to_json() for m in tunematch.match(_copy(gm), model)]
    except Exception:  # a pattern the matcher cannot read is no match, never a failed analysis
        result["tunable"] = []
    applicable = applicable_rules(model, inputs, base=gm)
    result["rules"] = applicable
    try:
        seen = {render_graph(_copy(gm), model)[1]}  # rendered forwards so far, the reference's first
    except Exception:
        seen = set()
    for subset in rule_subsets(applicable):  # smaller subsets first
        gm_v = _copy(gm)
        try:
            for rule in subset:
                if RULES[rule](gm_v):
                    gm_v.graph.lint()
                    _reprop(gm_v, inputs)
            prelude, code = render_graph(gm_v, model) if subset else ("", "")
            variant = {"prelude": prelude, "code": code, "triton": None}
        except Exception:
            continue
        if subset and code in seen:
            continue  # a rule that changes nothing without another (reduce_linear before a sink): no new candidate
        seen.add(code)
        result["variants"][variant_key(subset)] = variant
        variant["gemm"] = _gemm_variant(gm_v, model) if inputs is not None else None
        try:  # a region Triton cannot fuse costs the triton recipe only, never the plain rewrite
            fused = triton_kernels(gm_v) if inputs is not None else None
            if fused is not None:
                t_prelude, t_code = render_graph(gm_v, model)
                variant["triton"] = {"prelude": t_prelude, "code": t_code, "kernels": fused.source,
                                     "regions": fused.regions}
        except Exception:
            pass
    return result


def triton_kernels(gm) -> tritonfuse.Fused | None:
    """The `triton` recipe's generated kernels, gm changed to call them: elementwise regions fused (`tritonfuse`),
    then the reductions over one dimension (`dimreduce`), the poolings (`pooling`) and the depthwise convolutions
    (`depthwise`) left in the graph; None when nothing changed."""
    fused = tritonfuse.fuse(gm)
    sources, regions = ([fused.source], list(fused.regions)) if fused else ([tritonfuse.HEADER], [])
    for lower in (dimreduce.lower, pooling.lower, depthwise.lower):
        lowered = lower(gm)
        if lowered is not None:
            sources.append(lowered[0])
            regions += lowered[1]
    return tritonfuse.Fused(source="\n\n".join(sources), regions=regions) if regions else None


def _gemm_variant(gm_v, model) -> dict | None:
    """The `tuned_gemm` form of a variant: its GEMM regions spliced into a copy (gemmsplice), else None."""
    try:  # a region that cannot be spliced costs the tuned_gemm recipe only
        gm_s = _copy(gm_v)
        spliced = gemmsplice.splice(gm_s)
        if spliced is None:
            return None
        prelude, code = render_graph(gm_s, model)
    except Exception:
        return None
    return {"prelude": prelude, "code": code, "kernels": spliced.source, "regions": spliced.regions}


def main() -> None:
    req = json.loads(sys.stdin.read())
    try:
        out = run_analysis(req["source"])
    except Exception as e:  # noqa: BLE001 - report, never crash silently
        out = dict(traced=False, error=f"{type(e).__name__}: {str(e)[:500]}")
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
