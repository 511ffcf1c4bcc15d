"""Which tunable template a reference's forward is: FX graph -> `tunable.Match` (or nothing).

A match must cover the whole forward; anything unrecognised means no match, never a guess. Bindings are
source expressions over forward's parameters and `self.<attribute path>`. `epilogue_step`, one elementwise op
as a line of the GEMM epilogue, is shared with `gemmsplice` (GEMM regions inside a larger forward).
Rationale: docs/design/recipes.md#tunematch
"""
from __future__ import annotations

import math
import operator

from kernelcraft.search.recipes import tritonfuse
from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.tunable import DTYPE_BYTES, Kernel, Match, split_for


def _meta(n):
    tm = n.meta.get("tensor_meta") if hasattr(n, "meta") else None
    return tm if tm is not None and hasattr(tm, "shape") else None


def _dt(n) -> str | None:
    tm = _meta(n)
    name = str(tm.dtype).replace("torch.", "") if tm is not None else None
    return name if name in DTYPE_BYTES else None


def _arg(n, i: int, name: str, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


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
    for finder in (_match_gemm, _match_rownorm):
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


def _einsum_roles(eq: str):
    """(batched, b transposed) of a matrix-product equation: "PK,KN->PN" (P one or more letters, A's
    leading dims), "PK,NK->PN" (B transposed), "bMK,bKN->bMN" (a batch); else None."""
    if not isinstance(eq, str) or "->" not in eq or "." in eq:
        return None
    ins, out = eq.replace(" ", "").split("->")
    parts = ins.split(",")
    if len(parts) != 2 or len(set(out)) != len(out):
        return None
    a, b = parts
    if len(b) == 3 and len(a) == 3 and a[0] == b[0] == out[0] and len(out) == 3:  # bMK,bKN->bMN
        k, m, n = a[2], a[1], b[2]
        if b[1] == k and out[1:] == m + n and len({a[0], m, k, n}) == 4:
            return True, False
        return None
    if len(b) != 2 or len(a) < 2:
        return None
    lead, k = a[:-1], a[-1]
    if len(set(a)) != len(a) or k in out:
        return None
    if b[0] == k and b[1] not in a and out == lead + b[1]:
        return False, False
    if b[1] == k and b[0] not in a and out == lead + b[0]:
        return False, True
    return None


def _gemm_node(gm, model, n):
    """(a expr, b expr, a transposed, b transposed, batched, vector exprs, K, N) for a product node, else None."""
    torch = _torch()
    F = torch.nn.functional
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if type(mod) is not torch.nn.Linear or n.args[0].op != "placeholder" or n.args[0].target.startswith("*"):
            return None
        path = _attr_expr(n.target)
        vecs = [f"{path}.bias"] if mod.bias is not None else []
        return n.args[0].target, f"{path}.weight.t()", False, True, False, vecs, mod.in_features, mod.out_features
    if n.op == "call_function" and n.target in (F.linear, torch._C._nn.linear):
        x, w, b = _arg(n, 0, "input"), _arg(n, 1, "weight"), _arg(n, 2, "bias")
        if x.op != "placeholder" or x.target.startswith("*") or w.op != "get_attr" or (b is not None and b.op != "get_attr"):
            return None
        wshape = _meta(w).shape
        vecs = [_attr_expr(b.target)] if b is not None else []
        return x.target, f"{_attr_expr(w.target)}.t()", False, True, False, vecs, int(wshape[1]), int(wshape[0])
    if n.op == "call_function" and n.target is torch.einsum:
        operands = n.args[1:] if len(n.args) == 3 else (tuple(n.args[1]) if len(n.args) == 2 else ())
        roles = _einsum_roles(n.args[0]) if len(operands) == 2 and not n.kwargs else None
        if roles is None:
            return None
        batched, b_t = roles
        a, b = operands
        if not (hasattr(a, "op") and hasattr(b, "op")):
            return None
        return _product(gm, a, b, batched, b_t)
    is_bmm = (n.op == "call_function" and n.target is torch.bmm) or (n.op == "call_method" and n.target == "bmm")
    is_mm = ((n.op == "call_function" and n.target in (torch.matmul, torch.mm, operator.matmul))
             or (n.op == "call_method" and n.target in ("matmul", "mm")))
    if not (is_mm or is_bmm) or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    ra, rb = len(_meta(a).shape), len(_meta(b).shape)
    if ra == 3 and rb == 3 and tuple(_meta(a).shape)[0] == tuple(_meta(b).shape)[0]:
        return _product(gm, a, b, True, False)
    if is_bmm or rb != 2 or ra < 2:
        return None
    return _product(gm, a, b, False, False)


def _product(gm, a, b, batched: bool, b_t_eq: bool):
    """The operands of A @ B (or A @ B^T when the equation says so); A a placeholder (any rank >= 2, or the
    transpose of a 2-D one), B a 2-D placeholder or parameter (or its transpose); batched: both 3-D
    placeholders, one product per leading index."""
    if batched:
        if any(x.op != "placeholder" or x.target.startswith("*") for x in (a, b)):
            return None
        K, N = int(_meta(b).shape[1]), int(_meta(b).shape[2])
        return a.target, b.target, False, False, True, [], K, N
    if len(_meta(b).shape) != 2:
        return None
    if len(_meta(a).shape) == 2:
        a_expr, a_t = _operand_2d(gm, a)
    elif a.op == "placeholder" and not a.target.startswith("*"):
        a_expr, a_t = a.target, False
    else:
        return None
    b_expr, b_t = _operand_2d(gm, b)
    if a_expr is None or b_expr is None or (b_t and b_t_eq):
        return None
    if b_t_eq:  # the equation names B's transpose: B is (N, K)
        b_expr, b_t = f"{b_expr}.t()", True
        N, K = (int(d) for d in _meta(b).shape)
    else:
        K, N = (int(d) for d in _meta(b).shape)
    return a_expr, b_expr, a_t, b_t, False, [], K, N


def _triangle_of(n, src) -> tuple[str, int] | None:
    """("upper" | "lower", diagonal) when n is torch.triu/tril of src, else None."""
    torch = _torch()
    for tri, fn in (("upper", torch.triu), ("lower", torch.tril)):
        name = fn.__name__
        if _is_fn(n, (fn,), (name,)) and n.args[0] is src:
            d = _arg(n, 1, "diagonal", 0)
            if isinstance(d, int) and not isinstance(d, bool):
                return tri, d
    return None


def _is_param(n) -> bool:
    return n.op == "get_attr"


def epilogue_step(gm, n, names: dict, nvec: int, shape: tuple, dtype: str, N: int, vector_ok):
    """(expression, new vector operand nodes) of elementwise node `n` as one line of a GEMM epilogue, or None.

    `names` maps the values already in the epilogue (the product first) to their variable names; `n` must read
    at least one of them, have the product's shape and dtype, and take its other operands from finite
    scalars or vectors of shape (N,) or (1, N) of that dtype that `vector_ok(node)` accepts. New vectors are
    named v{nvec}, v{nvec + 1}, ... in the order returned. Nothing is changed when `n` cannot join."""
    low = tritonfuse._lowering(gm, n)
    if low is None or _meta(n) is None or _dt(n) != dtype or tuple(_meta(n).shape) != shape:
        return None
    operands, fn = low
    exprs, new = [], []
    for o in operands:
        if hasattr(o, "op"):
            if o in names:
                exprs.append(names[o])
            elif vector_ok(o) and _meta(o) is not None and _dt(o) == dtype \
                    and tuple(_meta(o).shape) in ((N,), (1, N)):
                exprs.append(f"v{nvec + len(new)}")
                new.append(o)
            else:
                return None
        elif isinstance(o, (int, float)) and not isinstance(o, bool) and math.isfinite(o):
            exprs.append(repr(float(o)))
        else:
            return None
    if not any(hasattr(o, "op") and o in names for o in operands):
        return None
    return fn(exprs), new


def _match_gemm(gm, model, out) -> Match | None:
    nodes = _compute_nodes(gm)
    at = next((i for i, n in enumerate(nodes) if _gemm_node(gm, model, n) is not None), None)
    if at is None:
        return None
    gnode = nodes[at]
    if any(n not in gnode.args or len(n.users) != 1 for n in nodes[:at]):  # only the operands' transposes
        return None
    a_expr, b_expr, a_t, b_t, batched, vecs, K, N = _gemm_node(gm, model, gnode)
    nodes = nodes[at:]
    shape, dtype = tuple(_meta(gnode).shape), _dt(gnode)
    if dtype is None or shape[-1] != N:
        return None
    if batched:
        nb, M = int(shape[0]), int(shape[1])
    else:
        nb, M = 1, 1
        for d in shape[:-1]:
            M *= int(d)
    if min(M, N, K) < 16:  # a matrix-vector product is memory-bound work for another kernel
        return None
    lines = ["acc = acc + v0"] if vecs else []
    names = {gnode: "acc"}
    tri, tri_diag = "", 0
    for n in nodes[1:]:
        last = names.get(n.args[0]) if n.args else None
        found = _triangle_of(n, n.args[0]) if n is out and last is not None else None
        if found is not None and (batched or len(shape) == 2):  # the last op only: f(0) need not be 0
            tri, tri_diag = found
            names[n] = last
            continue
        step = epilogue_step(gm, n, names, len(vecs), shape, dtype, N, _is_param)
        if step is None:
            return None
        expr, new_vecs = step
        vecs += [_attr_expr(o.target) for o in new_vecs]
        names[n] = f"e{len(lines)}"
        lines.append(f"{names[n]} = {expr}")
    if out not in names:
        return None
    lines.append(f"out = {names[out]}")
    epilogue = "\n".join(lines)
    plain = epilogue == "out = acc" and not vecs and not tri and not batched
    kernel = Kernel("gemm", dtype, epilogue=epilogue, vectors=len(vecs), b_trans=b_t, a_trans=a_t,
                    batched=batched, tri=tri, tri_diag=tri_diag, split_k=split_for(M, N, K) if plain else 1)
    binds = {"a": a_expr, "b": b_expr, "vectors": vecs}
    return Match(kernel, {"M": M, "N": N, "K": K, **({"batch": nb} if batched else {})}, binds)


# ---- row ops over the last dimension ---------------------------------------------------------------

def _is_fn(n, fns=(), methods=()):
    return (n.op == "call_function" and n.target in fns) or (n.op == "call_method" and n.target in methods)


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
