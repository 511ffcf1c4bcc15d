"""The rule `pool_linear`: an average pool over a linear map's output features pools the weights instead.

Exact in real arithmetic; the weights are pooled at every call (never folded at construction) and sizes are
read at run time, so the state_dict is the reference's and the perturbed-weights check still holds.
Rationale: docs/design/recipes.md#poollinear
"""
from __future__ import annotations

import operator

from kernelcraft.search.recipes.fxrules import _fn, _is_float, _meth, _shape, _torch
from kernelcraft.search.recipes.fxrules import _transposed_weight
from kernelcraft.search.recipes.reductions import _tiling_pool
from kernelcraft.search.recipes.simplify import _arg, _each_call, _module


def _linear(gm, g, lin):
    """(x, W as [out, in], bias or None) as graph nodes for a linear map y = lin(x), or None. Emits the nodes
    it needs before the current insertion point."""
    torch = _torch()
    mod = _module(gm, lin)
    if mod is not None:
        if not isinstance(mod, torch.nn.Linear) or len(lin.args) != 1 or lin.kwargs:
            return None
        return (lin.args[0], g.get_attr(f"{lin.target}.weight"),
                g.get_attr(f"{lin.target}.bias") if mod.bias is not None else None)
    if not _fn(lin, operator.matmul, torch.matmul, torch.mm) or len(lin.args) != 2 or lin.kwargs:
        return None
    x, w = lin.args
    if hasattr(w, "op") and w.op == "get_attr" and _shape(w) is not None and len(_shape(w)) == 2:
        return x, g.call_method("t", (w,)), None  # x @ W, W [in, out]
    wt = _transposed_weight(w)
    return (x, wt, None) if wt is not None else None  # x @ W.T, W [out, in]


def _features_view(p):
    """(y, d) when p is y itself (d None) or y.unsqueeze(d) with y's last dim still last, else None."""
    torch = _torch()
    if (_meth(p, "unsqueeze") or _fn(p, torch.unsqueeze)) and hasattr(p.args[0], "op"):
        y, d = p.args[0], _arg(p, 1, "dim")
        rank = len(_shape(y)) if _shape(y) is not None else None
        if not isinstance(d, int) or rank is None or (d if d >= 0 else d + rank + 1) >= rank:
            return None
        return (y, d) if len(y.users) == 1 else None
    return p, None


def _pool_one(gm, n) -> bool:
    torch = _torch()
    g = gm.graph
    pool = _tiling_pool(gm, n)
    if pool is None or pool[:2] != ("avg", 1) or not n.args or not hasattr(n.args[0], "op"):
        return False
    p = n.args[0]
    if len(p.users) != 1 or not _is_float(p):
        return False
    view = _features_view(p)
    if view is None or not hasattr(view[0], "op") or _shape(view[0]) is None:
        return False
    lin, d = view
    k = pool[2][0]
    with g.inserting_before(n):
        parts = _linear(gm, g, lin)
        if parts is None:
            return False
        x, w, b = parts
        keep = g.call_function(operator.mul, (g.call_function(operator.floordiv, (
            g.call_method("size", (w, 0)), k)), k))  # floor mode: the features the pool's windows cover
        rows = g.call_function(operator.getitem, (w, slice(None, keep, None)))
        wp = g.call_method("mean", (g.call_method("unflatten", (rows, 0, (-1, k))), 1))  # [out // k, in]
        y = g.call_function(torch.matmul, (x, g.call_method("t", (wp,))))
        if b is not None:
            bk = g.call_function(operator.getitem, (b, slice(None, keep, None)))
            y = g.call_function(operator.add, (y, g.call_method("mean", (g.call_method("view", (bk, -1, k)), 1))))
        if d is not None:
            y = g.call_method("unsqueeze", (y, d))
    wt = lin.args[1] if lin.op != "call_module" else None  # read before erasing: erase_node clears the args
    n.replace_all_uses_with(y)
    for dead in (n, p, lin) if d is not None else (n, lin):
        g.erase_node(dead)
    if wt is not None and wt.op != "get_attr" and not wt.users:
        g.erase_node(wt)  # the W.T the matmul read
    return True


def rule_pool_linear(gm) -> bool:
    return _each_call(gm, _pool_one)


RULES = {"pool_linear": rule_pool_linear}
