"""Source generation for recipes: a recipe (a set of technique tokens) + the reference -> `ModelNew` source.

The candidate is standalone Python that embeds the reference unchanged and subclasses its `Model` (same
parameters, same signatures). Backend flags are restored in `finally`; a manual CUDA graph returns a clone of
its static output.
Rationale: docs/design/recipes.md#render
"""
from __future__ import annotations

import ast
import textwrap

from kernelcraft.search.recipes import tunable

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "max-autotune", "reduce-overhead")

_GRAPH_HELPER = '''
def _kc_clone(out):
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, (tuple, list)):
        return type(out)(_kc_clone(o) for o in out)
    return out


class _KcCudaGraph:
    """Replays `fn` captured on static input buffers; captures again when shapes, dtypes or strides change."""

    def __init__(self, fn, warmup=3):
        self.fn, self.warmup, self.key, self.graph = fn, warmup, None, None
        self.static_in, self.static_out = None, None

    def __call__(self, *args):
        key = (torch.is_grad_enabled(),) + tuple(
            (tuple(a.shape), a.dtype, a.device, a.stride()) if isinstance(a, torch.Tensor) else ("v", repr(a))
            for a in args)
        if key != self.key:
            self._capture(args, key)
        for buf, a in zip(self.static_in, args):
            if isinstance(buf, torch.Tensor):
                buf.copy_(a)
        self.graph.replay()
        return _kc_clone(self.static_out)

    def _capture(self, args, key):
        self.graph = self.static_in = self.static_out = None
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn(*static)
        self.graph, self.static_in, self.static_out, self.key = graph, static, out, key
'''


class Signature:
    """The reference forward's parameters: text for a `def` and for a call passing them through."""

    def __init__(self, params: str, call: str, names: list[str]):
        self.params, self.call, self.names = params, call, names


