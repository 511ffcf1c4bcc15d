"""Norms over a row as a row template: the FX match and the Triton source.

A row is the last dimension (softmax, log-softmax, LayerNorm, RMSNorm, L2/L1 normalisation), or, for a grouped
norm (`Kernel.groups`: GroupNorm, InstanceNorm), the channels of one group and their positions: x (B, C, ...)
read as B*groups rows, with the affine weight and bias per channel. One program per row; the row stays in
registers when one BLOCK_N tile covers it, otherwise its statistics are gathered in one pass (LayerNorm's by
Welford's update per lane, the lanes then combined exactly) and a second pass writes.
Invariants: a match covers the whole forward of one input; anything unrecognised is no match.
Rationale: docs/design/recipes.md#rownorm
"""
from __future__ import annotations

import math
import operator

from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.gemmparts import _arg, _attr_expr, _dim_is, _dt, _is_fn, _meta
from kernelcraft.search.recipes.render import indent_block
from kernelcraft.search.recipes.tunable import KNOBS, Kernel, Match, channel_tile


# ---- the Triton source -----------------------------------------------------------------------------

_GROUP_ARGS = """
per_group = params[0].numel() // {g}  # channels per group; the affine vectors have one value per channel
groups = (per_group, N // per_group)  # and the positions of one channel"""


def _row_parts(kernel: Kernel) -> tuple[str, str, str]:
    """(one-tile body, looped statistics, looped output expression) for the row op."""
    eps = repr(float(kernel.eps))
    op = kernel.op
    if op in ("softmax", "log_softmax"):
        out = "e / s" if op == "softmax" else "(x - m) - tl.log(s)"
        one = f'''
x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
m = tl.max(x, 0)
e = tl.exp(x - m)
s = tl.sum(e, 0)
y = {out}'''
        stats = '''
m_vec = tl.full([BLOCK_N], -float("inf"), tl.float32)
s_vec = tl.zeros([BLOCK_N], dtype=tl.float32)
for off in range(0, N, BLOCK_N):
    c = off + cols
    x = tl.load(x_row + c, mask=c < N, other=-float("inf")).to(tl.float32)
    m_new = tl.maximum(m_vec, x)
    s_vec = s_vec * tl.exp(m_vec - m_new) + tl.exp(x - m_new)
    m_vec = m_new
m = tl.max(m_vec, 0)
s = tl.sum(s_vec * tl.exp(m_vec - m), 0)'''
        loop_out = "tl.exp(x - m) / s" if op == "softmax" else "(x - m) - tl.log(s)"
        return one, stats, loop_out
    if op == "layernorm":
        one = f'''
x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
mean = tl.sum(x, 0) / N
d = tl.where(mask, x - mean, 0.0)
rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + {eps})
y = d * rstd'''
        stats = f'''
m_vec = tl.zeros([BLOCK_N], dtype=tl.float32)
q_vec = tl.zeros([BLOCK_N], dtype=tl.float32)
n_vec = tl.zeros([BLOCK_N], dtype=tl.float32)
for off in range(0, N, BLOCK_N):
    c = off + cols
    live = c < N
    x = tl.load(x_row + c, mask=live, other=0.0).to(tl.float32)
    n_vec += tl.where(live, 1.0, 0.0)
    d = tl.where(live, x - m_vec, 0.0)
    m_vec += d / tl.maximum(n_vec, 1.0)
    q_vec += d * tl.where(live, x - m_vec, 0.0)
mean = tl.sum(m_vec * n_vec, 0) / N  # the lanes' (count, mean, squared deviations) combined exactly
dm = m_vec - mean
q = tl.sum(q_vec + n_vec * dm * dm, 0)
rstd = 1.0 / tl.sqrt(q / N + {eps})'''
        return one, stats, "(x - mean) * rstd"
    # sum-based norms: one statistic, then x scaled by it
    reduce_expr, scale = {
        "rmsnorm": ("x * x", f"1.0 / tl.sqrt(r / N + {eps})"),
        "l2norm": ("x * x", f"1.0 / tl.maximum(tl.sqrt(r), {eps})"),
        "l1norm_mean": ("tl.abs(x)", "1.0 / (r / N)"),
    }[op]
    one = f'''
x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
r = tl.sum({reduce_expr}, 0)
inv = {scale}
y = x * inv'''
    stats = f'''
acc = tl.zeros([BLOCK_N], dtype=tl.float32)
for off in range(0, N, BLOCK_N):
    c = off + cols
    x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)
    acc += {reduce_expr}
r = tl.sum(acc, 0)
inv = {scale}'''
    return one, stats, "x * inv"


