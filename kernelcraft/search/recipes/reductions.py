"""Rules about reductions and pools: reductions over size-1 dims, pointwise ops moved past the reductions/pools
that shrink their input, consecutive pools merged.

Same contract and exactness as `simplify`. Rules: `size1_reduce`, `sink_pointwise`, `pool_merge`; a move that
shrinks nothing is not made, and a reduction whose indices are read is left alone.
Rationale: docs/design/recipes.md#reductions
"""
from __future__ import annotations

import math
import operator

from kernelcraft.search.recipes.fxrules import _affine, _dtype, _fn, _is_float, _meth, _num, _shape, _torch
from kernelcraft.search.recipes.simplify import (_alive, _arg, _clamp_like, _each_call, _module, _owned_by_caller,
                                                 _replace_with, _torch_nn)

# ---- reductions over size-1 dims --------------------------------------------------------------------

_REDUCE_FNS = ("sum", "mean", "amax", "amin", "prod", "logsumexp")


def _reduce_op(n):
    """(kind, x, dims, keepdim) for a dim-reduction node (max/min: kind 'max'/'min', a (values, indices) tuple)."""
    torch = _torch()
    name = None
    if n.op == "call_method" and n.target in _REDUCE_FNS + ("max", "min"):
        name = n.target
    elif n.op == "call_function":
        for r in _REDUCE_FNS + ("max", "min"):
            if n.target is getattr(torch, r):
                name = r
    if name is None or not n.args or not hasattr(n.args[0], "op") or n.kwargs.get("dtype") is not None:
        return None
    if set(n.kwargs) - {"dim", "keepdim"}:
        return None
    dim, keep = _arg(n, 1, "dim"), _arg(n, 2, "keepdim", False)
    if name in ("max", "min") and not isinstance(dim, int):
        return None  # full reduction or the binary max/min
    dims = [dim] if isinstance(dim, int) else list(dim) if isinstance(dim, (list, tuple)) else None
    if not dims or not all(isinstance(d, int) for d in dims) or not isinstance(keep, bool):
        return None
    return name, n.args[0], dims, keep


def _values_users(n):
    """The nodes reading the values of a (values, indices) result, or None when the indices are read."""
    out = []
    for u in n.users:
        if _fn(u, operator.getitem) and u.args[1] == 0:
            out.append(u)
        elif _fn(u, getattr) and u.args[1] == "values":
            out.append(u)
        else:
            return None
    return out


def rule_size1_reduce(gm) -> bool:
    g, changed = gm.graph, False
    for n in list(g.nodes):
        if not _alive(n):
            continue
        red = _reduce_op(n)
        if red is None:
            continue
        kind, x, dims, keep = red
        shape = _shape(x)
        if shape is None or not _is_float(x) or not all(-len(shape) <= d < len(shape) for d in dims):
            continue
        norm = sorted({d % len(shape) for d in dims}, reverse=True)
        if any(shape[d] != 1 for d in norm) or len(norm) != len(dims):
            continue
        targets = [n] if kind not in ("max", "min") else _values_users(n)
        if not targets:
            continue
        with g.inserting_before(n):
            y = x
            if not keep:
                y = g.call_method("squeeze", (y, norm[0] if len(norm) == 1 else tuple(sorted(norm))))
        ok = False
        for tnode in targets:
            ok |= _replace_with(g, tnode, y)
        if kind in ("max", "min") and not n.users:
            g.erase_node(n)
        if not ok and y is not x and not y.users:
            g.erase_node(y)
        changed |= ok
    return changed


# ---- pointwise ops sunk past reductions and pools -----------------------------------------------------

