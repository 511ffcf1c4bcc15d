"""Simplification rules for level-2-style op chains: identities and redundant clamps (and the helpers
`reductions` and `activations` share: aliasing checks, clamp-likes).

Same contract as `fxrules`; exact in real arithmetic, never a dtype change, no sizes baked into the output;
parameters and buffers are never folded, and a replacement never hands back a caller-owned tensor where the
reference returned a fresh one. Rules: `identities`, `clamp_chain`.
Rationale: docs/design/recipes.md#simplify
"""
from __future__ import annotations

import math
import operator

from kernelcraft.search.recipes.fxrules import _affine, _dtype, _fn, _impure, _is_float, _meth, _num, _shape, _torch


_VIEWS = {"view", "reshape", "transpose", "permute", "expand", "squeeze", "unsqueeze", "t", "flatten", "narrow",
          "select", "detach", "contiguous", "view_as", "expand_as", "unflatten"}
_INF = math.inf


def _alive(n) -> bool:
    return not getattr(n, "_erased", False)


def _each_call(gm, rewrite_one) -> bool:
    """One pass of a node-local rule: `rewrite_one(gm, n)` on every call node still in the graph, in order;
    whether any of them changed it."""
    changed = False
    for n in list(gm.graph.nodes):
        if _alive(n) and n.op.startswith("call") and rewrite_one(gm, n):
            changed = True
    return changed


def _torch_nn():
    return _torch().nn


def _is_view(n) -> bool:
    torch = _torch()
    if n.op == "call_method":
        return n.target in _VIEWS
    if n.op == "call_function":
        return n.target in (operator.getitem, getattr) or any(
            n.target is getattr(torch, v, None) for v in _VIEWS) or n.target is torch.detach
    return False


def _owned_by_caller(n) -> bool:
    """n is (a view of) an input, a parameter or a buffer."""
    seen = 0
    while hasattr(n, "op") and seen < 64:
        if n.op in ("placeholder", "get_attr"):
            return True
        if not _is_view(n) or not n.args or not hasattr(n.args[0], "op"):
            return False
        n, seen = n.args[0], seen + 1
    return False


def _reaches_output(n) -> bool:
    """n, or a view of it (through any chain of views), is returned by the graph."""
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for u in m.users:
            if u.op == "output":
                return True
            if _is_view(u):
                todo.append(u)
    return False


def _replace_with(g, old, new) -> bool:
    """Use `new` for `old` everywhere; refused (False) when that would return a caller-owned tensor."""
    if _owned_by_caller(new) and _reaches_output(old):
        return False
    old.replace_all_uses_with(new)
    if not old.users:
        g.erase_node(old)
    return True


def _arg(n, i, name, default=None):
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def _module(gm, n):
    return gm.get_submodule(n.target) if n.op == "call_module" else None


def _pure(gm) -> bool:
    return not any(_impure(gm, n) for n in gm.graph.nodes if n.op.startswith("call"))


# ---- identities ------------------------------------------------------------------------------------

def _dropout_p0(gm, n) -> bool:
    nn = _torch_nn()
    F = nn.functional
    mod = _module(gm, n)
    if mod is not None:
        return isinstance(mod, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)) and mod.p == 0
    if _fn(n, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout):
        p = _arg(n, 1, "p", 0.5)
        return _num(p) and p == 0
    return False


def _perm(n):
    """The permutation a transpose-like node applies (over its input's rank), else None."""
    torch = _torch()
    if not n.args or not hasattr(n.args[0], "op"):
        return None
    shape = _shape(n.args[0])
    if shape is None:
        return None
    rank = len(shape)
    if (_meth(n, "t") or _fn(n, torch.t)) and rank == 2 and len(n.args) == 1:
        return [1, 0]
    if _fn(n, getattr) and len(n.args) == 2 and n.args[1] == "T" and rank == 2:
        return [1, 0]
    if (_meth(n, "transpose") or _fn(n, torch.transpose)) and len(n.args) == 3 and not n.kwargs:
        a, b = n.args[1], n.args[2]
        if isinstance(a, int) and isinstance(b, int) and -rank <= a < rank and -rank <= b < rank:
            p = list(range(rank))
            p[a % rank], p[b % rank] = p[b % rank], p[a % rank]
            return p
    if (_meth(n, "permute") or _fn(n, torch.permute)) and not n.kwargs:
        dims = n.args[1:] if n.op == "call_method" else n.args[1:2]
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = dims[0]
        if len(dims) == rank and all(isinstance(d, int) for d in dims):
            p = [d % rank for d in dims]
            return p if sorted(p) == list(range(rank)) else None
    return None


