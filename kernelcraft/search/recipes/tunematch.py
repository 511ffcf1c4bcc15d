"""Which tunable template a reference's forward is: FX graph -> `tunable.Match` (or nothing).

A match must cover the whole forward; anything unrecognised means no match, never a guess. Bindings are
source expressions over forward's parameters and `self.<attribute path>`. The product and its epilogue are
read by `gemmparts`, shared with `gemmsplice` (GEMM regions inside a larger forward).
Rationale: docs/design/recipes.md#tunematch
"""
from __future__ import annotations

import operator

from kernelcraft.search.recipes import rowscan
from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.gemmparts import (_arg, _dt, _is_fn, _meta, gemm_epilogue, gemm_kernel, gemm_size,
                                                  product_of)
from kernelcraft.search.recipes.tunable import Kernel, Match


def _last_dim(dim, rank: int) -> bool:
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return isinstance(dim, int) and dim in (-1, rank - 1)


def _attr_expr(target: str) -> str:
    return "self." + target


def _compute_nodes(gm):
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def _output(gm):
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    return out if hasattr(out, "op") else None


def match(gm, model) -> list[Match]:
    """The template instances covering gm's forward: [] or [one Match]."""
    out = _output(gm)
    if out is None or _meta(out) is None:
        return []
    for finder in (_match_gemm, _match_rownorm, rowscan.match_scan):
        try:
            m = finder(gm, model, out)
        except (AttributeError, TypeError, ValueError, KeyError, IndexError):
            m = None
        if m is not None:
            return [m]
    return []


# ---- gemm + epilogue -------------------------------------------------------------------------------

def _operand_2d(gm, n):
    """(expression, transposed?) of a 2-D matrix operand: a placeholder or parameter, or its transpose."""
    torch = _torch()
    if n.op == "placeholder":  # the argument's own name: FX renames nodes (argument `A` is node `a`)
        return (None if n.target.startswith("*") else n.target), False
    if n.op == "get_attr":
        return _attr_expr(n.target), False
    swap = ((0, 1), (1, 0), (-1, -2), (-2, -1))
    is_t = ((n.op == "call_method" and (n.target == "t" or (n.target == "transpose" and tuple(n.args[1:]) in swap)))
            or (n.op == "call_function" and n.target is getattr and n.args[1] == "T")
            or (n.op == "call_function" and n.target in (torch.t,)))
    if is_t:
        base, tr = _operand_2d(gm, n.args[0])
        if base is None or tr:
            return None, False
        return f"{base}.t()", True
    return None, False


def _gemm_node(gm, model, n):
    """(a expr, b expr, a transposed, b transposed, batched, vector exprs, K, N) for a product node whose operands
    are forward's parameters or the model's (or transposes of them), else None."""
    p = product_of(gm, n)
    if p is None:
        return None
    if p.linear:  # A the forward's input; B the transpose of a weight parameter, the bias a parameter too
        params = [x for x in (p.b, p.bias) if x is not None and not isinstance(x, str)]
        if p.a.op != "placeholder" or p.a.target.startswith("*") or any(x.op != "get_attr" for x in params):
            return None
        path = lambda x: _attr_expr(x if isinstance(x, str) else x.target)  # noqa: E731
        vecs = [path(p.bias)] if p.bias is not None else []
        return p.a.target, f"{path(p.b)}.t()", False, True, False, vecs, p.K, p.N
    if p.batched:
        if any(x.op != "placeholder" or x.target.startswith("*") for x in (p.a, p.b)):
            return None
        return p.a.target, p.b.target, False, False, True, [], p.K, p.N
    if len(_meta(p.a).shape) == 2:
        a_expr, a_t = _operand_2d(gm, p.a)
    elif p.a.op == "placeholder" and not p.a.target.startswith("*"):
        a_expr, a_t = p.a.target, False
    else:
        return None
    b_expr, b_t = _operand_2d(gm, p.b)
    if a_expr is None or b_expr is None or (b_t and p.b_named_t):
        return None
    if p.b_named_t:  # the equation names B's transpose
        b_expr, b_t = f"{b_expr}.t()", True
    return a_expr, b_expr, a_t, b_t, False, [], p.K, p.N


def _is_param(n) -> bool:
    return n.op == "get_attr"


def _match_gemm(gm, model, out) -> Match | None:
    nodes = _compute_nodes(gm)
    at = next((i for i, n in enumerate(nodes) if _gemm_node(gm, model, n) is not None), None)
    if at is None:
        return None
    gnode = nodes[at]
    if any(n not in gnode.args or len(n.users) != 1 for n in nodes[:at]):  # only the operands' transposes
        return None
    a_expr, b_expr, a_t, b_t, batched, vecs, K, N = _gemm_node(gm, model, gnode)
    shape, dtype = tuple(_meta(gnode).shape), _dt(gnode)
    size = gemm_size(shape, batched, N, K) if dtype is not None and shape[-1] == N else None
    epi = gemm_epilogue(gm, gnode, nodes[at + 1:], out, len(vecs), shape, dtype, N, batched, _is_param) if size else None
    if epi is None:
        return None
    lines, new, tri, tri_diag = epi
    vecs = vecs + [_attr_expr(o.target) for o in new]
    kernel = gemm_kernel(dtype, lines, len(vecs), a_t, b_t, batched, tri, tri_diag, size)
    return Match(kernel, size, {"a": a_expr, "b": b_expr, "vectors": vecs})