def source(kernel: Kernel) -> str:
    if kernel.channels:
        return _channel_source(kernel)
    one, stats, loop_out = _row_parts(kernel)
    ptrs = "".join(p for p, on in (("w_ptr, ", kernel.weight), ("b_ptr, ", kernel.bias)) if on)

    grouped = kernel.groups and (kernel.weight or kernel.bias)  # the affine is per channel, not per column

    def affine(mask: str, c: str) -> str:
        lines = [f"ch = (row % {kernel.groups}) * CPG + {c} // S"] if grouped else []
        at = "ch" if grouped else c
        if kernel.weight:
            lines.append(f"y = y * tl.load(w_ptr + {at}, mask={mask}, other=0.0).to(tl.float32)")
        if kernel.bias:
            lines.append(f"y = y + tl.load(b_ptr + {at}, mask={mask}, other=0.0).to(tl.float32)")
        return "\n".join(lines)
    load_out = "x = tl.load(x_row + c, mask=c < N, other=0.0).to(tl.float32)"
    store = "tl.store(y_row + {c}, y.to(y_ptr.dtype.element_ty), mask={m})"
    one_tile = one.strip("\n") + "\n" + affine("mask", "cols") + "\n" + store.format(c="cols", m="mask")
    loop_write = (f"for off in range(0, N, BLOCK_N):\n    c = off + cols\n    {load_out}\n    y = {loop_out}\n"
                  + indent_block(affine("c < N", "c"), 4) + "\n    " + store.format(c="c", m="c < N"))
    names = ", ".join(n for n, on in (("weight", kernel.weight), ("bias", kernel.bias)) if on)
    what = (f"The norm of x (batch, channels, ...) over {kernel.groups} groups of channels per sample" if kernel.groups
            else "The row op over the last dimension of x")
    group_args = "CPG, S, " if grouped else ""
    return f'''
@triton.jit
def _kc_row_kernel(x_ptr, y_ptr, {ptrs}stride_x, stride_y, {group_args}N: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    if BLOCK_N >= N:
        mask = cols < N
{indent_block(one_tile, 8)}
    else:
{indent_block(stats, 8)}
{indent_block(loop_write, 8)}


def _kc_launch(x, y, params, BLOCK_N, num_warps, num_stages):
    """(grid, positional arguments, compile-time options) of one launch; reads shapes and strides only."""
    rows, N = x.shape
    if x.stride(1) != 1 or y.stride(1) != 1 or len(params) != {int(kernel.weight) + int(kernel.bias)}:
        raise ValueError("kernelcraft rownorm: operands do not fit this kernel")
{indent_block(_GROUP_ARGS.format(g=kernel.groups) if grouped else "groups = ()", 4)}
    return (rows,), (x, y, *params, x.stride(0), y.stride(0), *groups), dict(N=N, BLOCK_N=BLOCK_N,
                                                                              num_warps=num_warps, num_stages=num_stages)


def _kc_run(x, params, config):
    """{what}{f" (affine: {names})" if names else ""}."""
    shape = x.shape
    x = x.reshape({f"shape[0] * {kernel.groups}, -1" if kernel.groups else "-1, shape[-1]"})
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    params = tuple(p.reshape(-1).contiguous() for p in params)
    grid, args, meta = _kc_launch(x, y, params, **config)
    _kc_row_kernel[grid](*args, **meta)
    return y.reshape(shape)
'''