def _scalar_identity(n):
    """x for x*1, 1*x, x/1, x+0, 0+x, x-0 on a floating x of the result's shape and dtype."""
    torch = _torch()
    if len(n.args) != 2 or n.kwargs or not _is_float(n):
        return None
    a, b = n.args
    x, c = (a, b) if hasattr(a, "op") else (b, a)
    if not hasattr(x, "op") or not _num(c) or _shape(x) != _shape(n) or _dtype(x) != _dtype(n):
        return None
    first = x is a
    if (_fn(n, operator.mul, torch.mul) or _meth(n, "mul")) and c == 1:
        return x
    if (_fn(n, operator.truediv, torch.div) or _meth(n, "div")) and first and c == 1:
        return x
    if (_fn(n, operator.add, torch.add) or _meth(n, "add")) and c == 0:
        return x
    if (_fn(n, operator.sub, torch.sub) or _meth(n, "sub")) and first and c == 0:
        return x
    return None


def rule_identities(gm) -> bool:
    torch = _torch()
    g, changed = gm.graph, False
    pure = _pure(gm)
    for n in list(g.nodes):
        if not _alive(n) or not n.op.startswith("call"):
            continue
        x = _scalar_identity(n)
        if x is not None:
            changed |= _replace_with(g, n, x)
            continue
        if (_fn(n, operator.add, torch.add) or _meth(n, "add")) and len(n.args) == 2 and not n.kwargs \
                and n.args[0] is n.args[1] and hasattr(n.args[0], "op") and _is_float(n.args[0]):
            with g.inserting_before(n):
                new = g.call_function(operator.mul, (n.args[0], 2.0))
            changed |= _replace_with(g, n, new)
            continue
        if _dropout_p0(gm, n) and n.args and hasattr(n.args[0], "op"):
            changed |= _replace_with(g, n, n.args[0])
            continue
        p = _perm(n)
        if p is not None and len(n.users) == 1:
            u = next(iter(n.users))
            q = _perm(u)
            if q is not None and u.args[0] is n and [p[i] for i in q] == list(range(len(p))):
                changed |= _replace_with(g, u, n.args[0])
                if not n.users:
                    g.erase_node(n)
                continue
        if pure and (_meth(n, "clone") or _fn(n, torch.clone)) and len(n.args) == 1 and not n.kwargs \
                and hasattr(n.args[0], "op") and not _reaches_output(n):
            changed |= _replace_with(g, n, n.args[0])
    return changed


# ---- clamp chains ----------------------------------------------------------------------------------

def _bound(v, default):
    if v is None:
        return default
    return float(v) if _num(v) else None


def _clamp_like(gm, n):
    """(x, lo, hi) when n clamps x to scalar bounds (lo/hi may be +-inf), else None."""
    torch = _torch()
    nn = _torch_nn()
    F = nn.functional
    if not _is_float(n) or not n.args or not hasattr(n.args[0], "op"):
        return None
    x = n.args[0]
    mod = _module(gm, n)
    if mod is not None:
        if getattr(mod, "inplace", False) or len(n.args) != 1 or n.kwargs:
            return None
        if type(mod) in (nn.ReLU,):
            return x, 0.0, _INF
        if type(mod) in (nn.ReLU6,):
            return x, 0.0, 6.0
        if type(mod) is nn.Hardtanh:
            return x, float(mod.min_val), float(mod.max_val)
        return None
    if n.kwargs.get("inplace"):
        return None
    if _fn(n, torch.clamp) or _meth(n, "clamp", "clip") or _fn(n, torch.clip):
        lo, hi = _bound(_arg(n, 1, "min"), -_INF), _bound(_arg(n, 2, "max"), _INF)
    elif _fn(n, torch.clamp_min) or _meth(n, "clamp_min"):
        lo, hi = _bound(_arg(n, 1, "min"), None), _INF
    elif _fn(n, torch.clamp_max) or _meth(n, "clamp_max"):
        lo, hi = -_INF, _bound(_arg(n, 1, "max"), None)
    elif (_fn(n, torch.relu, F.relu) or _meth(n, "relu")) and len(n.args) == 1:
        lo, hi = 0.0, _INF
    elif _fn(n, F.relu6) and len(n.args) == 1:
        lo, hi = 0.0, 6.0
    elif _fn(n, F.hardtanh):
        lo, hi = _bound(_arg(n, 1, "min_val", -1.0), None), _bound(_arg(n, 2, "max_val", 1.0), None)
    else:
        return None
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi) or lo > hi or (lo == -_INF and hi == _INF):
        return None
    return x, lo, hi