# ---- row ops over the last dimension ---------------------------------------------------------------


def _mean_or_sum_last(n, x, rank):
    """'mean' / 'sum' when n reduces x over the last dim with keepdim, else None."""
    torch = _torch()
    for kind, fns in (("mean", (torch.mean,)), ("sum", (torch.sum,))):
        if _is_fn(n, fns, (kind,)) and n.args[0] is x and _last_dim(_arg(n, 1, "dim"), rank) \
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


def _row_op(gm, model, out, x, rank):
    """(op, eps, weight expr, bias expr) for the row op producing `out` from placeholder x."""
    torch = _torch()
    F = torch.nn.functional
    if out.op == "call_module":
        mod = gm.get_submodule(out.target)
        if out.args[0] is not x:
            return None
        if isinstance(mod, (torch.nn.Softmax, torch.nn.LogSoftmax)) and _last_dim(mod.dim, rank):
            return ("softmax" if isinstance(mod, torch.nn.Softmax) else "log_softmax"), 0.0, None, None
        path = _attr_expr(out.target)
        if isinstance(mod, torch.nn.LayerNorm) and len(mod.normalized_shape) == 1:
            w = f"{path}.weight" if mod.weight is not None else None
            return "layernorm", float(mod.eps), w, f"{path}.bias" if mod.bias is not None else None
        if hasattr(torch.nn, "RMSNorm") and isinstance(mod, torch.nn.RMSNorm) and len(mod.normalized_shape) == 1:
            eps = mod.eps if mod.eps is not None else torch.finfo(_meta(x).dtype).eps
            return "rmsnorm", float(eps), f"{path}.weight" if mod.weight is not None else None, None
        return None
    for op, fns, meth in (("softmax", (torch.softmax, F.softmax), ("softmax",)),
                          ("log_softmax", (torch.log_softmax, F.log_softmax), ("log_softmax",))):
        if _is_fn(out, fns, meth) and out.args[0] is x and _last_dim(_arg(out, 1, "dim"), rank) \
                and _arg(out, 2, "dtype") is None and out.kwargs.get("dtype") is None:
            return op, 0.0, None, None
    if _is_fn(out, (F.layer_norm, torch.layer_norm)) and out.args[0] is x:
        ns, w, b = _arg(out, 1, "normalized_shape"), _arg(out, 2, "weight"), _arg(out, 3, "bias")
        if len(ns) != 1 or any(p is not None and p.op != "get_attr" for p in (w, b)):
            return None
        return ("layernorm", float(_arg(out, 4, "eps", 1e-5)), _attr_expr(w.target) if w is not None else None,
                _attr_expr(b.target) if b is not None else None)
    if _is_fn(out, (F.normalize,)) and out.args[0] is x and _arg(out, 1, "p", 2.0) == 2 \
            and _last_dim(_arg(out, 2, "dim", 1), rank):
        return "l2norm", float(_arg(out, 3, "eps", 1e-12)), None, None
    # written-out norms: [weight *] x (/ or *) f(stat)
    weight = None
    core = out
    if _is_fn(core, (operator.mul, torch.mul), ("mul",)):
        a, b = core.args[0], core.args[1]
        if hasattr(b, "op") and b.op == "get_attr" and tuple(_meta(b).shape) == (_meta(x).shape[-1],):
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
        if _mean_or_sum_last(red, red.args[0], rank) != "mean" or not _square_of(red.args[0], x):
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
            and _last_dim(_arg(s, 2, "dim"), rank) and _arg(s, 3, "keepdim", False) is True:
        return "l2norm", eps, None, None
    if eps == 0.0 and _mean_or_sum_last(s, s.args[0], rank) == "mean" and _is_fn(s.args[0], (torch.abs,), ("abs",)) \
            and s.args[0].args[0] is x:
        return "l1norm_mean", 0.0, None, None
    return None


def _match_rownorm(gm, model, out) -> Match | None:
    xs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(xs) != 1 or _meta(xs[0]) is None or xs[0].target.startswith("*"):
        return None
    x = xs[0]
    dtype, shape = _dt(x), tuple(int(d) for d in _meta(x).shape)
    if dtype is None or len(shape) < 2 or _dt(out) != dtype or tuple(_meta(out).shape) != shape:
        return None
    found = _row_op(gm, model, out, x, len(shape))
    if found is None:
        return None
    op, eps, w, b = found
    rows = 1
    for d in shape[:-1]:
        rows *= d
    kernel = Kernel("rownorm", dtype, op=op, eps=eps, weight=w is not None, bias=b is not None)
    binds = {"x": x.target, **({"weight": w} if w else {}), **({"bias": b} if b else {})}
    return Match(kernel, {"rows": rows, "cols": shape[-1]}, binds)
