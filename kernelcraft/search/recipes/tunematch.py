"""Which tunable template a reference's forward is: FX graph -> `tunable.Match` (or nothing).

A match must cover the whole forward; anything unrecognised means no match, never a guess. Bindings are
source expressions over forward's parameters and `self.<attribute path>`. The product and its epilogue are
read by `gemmparts`, shared with `gemmsplice` (GEMM regions inside a larger forward).
Rationale: docs/design/recipes.md#tunematch
"""
from __future__ import annotations

import operator

from kernelcraft.search.recipes import rownorm, rowscan
from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.gemmparts import (_arg, _attr_expr, _dt, _is_fn, _meta, gemm_epilogue, gemm_kernel,
                                                  gemm_size, product_of)
from kernelcraft.search.recipes.tunable import Kernel, Match


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
    for finder in (_match_gemm, rownorm.match_norm, rowscan.match_scan):
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
