"""Triton elementwise fusion: regions of elementwise FX nodes become one generated Triton kernel each.

A region (at least two ops, one floating dtype, rank <= 4, scalar constants only) becomes a kernel that reads
each input once and writes once; arithmetic in fp32, NaNs propagated like PyTorch's. A region (one op is
enough) whose only user is a full `sum`/`mean` to a scalar takes the reduction in: fp32 partial sums per
program, totalled by the launcher, and no intermediate tensor. Output is source text; the graph is changed
in place to call the launchers.
Rationale: docs/design/recipes.md#tritonfuse
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from kernelcraft.search.recipes.render import generated_launcher

BLOCK = 1024
MAX_RANK = 4
HEADER = "import triton\nimport triton.language as tl\n"  # what every generated kernel module starts with
REDUCE_PROGRAMS = 16384  # a full reduction's grid: about this many programs at most, each summing BLOCKS blocks
MAX_BLOCKS = 64  # ... of at most this many consecutive blocks


@dataclass
class Fused:
    source: str
    regions: list[dict] = field(default_factory=list)


def _lit(c) -> str:
    return repr(float(c))


def _max(a, b):
    return f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def _min(a, b):
    return f"tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"


def _tanh(x):
    return f"(2.0 * tl.sigmoid(2.0 * ({x})) - 1.0)"


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return f"(0.5 * ({x}) * (1.0 + {_tanh(f'0.7978845608028654 * (({x}) + 0.044715 * ({x}) * ({x}) * ({x}))')}))"
    return f"(0.5 * ({x}) * (1.0 + tl.erf(({x}) * 0.7071067811865476)))"


def _lowering(gm, n):
    """(operands, fn(exprs) -> str) for an elementwise node, else None. Operands: nodes or numbers."""
    import torch

    F = torch.nn.functional
    kw = dict(n.kwargs)
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if len(n.args) != 1 or n.kwargs:
            return None
        table = {
            torch.nn.ReLU: lambda e: _max(e[0], "0.0"),
            torch.nn.Sigmoid: lambda e: f"tl.sigmoid({e[0]})",
            torch.nn.Tanh: lambda e: _tanh(e[0]),
            torch.nn.SiLU: lambda e: f"(({e[0]}) * tl.sigmoid({e[0]}))",
            torch.nn.Hardswish: lambda e: f"(({e[0]}) * {_min(_max(f'({e[0]}) + 3.0', '0.0'), '6.0')} / 6.0)",
            torch.nn.ReLU6: lambda e: _min(_max(e[0], "0.0"), "6.0"),
        }
        if type(mod) in table:
            return [n.args[0]], table[type(mod)]
        if isinstance(mod, torch.nn.GELU):
            return [n.args[0]], lambda e: _gelu(e[0], mod.approximate)
        if isinstance(mod, torch.nn.LeakyReLU):
            s = _lit(mod.negative_slope)
            return [n.args[0]], lambda e: f"tl.where(({e[0]}) > 0.0, {e[0]}, ({e[0]}) * {s})"
        if isinstance(mod, torch.nn.Hardtanh):
            lo, hi = _lit(mod.min_val), _lit(mod.max_val)
            return [n.args[0]], lambda e: _min(_max(e[0], lo), hi)
        return None
    if n.op not in ("call_function", "call_method"):
        return None
    t, a = n.target, list(n.args)
    meth = n.op == "call_method"
    if kw.get("inplace", None) is False:
        kw.pop("inplace")
    py_unary = {F.relu: lambda e: _max(e[0], "0.0"), F.relu6: lambda e: _min(_max(e[0], "0.0"), "6.0"),
                F.silu: lambda e: f"(({e[0]}) * tl.sigmoid({e[0]}))",
                F.hardswish: lambda e: f"(({e[0]}) * {_min(_max(f'({e[0]}) + 3.0', '0.0'), '6.0')} / 6.0)",
                F.hardsigmoid: lambda e: _min(_max(f"({e[0]}) / 6.0 + 0.5", "0.0"), "1.0")}
    if not meth and t in py_unary and len(a) == 1 and not kw:
        return a, py_unary[t]
    if not meth and t is F.leaky_relu and len(a) <= 2 and set(kw) <= {"negative_slope"}:
        s = _lit(kw.get("negative_slope", a[1] if len(a) > 1 else 0.01))
        return a[:1], lambda e: f"tl.where(({e[0]}) > 0.0, {e[0]}, ({e[0]}) * {s})"

    def is_(fn, name=None):
        return (not meth and t is fn) or (meth and name is not None and t == name)

    binary = [(operator.add, torch.add, "add", "+"), (operator.sub, torch.sub, "sub", "-"),
              (operator.mul, torch.mul, "mul", "*"), (operator.truediv, torch.div, "div", "/")]
    for op_fn, torch_fn, name, sym in binary:
        if (is_(op_fn) or is_(torch_fn, name)) and len(a) == 2 and not kw:
            return a, lambda e, s=sym: f"(({e[0]}) {s} ({e[1]}))"
    unary = [(torch.relu, "relu", lambda e: _max(e[0], "0.0")),
             (torch.sigmoid, "sigmoid", lambda e: f"tl.sigmoid({e[0]})"),
             (torch.tanh, "tanh", lambda e: _tanh(e[0])),
             (torch.exp, "exp", lambda e: f"tl.exp({e[0]})"),
             (torch.abs, "abs", lambda e: f"tl.abs({e[0]})"),
             (torch.sqrt, "sqrt", lambda e: f"tl.sqrt({e[0]})"),
             (torch.rsqrt, "rsqrt", lambda e: f"tl.rsqrt({e[0]})"),
             (torch.square, "square", lambda e: f"(({e[0]}) * ({e[0]}))"),
             (operator.neg, "neg", lambda e: f"(-({e[0]}))"),
             (torch.neg, None, lambda e: f"(-({e[0]}))"),
             (torch._C._nn.silu, None, lambda e: f"(({e[0]}) * tl.sigmoid({e[0]}))"),
             (torch._C._nn.hardswish, None,
              lambda e: f"(({e[0]}) * {_min(_max(f'({e[0]}) + 3.0', '0.0'), '6.0')} / 6.0)")]
    for fn, name, low in unary:
        if (is_(fn, name)) and len(a) == 1 and not kw:
            return a, low
    if (is_(operator.pow) or is_(torch.pow, "pow")) and len(a) == 2 and not kw and _is_two(a[1]):
        return a[:1], lambda e: f"(({e[0]}) * ({e[0]}))"
    if is_(torch._C._nn.gelu) or is_(F.gelu):
        approx = kw.pop("approximate", a[1] if len(a) > 1 else "none")
        if kw or approx not in ("none", "tanh"):
            return None
        return a[:1], lambda e: _gelu(e[0], approx)
    if is_(torch.clamp, "clamp") or is_(torch.clip, "clip"):
        lo = kw.pop("min", a[1] if len(a) > 1 else None)
        hi = kw.pop("max", a[2] if len(a) > 2 else None)
        if kw or not all(v is None or (isinstance(v, (int, float)) and math.isfinite(v)) for v in (lo, hi)):
            return None

        def clamp(e, lo=lo, hi=hi):
            x = e[0]
            x = _max(x, _lit(lo)) if lo is not None else x
            return _min(x, _lit(hi)) if hi is not None else x
        return a[:1], clamp
    if (is_(torch.maximum, "maximum") or is_(torch.minimum, "minimum")) and len(a) == 2 and not kw:
        f = _max if t in (torch.maximum, "maximum") else _min
        return a, lambda e, f=f: f(e[0], e[1])
    if is_(torch._C._nn.leaky_relu) and not kw:
        s = _lit(a[1] if len(a) > 1 else 0.01)
        return a[:1], lambda e: f"tl.where(({e[0]}) > 0.0, {e[0]}, ({e[0]}) * {s})"
    return None


def _is_two(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 2


def _full_reduction(n, dtype):
    """"sum" or "mean" when n reduces all of its first argument to a 0-dim tensor of `dtype`, else None."""
    import torch

    if n.op == "call_function" and n.target in (torch.sum, torch.mean):
        kind = n.target.__name__
    elif n.op == "call_method" and n.target in ("sum", "mean"):
        kind = n.target
    else:
        return None
    if len(n.args) not in (1, 2) or (len(n.args) == 2 and n.args[1] is not None):
        return None
    if set(n.kwargs) - {"dim"} or n.kwargs.get("dim") is not None:
        return None
    tm = _tensor_meta(n)
    return kind if tm is not None and len(tm.shape) == 0 and tm.dtype == dtype else None


def _tensor_meta(n):
    tm = n.meta.get("tensor_meta") if hasattr(n, "meta") else None
    return tm if tm is not None and hasattr(tm, "shape") else None


def _eligible(gm, n):
    import torch

    tm = _tensor_meta(n)
    if tm is None or tm.dtype not in (torch.float32, torch.float16, torch.bfloat16) or len(tm.shape) > MAX_RANK:
        return None
    low = _lowering(gm, n)
    if low is None:
        return None
    for o in low[0]:
        if hasattr(o, "op"):
            otm = _tensor_meta(o)
            if otm is None or otm.dtype != tm.dtype:
                return None
        elif not (isinstance(o, (int, float)) and not isinstance(o, bool) and math.isfinite(o)):
            return None
    return low


def fuse(gm) -> Fused | None:
    """Replace each fusible elementwise region of gm.graph by a call to a generated Triton launcher."""
    g = gm.graph
    low = {n: _eligible(gm, n) for n in g.nodes}
    low = {n: v for n, v in low.items() if v is not None}
    region_of: dict = {}
    regions: list[list] = []
    for n in g.nodes:  # topological order
        if n not in low:
            continue
        members = [n]
        for o in low[n][0]:
            if hasattr(o, "op") and o in region_of and len(o.users) == 1:
                members = regions[region_of[o]] + members
                regions[region_of[o]] = []
        for m in members:
            region_of[m] = len(regions)
        regions.append(members)
    reduced = []  # (members, its full-reduction user or None, "sum" | "mean" | None)
    for r in regions:
        users = list(r[-1].users) if r else []
        kind = _full_reduction(users[0], _tensor_meta(r[-1]).dtype) if len(users) == 1 else None
        if len(r) >= 2 or (r and kind):
            reduced.append((r, users[0] if kind else None, kind))
    if not reduced:
        return None
    sources, info, fused = [], [], {}  # fused: a replaced node -> its launcher call
    for idx, (members, red, kind) in enumerate(reduced):
        src, launcher, inputs = _emit(idx, members, low, kind)
        inputs = [fused.get(i, i) for i in inputs]  # operands were read before earlier regions were replaced
        sources.append(src)
        out = red if red is not None else members[-1]
        with g.inserting_before(out):
            call = g.call_function(launcher, tuple(inputs))
        call.meta["tensor_meta"] = out.meta.get("tensor_meta")
        out.replace_all_uses_with(call)
        fused[out] = call
        for m in ([red] if red is not None else []) + list(reversed(members)):
            g.erase_node(m)
        info.append({"name": launcher.__name__, "ops": len(members), "inputs": len(inputs), "reduce": kind})
    g.lint()
    gm.recompile()
    return Fused(source=HEADER + "\n\n".join(sources), regions=info)


def _emit(idx: int, members: list, low: dict, reduce: str | None = None):
    """(source, launcher placeholder, inputs) of one region; with `reduce` ("sum" | "mean") the kernel writes
    one fp32 partial sum per program and the launcher returns their total (divided by n for mean)."""
    name = f"_kc_ew{idx}"
    inside = set(members)
    inputs, exprs, body = [], {}, []
    for m in members:
        operands, fn = low[m]
        args = []
        for o in operands:
            if not hasattr(o, "op"):
                args.append(_lit(o))
            elif o in inside:
                args.append(exprs[o])
            else:
                if o not in inputs:
                    inputs.append(o)
                args.append(f"x{inputs.index(o)}")
        var = f"v{len(body)}"
        body.append(f"{var} = {fn(args)}")
        exprs[m] = var
    k, value = len(inputs), exprs[members[-1]]
    ptrs = ", ".join(f"p{i}" for i in range(k))
    strides = ", ".join(f"s{i}_{d}" for i in range(k) for d in range(MAX_RANK))
    contig = ", ".join(f"C{i}: tl.constexpr" for i in range(k))
    per_elem = ["mask = offs < n", "i3 = offs % d3", "r = offs // d3", "i2 = r % d2", "r = r // d2",
                "i1 = r % d1", "i0 = r // d1"]
    for i in range(k):
        idx_expr = " + ".join(f"i{d} * s{i}_{d}" for d in range(MAX_RANK))
        per_elem += [f"if C{i}:", f"    x{i} = tl.load(p{i} + offs, mask=mask, other=0.0).to(tl.float32)", "else:",
                     f"    x{i} = tl.load(p{i} + ({idx_expr}), mask=mask, other=0.0).to(tl.float32)"]
    per_elem += body
    # the sizes are constexpr: the index arithmetic of a broadcast input divides by constants (multiply and shift,
    # size-1 dimensions folded away) instead of by run-time 64-bit values, which cost more than the memory traffic
    head = (f"def {name}_kernel({'part_ptr' if reduce else 'out_ptr'}, {ptrs}, n, d1: tl.constexpr, d2: tl.constexpr, "
            f"d3: tl.constexpr, {strides}, {contig}, ")
    if reduce:
        lines = ["@triton.jit", head + "BLOCK: tl.constexpr, BLOCKS: tl.constexpr):",
                 "    start = tl.program_id(0).to(tl.int64) * (BLOCKS * BLOCK)",
                 "    acc = tl.zeros([BLOCK], dtype=tl.float32)",
                 "    for b in range(BLOCKS):",
                 "        offs = start + b * BLOCK + tl.arange(0, BLOCK)"]
        lines += ["        " + ln for ln in per_elem]
        lines += [f"        acc += tl.where(mask, {value}, 0.0)",
                  "    tl.store(part_ptr + tl.program_id(0), tl.sum(acc, axis=0))"]
    else:
        lines = ["@triton.jit", head + "BLOCK: tl.constexpr):",
                 "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)"]
        lines += ["    " + ln for ln in per_elem]
        lines.append(f"    tl.store(out_ptr + offs, {value}.to(out_ptr.dtype.element_ty), mask=mask)")
    args = ", ".join(f"a{i}" for i in range(k))
    lines += [
        "",
        "",
        f"def {name}({args}):",
        f"    ins = ({args}{',' if k == 1 else ''})",
        "    shape = torch.broadcast_shapes(*(t.shape for t in ins))",
    ]
    if reduce:
        lines += ["    n = shape.numel()",
                  "    if n == 0:",
                  "        total = torch.zeros((), dtype=torch.float32, device=a0.device)",
                  f"        return {'(total / n)' if reduce == 'mean' else 'total'}.to(a0.dtype)"]
    else:
        lines += ["    out = torch.empty(shape, dtype=a0.dtype, device=a0.device)",
                  "    n = out.numel()",
                  "    if n == 0:",
                  "        return out"]
    lines += [
        f"    dims = [1] * ({MAX_RANK} - len(shape)) + list(shape)",
        "    strides, contig = [], []",
        "    for t in ins:",
        "        e = t.expand(shape)",
        f"        strides += [0] * ({MAX_RANK} - len(shape)) + list(e.stride())",
        "        contig.append(tuple(t.shape) == tuple(shape) and t.is_contiguous())",
    ]
    if reduce:  # each program sums BLOCKS consecutive blocks: at most about REDUCE_PROGRAMS programs
        lines += [
            f"    blocks = min({MAX_BLOCKS}, triton.next_power_of_2(triton.cdiv(n, {BLOCK * REDUCE_PROGRAMS})))",
            f"    grid = triton.cdiv(n, {BLOCK} * blocks)",
            "    partials = torch.empty(grid, dtype=torch.float32, device=a0.device)",
            f"    {name}_kernel[(grid,)](partials, *ins, n, dims[1], dims[2], dims[3], *strides, *contig,",
            f"        BLOCK={BLOCK}, BLOCKS=blocks, num_warps=4)",
            "    total = partials.sum()",
            f"    return {'(total / n)' if reduce == 'mean' else 'total'}.to(a0.dtype)",
        ]
    else:
        lines += [
            f"    {name}_kernel[(triton.cdiv(n, {BLOCK}),)](out, *ins, n, dims[1], dims[2], dims[3], *strides, *contig,",
            f"        BLOCK={BLOCK}, num_warps=4)",
            "    return out",
        ]
    return "\n".join(lines), generated_launcher(name), inputs