def _channel_source(kernel: Kernel) -> str:
    """The op over dimension 1 of x (B, C, positions): a program is one tile of all C channels by BLOCK_N / C
    consecutive positions of one sample (contiguous loads along the positions), reduced over the channels
    with the row op's one-tile body (its reductions over axis 0 give one statistic per position)."""
    one, _, _ = _row_parts(kernel)
    store = "tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)"
    return f'''
@triton.jit
def _kc_row_kernel(x_ptr, y_ptr, S, blocks_s, stride_b, N: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    pid = tl.program_id(0)
    sample = (pid // blocks_s).to(tl.int64)
    pos = (pid % blocks_s) * BLOCK_S + tl.arange(0, BLOCK_S)
    ch = tl.arange(0, BLOCK_C)
    x_row = x_ptr + sample * stride_b
    y_row = y_ptr + sample * stride_b
    cols = ch[:, None] * S + pos[None, :]
    mask = (ch[:, None] < N) & (pos[None, :] < S)
{indent_block(one.strip(chr(10)) + chr(10) + store, 4)}


def _kc_launch(x, y, params, BLOCK_N, num_warps, num_stages):
    """(grid, positional arguments, compile-time options) of one launch; reads shapes and strides only."""
    B, C, S = x.shape
    block_c = triton.next_power_of_2(C)
    block_s = BLOCK_N // block_c
    if not x.is_contiguous() or not y.is_contiguous() or params or block_s < 1 or C * S >= 2 ** 31:
        raise ValueError("kernelcraft channel norm: operands do not fit this kernel")
    blocks_s = triton.cdiv(S, block_s)
    return (B * blocks_s,), (x, y, S, blocks_s, x.stride(0)), dict(N=C, BLOCK_C=block_c, BLOCK_S=block_s,
                                                                    num_warps=num_warps, num_stages=num_stages)


def _kc_run(x, params, config):
    """The {kernel.op} over dimension 1 of x at each position."""
    shape = x.shape
    x = x.reshape(shape[0], shape[1], -1)
    if not x.is_contiguous():
        x = x.contiguous()
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    grid, args, meta = _kc_launch(x, y, params, **config)
    _kc_row_kernel[grid](*args, **meta)
    return y.reshape(shape)
'''


def forward_call(match: Match) -> str:
    b = match.bindings
    params = "".join(f"{b[k]}, " for k in ("weight", "bias") if b.get(k))
    return f"_kc_run({b['x']}, ({params}), _KC_CONFIG)"


# ---- the FX match ----------------------------------------------------------------------------------

def _mean_or_sum(n, x, rank, axis):
    """'mean' / 'sum' when n reduces x over dimension `axis` with keepdim, else None."""
    torch = _torch()
    for kind, fns in (("mean", (torch.mean,)), ("sum", (torch.sum,))):
        if _is_fn(n, fns, (kind,)) and n.args[0] is x and _dim_is(_arg(n, 1, "dim"), rank, axis) \
                and _arg(n, 2, "keepdim", False) is True:
            return kind
    return None


def _square_of(n, x) -> bool:
    torch = _torch()
    if _is_fn(n, (operator.mul, torch.mul), ("mul",)) and n.args[0] is x and n.args[1] is x:
        return True
    if _is_fn(n, (operator.pow, torch.pow), ("pow",)) and n.args[0] is x and n.args[1] == 2:
        return True
    return _is_fn(n, (torch.square,), ("square",)) and n.args[0] is x