def _value_range(gm, n):
    """A closed interval containing every non-NaN value of n, when an op guarantees one."""
    torch = _torch()
    nn = _torch_nn()
    F = nn.functional
    c = _clamp_like(gm, n)
    if c is not None:
        return c[1], c[2]
    mod = _module(gm, n)
    if mod is not None:
        if isinstance(mod, nn.Tanh):
            return -1.0, 1.0
        if isinstance(mod, (nn.Sigmoid, nn.Softmax, nn.Hardsigmoid)):
            return 0.0, 1.0
        return None
    if _fn(n, torch.tanh, F.tanh) or _meth(n, "tanh"):
        return -1.0, 1.0
    if _fn(n, torch.sigmoid, F.sigmoid, F.hardsigmoid) or _meth(n, "sigmoid"):
        return 0.0, 1.0
    if (_fn(n, torch.softmax, F.softmax) or _meth(n, "softmax")) and n.kwargs.get("dtype") is None:
        return 0.0, 1.0
    if _fn(n, torch.exp) or _meth(n, "exp"):
        return 0.0, _INF
    return None


def _step(gm, n):
    """('affine', x, s, t) or ('clamp', x, lo, hi) for a chain element, else None."""
    aff = _affine(n)
    if aff is not None and aff[1] != 0 and math.isfinite(aff[1]) and math.isfinite(aff[2]) \
            and _shape(aff[0]) == _shape(n) and _dtype(aff[0]) == _dtype(n):
        return ("affine",) + aff
    c = _clamp_like(gm, n)
    if c is not None and _shape(c[0]) == _shape(n):
        return ("clamp",) + c
    return None


def _widen(v: float, exact: bool) -> tuple[float, float]:
    if exact or not math.isfinite(v):
        return v, v
    eps = abs(v) * 2.0 ** -18 + 1e-30
    return v - eps, v + eps


def _emit_affine_clamp(g, x, s, t, lo, hi):
    y = x
    if s != 1.0:
        y = g.call_function(operator.mul, (y, s))
    if t != 0.0:
        y = g.call_function(operator.add, (y, t))
    if lo == 0.0 and hi == _INF:
        y = g.call_function(_torch().relu, (y,))
    elif lo != -_INF or hi != _INF:
        kw = {}
        if lo != -_INF:
            kw["min"] = lo
        if hi != _INF:
            kw["max"] = hi
        y = g.call_function(_torch().clamp, (y,), kw)
    return y


def rule_clamp_chain(gm) -> bool:
    g, changed = gm.graph, False
    for top in reversed(list(g.nodes)):
        if not _alive(top) or _step(gm, top) is None:
            continue
        user = next(iter(top.users)) if len(top.users) == 1 else None
        if user is not None and _step(gm, user) is not None and _step(gm, user)[1] is top:
            continue  # not the top of a chain
        chain, x = [], top
        while True:  # walk down: top ... bottom; inner nodes have one user
            st = _step(gm, x)
            if st is None or (x is not top and len(x.users) != 1):
                break
            chain.append(st)
            x = st[1]
        if not any(st[0] == "clamp" for st in chain):
            continue  # affine-only chains are `fold_scalars`' work
        chain.reverse()  # bottom first
        rng = _value_range(gm, x)
        vlo, vhi = rng if rng is not None else (-_INF, _INF)  # the current value's range, as the chain goes
        exact = True  # no arithmetic yet: the range bounds are the values themselves
        s, t, lo, hi, used = 1.0, 0.0, -_INF, _INF, 0
        for kind, _, a, b in chain:
            used += 1
            if kind == "affine":
                s, t = a * s, a * t + b
                lo, hi = (a * lo + b, a * hi + b) if a > 0 else (a * hi + b, a * lo + b)
                vlo, vhi = sorted((a * vlo + b, a * vhi + b))
                exact = exact and a == 1 and b == 0
                continue
            if a <= _widen(vlo, exact)[0] and b >= _widen(vhi, exact)[1]:
                continue  # the value is already within [a, b]: this clamp does nothing
            nlo, nhi = max(lo, a), min(hi, b)
            if nlo > nhi:
                used -= 1
                break  # a constant result: left to the reference
            lo, hi = nlo, nhi
            vlo, vhi = max(vlo, a), min(vhi, b)
        if used < len(chain) or not (math.isfinite(s) and math.isfinite(t)):
            continue
        n_ops = (s != 1.0) + (t != 0.0) + (lo != -_INF or hi != _INF)
        if n_ops >= len(chain):
            continue
        nodes = []
        y = top
        for _ in chain:
            nodes.append(y)
            y = _step(gm, y)[1]
        with g.inserting_before(top):
            new = _emit_affine_clamp(g, x, s, t, lo, hi)
        if new is x and not _replace_with(g, top, x):
            continue
        if new is not x:
            top.replace_all_uses_with(new)
        for m in nodes:  # top first: each is dead once its user is gone
            if _alive(m) and not m.users:
                g.erase_node(m)
        changed = True
    return changed


RULES = {"identities": rule_identities, "clamp_chain": rule_clamp_chain}