def _pool_kind(gm, n):
    """'avg' | 'max' | None for a pooling node (padding 0 for averages, no indices, no divisor override)."""
    nn = _torch_nn()
    F = nn.functional
    mod = _module(gm, n)
    if mod is not None:
        if isinstance(mod, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
            return "avg"
        if isinstance(mod, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
            pad = mod.padding if isinstance(mod.padding, (tuple, list)) else (mod.padding,)
            ok = all(p == 0 for p in pad) and getattr(mod, "divisor_override", None) is None
            return "avg" if ok else None
        if isinstance(mod, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
                            nn.AdaptiveMaxPool3d)):
            return None if mod.return_indices else "max"
        return None
    if _fn(n, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d):
        return "avg"
    if _fn(n, F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d,
           F.adaptive_max_pool3d):
        return None if n.kwargs.get("return_indices") else "max"
    if _fn(n, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d):
        pad = _arg(n, 3, "padding", 0)
        pad = pad if isinstance(pad, (tuple, list)) else (pad,)
        ok = all(p == 0 for p in pad) and n.kwargs.get("divisor_override") is None and len(n.args) <= 4
        return "avg" if ok else None
    return None


def _monotone(gm, n):
    """x when n is a non-decreasing elementwise function of x alone (commutes with max), else None. An in-place
    one only when nothing else reads x and x is not the caller's: its mutation of x is then unobservable (the
    moved copy mutates the fresh pool output instead)."""
    torch = _torch()
    nn = _torch_nn()
    F = nn.functional
    if not n.args or not hasattr(n.args[0], "op") or _shape(n.args[0]) != _shape(n):
        return None
    x = n.args[0]
    mod = _module(gm, n)
    inplace = bool(getattr(mod, "inplace", False)) if mod is not None else bool(n.kwargs.get("inplace"))
    if inplace and (len(x.users) != 1 or _owned_by_caller(x)):
        return None
    if mod is not None:
        ok = isinstance(mod, (nn.ReLU, nn.Hardtanh, nn.Sigmoid, nn.Tanh, nn.Hardsigmoid, nn.Softplus)) \
            or (isinstance(mod, nn.ELU) and mod.alpha >= 0) \
            or (isinstance(mod, nn.LeakyReLU) and mod.negative_slope >= 0)
        return x if ok and len(n.args) == 1 and not n.kwargs else None
    if _clamp_like(gm, n) is not None or _fn(n, F.relu, F.relu6, F.hardtanh, F.hardsigmoid):
        return x
    if (_fn(n, torch.sigmoid, torch.tanh, torch.exp, F.sigmoid, F.tanh) or _meth(n, "sigmoid", "tanh", "exp")) \
            and len(n.args) == 1 and not n.kwargs:
        return x
    if _fn(n, F.leaky_relu, F.elu):
        slope = _arg(n, 1, "negative_slope" if n.target is F.leaky_relu else "alpha", 0.01 if n.target is F.leaky_relu else 1.0)
        return x if _num(slope) and slope >= 0 else None
    return None


def _numel(shape):
    return math.prod(shape) if shape is not None else None


def _sink_one(gm, n) -> bool:
    torch = _torch()
    g = gm.graph
    if not n.args or not hasattr(n.args[0], "op"):
        return False
    a = n.args[0]
    if len(a.users) != 1 or not _is_float(a):
        return False
    red = _reduce_op(n)
    pool = _pool_kind(gm, n) if red is None else None
    softmax = red is None and pool is None and (_fn(n, torch.softmax, torch.log_softmax,
                                                     torch.nn.functional.softmax, torch.nn.functional.log_softmax)
                                                 or _meth(n, "softmax", "log_softmax")) \
        and n.kwargs.get("dtype") is None and len(n.args) <= 2 and set(n.kwargs) <= {"dim", "dtype", "_stacklevel"}
    if red is None and pool is None and not softmax:
        return False
    kind = red[0] if red is not None else f"pool_{pool}" if pool is not None else "softmax"
    maxlike = kind in ("max", "min", "amax", "amin") or pool == "max"
    if kind in ("max", "min"):
        outs = _values_users(n)
        if not outs:
            return False
        out_shape = _shape(outs[0])
    else:
        outs, out_shape = [n], _shape(n)
    if not softmax and (out_shape is None or _shape(a) is None or _numel(out_shape) >= _numel(_shape(a))):
        return False  # nothing shrinks: moving the op gains nothing
    aff = _affine(a)
    param = None
    if aff is not None and _shape(aff[0]) == _shape(a) and _dtype(aff[0]) == _dtype(a):
        y, s, t = aff
        if s == 0 or not (math.isfinite(s) and math.isfinite(t)):
            return False
        if maxlike and s < 0:
            return False
        if kind == "sum" and t != 0:
            return False
        if kind in ("logsumexp", "softmax") and s != 1:
            return False
        if kind == "prod":
            return False
        mono = False
    else:
        y, s, t = None, 1.0, 0.0
        mono = maxlike and _monotone(gm, a) is not None
        if mono:
            y = _monotone(gm, a)
        elif kind == "mean" and red is not None:
            param = _param_shift(a, red)
            if param is None:
                return False
            y = param[0]
        else:
            return False
    with g.inserting_before(n):
        inner = g.node_copy(n, lambda m: y if m is a else m)
    for o in outs:
        with g.inserting_before(o):
            base = inner if o is n else g.node_copy(o, lambda m: inner if m is n else m)
            z = base
            if mono:
                z = g.node_copy(a, lambda m: base if m is y else m)
            elif param is not None:
                _, p, sign, p_first = param
                pm = g.call_method("mean", (p,))
                if p_first:
                    z = g.call_function(operator.sub if sign < 0 else operator.add, (pm, base))
                else:
                    z = g.call_function(operator.sub if sign < 0 else operator.add, (base, pm))
            elif kind == "softmax":
                pass
            else:
                if s != 1.0:
                    z = g.call_function(operator.mul, (z, s))
                if t != 0.0 and kind != "sum":
                    z = g.call_function(operator.add, (z, t))
        o.replace_all_uses_with(z)
        if o is not n:
            g.erase_node(o)
    if not n.users:
        g.erase_node(n)
    if not a.users:
        g.erase_node(a)
    return True


def _param_shift(a, red):
    """(y, p, sign, p_first) when a = y +/- p (or p +/- y) and p is a parameter/buffer that is constant
    along every dim the mean keeps: mean_D(y +/- p) = mean_D(y) +/- mean(p)."""
    torch = _torch()
    if len(a.args) != 2 or a.kwargs:
        return None
    if _fn(a, operator.add, torch.add) or _meth(a, "add"):
        sign = 1
    elif _fn(a, operator.sub, torch.sub) or _meth(a, "sub"):
        sign = -1
    else:
        return None
    l, r = a.args
    for y, p, p_first in ((l, r, False), (r, l, True)):
        if not (hasattr(y, "op") and hasattr(p, "op") and p.op == "get_attr"):
            continue
        ys, ps = _shape(y), _shape(p)
        if ys is None or ps is None or ys != _shape(a) or len(ps) > len(ys) or _dtype(p) != _dtype(y):
            continue
        if p_first and sign < 0:
            continue  # p - y: mean(p) - mean(y) is fine too, but keep the rule to the common forms
        kept = set(range(len(ys))) - {d % len(ys) for d in red[2]}
        off = len(ys) - len(ps)
        if all(ps[d - off] == 1 for d in kept if d >= off):
            return y, p, sign, p_first
    return None


def rule_sink_pointwise(gm) -> bool:
    changed = False
    for _ in range(8):  # a chain of k pointwise ops sinks one per pass
        moved = _each_call(gm, _sink_one)
        changed |= moved
        if not moved:
            break
    return changed


# ---- consecutive pools merged -------------------------------------------------------------------------

def _tuple(v, rank):
    if isinstance(v, int):
        return (v,) * rank
    return tuple(v) if isinstance(v, (tuple, list)) and len(v) == rank and all(isinstance(i, int) for i in v) \
        else None


def _tiling_pool(gm, n):
    """(kind, rank, kernel) for a pool whose windows tile its input: stride = kernel, no padding, dilation 1,
    floor mode, no indices and (averages) no divisor override; else None."""
    nn = _torch_nn()
    F = nn.functional
    mod = _module(gm, n)
    if mod is not None:
        name = next((c for c in ("MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d")
                     if type(mod) is getattr(nn, c)), None)  # torch.nn's own, not a look-alike of the same name
        if name is None:
            return None
        kind, rank = name[:3].lower(), int(name[-2])
        if len(n.args) != 1 or n.kwargs:
            return None
        p = {"kernel_size": mod.kernel_size, "stride": mod.stride, "padding": mod.padding,
             "dilation": getattr(mod, "dilation", 1), "ceil_mode": mod.ceil_mode,
             "return_indices": getattr(mod, "return_indices", False),
             "divisor_override": getattr(mod, "divisor_override", None)}
    else:
        fns = {F.max_pool1d: ("max", 1), F.max_pool2d: ("max", 2), F.max_pool3d: ("max", 3),
               F.avg_pool1d: ("avg", 1), F.avg_pool2d: ("avg", 2), F.avg_pool3d: ("avg", 3)}
        if n.op != "call_function" or n.target not in fns:
            return None
        kind, rank = fns[n.target]
        names = (("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices") if kind == "max"
                 else ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"))
        if len(n.args) > 1 + len(names) or set(n.kwargs) - set(names):
            return None
        p = {k: _arg(n, i + 1, k) for i, k in enumerate(names)}
    kernel = _tuple(p["kernel_size"], rank)
    stride = kernel if p["stride"] in (None, [], ()) else _tuple(p["stride"], rank)
    ok = kernel is not None and stride == kernel and _tuple(p["padding"] or 0, rank) == (0,) * rank \
        and _tuple(p.get("dilation") or 1, rank) == (1,) * rank and not p["ceil_mode"] \
        and not p.get("return_indices") and p.get("divisor_override") is None
    return (kind, rank, kernel) if ok else None


def _merge_pools(gm, n) -> bool:
    g = gm.graph
    if not n.args or not hasattr(n.args[0], "op"):
        return False
    a = n.args[0]
    outer, inner = _tiling_pool(gm, n), _tiling_pool(gm, a)
    if outer is None or inner is None or outer[:2] != inner[:2] or len(a.users) != 1 or not _is_float(a):
        return False
    if _shape(n) is None or not a.args or not hasattr(a.args[0], "op") or _shape(a.args[0]) is None:
        return False
    kind, rank = outer[:2]
    kernel = tuple(i * o for i, o in zip(inner[2], outer[2]))
    F = _torch_nn().functional
    fn = getattr(F, f"{kind}_pool{rank}d")
    with g.inserting_before(n):
        merged = g.call_function(fn, (a.args[0],), {"kernel_size": kernel, "stride": kernel})
    merged.meta = dict(n.meta)
    n.replace_all_uses_with(merged)
    g.erase_node(n)
    g.erase_node(a)
    return True


def rule_pool_merge(gm) -> bool:
    """pool_b(pool_a(x)) -> one pool, for two max pools or two average pools of the same rank whose windows
    tile their inputs (stride = kernel, no padding, dilation 1, floor mode): the windows nest, so the merged
    kernel is the product. floor(floor(D / a) / b) = floor(D / ab), so the output shape is the same; a max is
    exact and an average of equal-size averages is the average of their union. One pass over the input instead
    of two, and no intermediate."""
    return _each_call(gm, _merge_pools)


RULES = {"size1_reduce": rule_size1_reduce, "sink_pointwise": rule_sink_pointwise, "pool_merge": rule_pool_merge}