def _row_op(gm, model, out, x, rank, axis):
    """(op, eps, weight expr, bias expr) for the row op over dimension `axis` producing `out` from placeholder x
    (LayerNorm and RMSNorm modules, and a weight, only over the last dimension)."""
    torch = _torch()
    F = torch.nn.functional
    last = axis == rank - 1

    def on_axis(dim) -> bool:
        return _dim_is(dim, rank, axis)
    if out.op == "call_module":
        mod = gm.get_submodule(out.target)
        if out.args[0] is not x:
            return None
        if isinstance(mod, (torch.nn.Softmax, torch.nn.LogSoftmax)) and on_axis(mod.dim):
            return ("softmax" if isinstance(mod, torch.nn.Softmax) else "log_softmax"), 0.0, None, None
        path = _attr_expr(out.target)
        if not last:
            return None
        if isinstance(mod, torch.nn.LayerNorm) and len(mod.normalized_shape) == 1:
            w = f"{path}.weight" if mod.weight is not None else None
            return "layernorm", float(mod.eps), w, f"{path}.bias" if mod.bias is not None else None
        if hasattr(torch.nn, "RMSNorm") and isinstance(mod, torch.nn.RMSNorm) and len(mod.normalized_shape) == 1:
            eps = mod.eps if mod.eps is not None else torch.finfo(_meta(x).dtype).eps
            return "rmsnorm", float(eps), f"{path}.weight" if mod.weight is not None else None, None
        return None
    for op, fns, meth in (("softmax", (torch.softmax, F.softmax), ("softmax",)),
                          ("log_softmax", (torch.log_softmax, F.log_softmax), ("log_softmax",))):
        if _is_fn(out, fns, meth) and out.args[0] is x and on_axis(_arg(out, 1, "dim")) \
                and _arg(out, 2, "dtype") is None and out.kwargs.get("dtype") is None:
            return op, 0.0, None, None
    if _is_fn(out, (F.layer_norm, torch.layer_norm)) and out.args[0] is x and last:
        ns, w, b = _arg(out, 1, "normalized_shape"), _arg(out, 2, "weight"), _arg(out, 3, "bias")
        if len(ns) != 1 or any(p is not None and p.op != "get_attr" for p in (w, b)):
            return None
        return ("layernorm", float(_arg(out, 4, "eps", 1e-5)), _attr_expr(w.target) if w is not None else None,
                _attr_expr(b.target) if b is not None else None)
    if _is_fn(out, (F.normalize,)) and out.args[0] is x and _arg(out, 1, "p", 2.0) == 2 \
            and on_axis(_arg(out, 2, "dim", 1)):
        return "l2norm", float(_arg(out, 3, "eps", 1e-12)), None, None
    # written-out norms: [weight *] x (/ or *) f(stat)
    weight = None
    core = out
    if _is_fn(core, (operator.mul, torch.mul), ("mul",)):
        a, b = core.args[0], core.args[1]
        if last and hasattr(b, "op") and b.op == "get_attr" and tuple(_meta(b).shape) == (_meta(x).shape[-1],):
            weight, core = _attr_expr(b.target), a
    if not _is_fn(core, (operator.truediv, torch.div, operator.mul, torch.mul), ("div", "mul")) or core.args[0] is not x:
        return None
    dividing = core.target in (operator.truediv, torch.div, "div")
    s = core.args[1]
    if not hasattr(s, "op"):
        return None
    if not dividing:  # x * rsqrt(mean(x*x) + eps)
        if not _is_fn(s, (torch.rsqrt,), ("rsqrt",)):
            return None
        inner = s.args[0]
    elif _is_fn(s, (torch.sqrt,), ("sqrt",)):
        inner = s.args[0]
    else:
        inner = None
    if inner is not None:  # rmsnorm: (mean(x*x) + eps)
        if not _is_fn(inner, (operator.add, torch.add), ("add",)) or not isinstance(inner.args[1], (int, float)):
            return None
        red = inner.args[0]
        if _mean_or_sum(red, red.args[0], rank, axis) != "mean" or not _square_of(red.args[0], x):
            return None
        return "rmsnorm", float(inner.args[1]), weight, None
    if weight is not None:
        return None
    eps = 0.0
    if _is_fn(s, (torch.clamp, torch.clamp_min), ("clamp_min", "clamp")):
        lo = _arg(s, 1, "min")
        if not isinstance(lo, (int, float)) or _arg(s, 2, "max") is not None:
            return None
        eps, s = float(lo), s.args[0]
    if _is_fn(s, (torch.linalg.vector_norm, torch.norm), ("norm",)) and s.args[0] is x \
            and _arg(s, 1, "ord" if s.target is torch.linalg.vector_norm else "p", 2) in (2, 2.0) \
            and on_axis(_arg(s, 2, "dim")) and _arg(s, 3, "keepdim", False) is True:
        return "l2norm", eps, None, None
    if eps == 0.0 and _mean_or_sum(s, s.args[0], rank, axis) == "mean" and _is_fn(s.args[0], (torch.abs,), ("abs",)) \
            and s.args[0].args[0] is x:
        return "l1norm_mean", 0.0, None, None
    return None