def reference_parts(source: str) -> tuple[str, Signature]:
    """(the reference without its input functions, the signature of Model.forward)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    drop = []
    sig = Signature("*args", "*args", [])
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs"):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            drop.append((start - 1, node.end_lineno))
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    sig = _signature(item.args)
    for start, end in sorted(drop, reverse=True):
        del lines[start:end]
    return "".join(lines).rstrip() + "\n", sig


def _signature(args: ast.arguments) -> Signature:
    a = ast.arguments(posonlyargs=[], args=[], vararg=args.vararg, kwonlyargs=args.kwonlyargs,
                      kw_defaults=args.kw_defaults, kwarg=args.kwarg, defaults=args.defaults)
    pos = (args.posonlyargs + args.args)[1:]  # drop self
    a.args = [ast.arg(arg=p.arg) for p in pos]
    if a.vararg:
        a.vararg = ast.arg(arg=a.vararg.arg)
    if a.kwarg:
        a.kwarg = ast.arg(arg=a.kwarg.arg)
    a.kwonlyargs = [ast.arg(arg=p.arg) for p in a.kwonlyargs]
    params = ast.unparse(a)
    call = [p.arg for p in pos]
    if args.vararg:
        call.append("*" + args.vararg.arg)
    call += [f"{p.arg}={p.arg}" for p in args.kwonlyargs]
    if args.kwarg:
        call.append("**" + args.kwarg.arg)
    return Signature(params, ", ".join(call), [p.arg for p in pos])


def _indent(text: str, n: int) -> str:
    return textwrap.indent(text, " " * n)


def generated_launcher(name: str):
    """A placeholder for a function the generated module defines: an FX graph calls it by `name`, and
    `rewrite.render_graph` binds that name in the candidate (`_kc_generated`); calling the placeholder is an error."""
    def launcher(*a):
        raise RuntimeError("generated launcher placeholder")

    launcher.__name__ = launcher.__qualname__ = name
    launcher.__module__ = "kernelcraft_generated"
    launcher._kc_generated = True
    return launcher


def replace_by_launcher(gm, node, name: str, args, reduce: str) -> dict:
    """`node` replaced in gm.graph by a call to the generated launcher `name` (`args(graph)` its arguments, built
    just before the node; the node's uses move to the call); the region record of `rewrite.triton_kernels`,
    `reduce` naming what the kernel replaced."""
    g = gm.graph
    with g.inserting_before(node):
        call = g.call_function(generated_launcher(name), args(g))
    call.meta["tensor_meta"] = node.meta.get("tensor_meta")
    node.replace_all_uses_with(call)
    g.erase_node(node)
    return {"name": name, "ops": 0, "inputs": 1, "reduce": reduce}


def indent_block(text: str, n: int) -> str:
    """`text` dedented, its leading and trailing blank lines dropped, indented by n spaces (generated source)."""
    return textwrap.indent(textwrap.dedent(text).strip("\n"), " " * n)


def render(task_source: str, recipe, analysis=None, *, output_dtypes: list[str] | None = None,
           gpu: str | None = None) -> str:
    """The candidate source for `recipe` (an iterable of tokens, see `recipes.TOKENS`); `gpu`, the GPU product
    whose tuned configurations `tuned_gemm` prefers (None: any)."""
    recipe = set(recipe)
    ref, sig = reference_parts(task_source)
    rules = sorted(t.split(":", 1)[1] for t in recipe if t.startswith("rewrite:"))
    body = None
    if rules or "triton" in recipe or "tuned_gemm" in recipe:
        if analysis is None:
            raise ValueError("rewrite, triton and tuned_gemm recipes need the reference's analysis")
        variant = analysis.variant(rules)
        if variant is None:
            raise ValueError(f"no rendered variant for rewrites {rules}")
        if "triton" in recipe and "tuned_gemm" in recipe:
            raise ValueError("triton and tuned_gemm do not compose: each rewrites the forward its own way")
        body = variant["triton"] if "triton" in recipe else variant.get("gemm") if "tuned_gemm" in recipe else variant
        if body is None:
            raise ValueError(f"no {'GEMM region' if 'tuned_gemm' in recipe else 'Triton-fusible region'} in this variant")
    mode = next((t.split(":", 1)[1] for t in recipe if t.startswith("compile:")), None)
    out = [f"# kernelcraft recipe: {' + '.join(sorted(recipe)) or 'identity'}",
           "# Generated by `kernelcraft optimize --policy recipes`. The reference model is embedded unchanged;",
           "# ModelNew subclasses it (same parameters, same initialisation) and changes how forward runs.",
           ref, "", "# ---- generated " + "-" * 84, "import torch", ""]
    if body is not None and body.get("kernels"):
        out += [body["kernels"], ""]
    if "tuned_gemm" in recipe:
        out += _gemm_configs(body["regions"], gpu) + [""]
    if "cudagraph" in recipe:
        out += [_GRAPH_HELPER.strip(), ""]
    if body is not None:
        fn_src = body["code"]
        out += ["", "def _kc_make_forward():"] + ([_indent(body["prelude"], 4), ""] if body["prelude"] else [])
        out += [_indent(fn_src.rstrip(), 4), "    return forward", ""]
    out += ["", "class ModelNew(Model):"]
    doc = {"compile": f"torch.compile(mode={mode!r})" if mode else None,
           "cudagraph": "CUDA-graph replay" if "cudagraph" in recipe else None}
    what = ", ".join([f"rewrites: {', '.join(rules)}"] if rules else [])
    what = ", ".join(x for x in [what, "Triton-fused elementwise" if "triton" in recipe else "",
                                 f"{len(body['regions'])} tuned Triton GEMM(s)" if "tuned_gemm" in recipe else "",
                                 doc["compile"], doc["cudagraph"],
                                 "channels_last" if "channels_last" in recipe else "",
                                 "cudnn.benchmark" if "cudnn_benchmark" in recipe else "",
                                 "bf16 autocast" if "bf16" in recipe else ""] if x)
    out.append(f'    """The reference model, {what or "unchanged"}."""')
    out.append("")
    if body is not None:
        out += ["    _kc_body = _kc_make_forward()", ""]
    init = ["    def __init__(self, *args, **kwargs):", "        super().__init__(*args, **kwargs)"]
    if "channels_last" in recipe:
        init.append("        self.to(memory_format=torch.channels_last)")
    if mode and "cudagraph" in recipe:  # compiled kernels replayed as one graph: no per-kernel launches
        init.append(f"        self._kc_run = _KcCudaGraph(torch.compile(self._kc_inner, mode={mode!r}, dynamic=False))")
    elif mode:
        init.append(f"        self._kc_run = torch.compile(self._kc_inner, mode={mode!r}, dynamic=False)")
    elif "cudagraph" in recipe:
        init.append("        self._kc_run = _KcCudaGraph(self._kc_inner)")
    else:
        init.append("        self._kc_run = self._kc_inner")
    out += init + [""]
    call = sig.call
    inner = f"self._kc_body({call})" if body is not None else f"Model.forward(self{', ' if call else ''}{call})"
    out += [f"    def _kc_inner(self{', ' if sig.params else ''}{sig.params}):", f"        return {inner}", ""]
    out += _forward(sig, recipe, mode, output_dtypes)
    return "\n".join(out).rstrip() + "\n"


def _gemm_configs(regions: list[dict], gpu: str | None) -> list[str]:
    """`_KC_GEMM{i}_CONFIG = {...}` per GEMM region: the configuration `tunable.lookup_config` finds for its
    kernel and shape on `gpu`, with where it came from."""
    lines = []
    for i, r in enumerate(regions):
        m = tunable.Match.from_json(r["match"])
        config, origin = tunable.lookup_config(m.kernel, m.shape, gpu=gpu)
        cfg = ", ".join(f"{k!r}: {config[k]!r}" for k in tunable.KNOBS[m.kernel.kind])
        lines += [f"# {r['name']}: {' -> '.join(r['ops'])} ({m.kernel.key()}, shape {m.shape}); configuration: {origin}",
                  f"_KC_GEMM{i}_CONFIG = {{{cfg}}}"]
    return lines


def _forward(sig: Signature, recipe: set, mode: str | None, output_dtypes) -> list[str]:
    lines = [f"    def forward(self{', ' if sig.params else ''}{sig.params}):"]
    names = list(sig.names)
    if "channels_last" in recipe:
        for n in names:
            lines.append(f"        if isinstance({n}, torch.Tensor) and {n}.dim() == 4:")
            lines.append(f"            {n} = {n}.contiguous(memory_format=torch.channels_last)")
    call = f"self._kc_run({sig.call})"
    flags = []
    if "cudnn_benchmark" in recipe:
        flags.append("torch.backends.cudnn.benchmark")
    if mode == "reduce-overhead":
        lines.append("        torch.compiler.cudagraph_mark_step_begin()")
    ind = "        "
    if flags:
        lines.append(f"        _kc_saved = ({', '.join(flags)},)")
        for f in flags:
            lines.append(f"        {f} = True")
        lines.append("        try:")
        ind = "            "
    if "bf16" in recipe:
        dev = next((n for n in names), None)
        dev_expr = f"{dev}.device.type if isinstance({dev}, torch.Tensor) else 'cuda'" if dev else "'cuda'"
        lines.append(f"{ind}with torch.autocast(device_type={dev_expr}, dtype=torch.bfloat16):")
        lines.append(f"{ind}    out = {call}")
        dts = [d for d in (output_dtypes or []) if d]
        target = dts[0] if dts and len(set(dts)) == 1 else "torch.float32"
        lines.append(f"{ind}out = out.to({target}) if isinstance(out, torch.Tensor) else "
                     f"type(out)(o.to({target}) if isinstance(o, torch.Tensor) else o for o in out)")
        lines.append(f"{ind}return out")
    else:
        lines.append(f"{ind}return {call}")
    if flags:
        lines.append("        finally:")
        lines.append(f"            ({', '.join(flags)},) = _kc_saved")
    return lines