def match_norm(gm, model, out) -> Match | None:
    xs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(xs) != 1 or _meta(xs[0]) is None or xs[0].target.startswith("*"):
        return None
    x = xs[0]
    dtype, shape = _dt(x), tuple(int(d) for d in _meta(x).shape)
    if dtype is None or len(shape) < 2 or _dt(out) != dtype or tuple(_meta(out).shape) != shape:
        return None
    total, groups, channels = math.prod(shape), 0, False
    found = _grouped_norm(gm, out, x, shape)
    if found is not None:
        groups, eps, w, b = found
        op, rows = "layernorm", shape[0] * groups
    else:
        found = _row_op(gm, model, out, x, len(shape), len(shape) - 1)
        rows = total // shape[-1]
        if found is None and len(shape) >= 3 and channel_tile(shape[1]) <= max(KNOBS["rownorm"]["BLOCK_N"]):
            found = _row_op(gm, model, out, x, len(shape), 1)  # over the channels of (B, C, ...)
            rows, channels = total // shape[1], True
        if found is None:
            return None
        op, eps, w, b = found
    kernel = Kernel("rownorm", dtype, op=op, eps=eps, weight=w is not None, bias=b is not None, groups=groups,
                    channels=channels)
    binds = {"x": x.target, **({"weight": w} if w else {}), **({"bias": b} if b else {})}
    return Match(kernel, {"rows": rows, "cols": total // rows}, binds)


def _grouped_norm(gm, out, x, shape):
    """(groups, eps, weight expr, bias expr) when `out` is nn.GroupNorm or nn.InstanceNorm1d/2d/3d of x
    (batch statistics only: an InstanceNorm that tracks running statistics is left alone), else None."""
    torch = _torch()
    if out.op != "call_module" or out.args[0] is not x or len(out.args) != 1 or len(shape) < 2:
        return None
    mod = gm.get_submodule(out.target)
    path = _attr_expr(out.target)
    if isinstance(mod, torch.nn.GroupNorm):
        groups, affine = mod.num_groups, mod.affine
        if shape[1] != mod.num_channels or shape[1] % groups:
            return None
    elif isinstance(mod, (torch.nn.InstanceNorm1d, torch.nn.InstanceNorm2d, torch.nn.InstanceNorm3d)):
        spatial = {torch.nn.InstanceNorm1d: 1, torch.nn.InstanceNorm2d: 2, torch.nn.InstanceNorm3d: 3}[type(mod)]
        if mod.track_running_stats or len(shape) != spatial + 2 or (mod.affine and shape[1] != mod.num_features):
            return None
        groups, affine = shape[1], mod.affine
    else:
        return None
    if affine:
        return groups, float(mod.eps), f"{path}.weight", f"{path}.bias"
    return groups, float(mod.eps), None, None
