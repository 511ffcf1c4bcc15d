"""Composite activations written out by hand, recognised and replaced by the one PyTorch op: x*sigmoid(x) ->
silu(x), x*tanh(softplus(x)) -> mish(x), x*clamp((x+3)/6, 0, 1) -> hardswish(x).

Rule `fuse_activation`, same contract as `simplify`. The gate must have no other reader and take the very
node it multiplies; softplus only with its defaults.
Rationale: docs/design/recipes.md#activations
"""
from __future__ import annotations

import operator

from kernelcraft.search.recipes.fxrules import _affine, _dtype, _fn, _is_float, _meth, _shape, _torch
from kernelcraft.search.recipes.simplify import _alive, _clamp_like, _module, _torch_nn

def _mul_pair(n):
    torch = _torch()
    if (_fn(n, operator.mul, torch.mul, torch.multiply) or _meth(n, "mul", "multiply")) and len(n.args) == 2 \
            and not n.kwargs and all(hasattr(a, "op") for a in n.args):
        return n.args
    return None


def _unary_of(gm, n, fns, methods, mods):
    if not hasattr(n, "op") or len(n.users) != 1 or not n.args or not hasattr(n.args[0], "op"):
        return None
    mod = _module(gm, n)
    if mod is not None:
        return n.args[0] if isinstance(mod, mods) and len(n.args) == 1 else None
    if (_fn(n, *fns) or _meth(n, *methods)) and len(n.args) == 1 and not n.kwargs:
        return n.args[0]
    return None


def _hardswish_gate(gm, n, x) -> bool:
    """n = clamp((x + 3) / 6, 0, 1) (any affine spelling with slope 1/6 and offset 1/2)."""
    c = _clamp_like(gm, n) if hasattr(n, "op") and len(n.users) == 1 else None
    if c is None or c[1] != 0.0 or c[2] != 1.0:
        return False
    s, t, m = 1.0, 0.0, c[0]
    for _ in range(4):
        if m is x:
            break
        aff = _affine(m)
        if aff is None or len(m.users) != 1:
            return False
        m, s1, t1 = aff
        s, t = s * s1, s * t1 + t
    return m is x and abs(s - 1 / 6) < 1e-12 and abs(t - 0.5) < 1e-12


def rule_fuse_activation(gm) -> bool:
    torch = _torch()
    nn = _torch_nn()
    F = nn.functional
    g, changed = gm.graph, False
    for n in list(g.nodes):
        if not _alive(n) or not _is_float(n):
            continue
        pair = _mul_pair(n)
        if pair is None:
            continue
        for x, gate in (pair, pair[::-1]):
            if _shape(x) != _shape(n) or _dtype(x) != _dtype(n):
                continue
            new_fn = None
            if _unary_of(gm, gate, (torch.sigmoid, F.sigmoid), ("sigmoid",), (nn.Sigmoid,)) is x:
                new_fn = F.silu
            else:
                sp = _unary_of(gm, gate, (torch.tanh, F.tanh), ("tanh",), (nn.Tanh,))
                if sp is not None and len(sp.users) == 1 and sp.args and sp.args[0] is x and (
                        (_fn(sp, torch._C._nn.softplus, F.softplus) and len(sp.args) == 1 and not sp.kwargs)
                        or (sp.op == "call_module" and isinstance(gm.get_submodule(sp.target), nn.Softplus)
                            and gm.get_submodule(sp.target).beta == 1 and gm.get_submodule(sp.target).threshold == 20)):
                    new_fn = F.mish
                elif _hardswish_gate(gm, gate, x):
                    new_fn = F.hardswish
            if new_fn is None:
                continue
            with g.inserting_before(n):
                new = g.call_function(new_fn, (x,))
            n.replace_all_uses_with(new)
            g.erase_node(n)
            dead = [gate]
            while dead:
                m = dead.pop()
                if _alive(m) and not m.users and m.op.startswith("call"):
                    ins = [a for a in m.args if hasattr(a, "op")]
                    g.erase_node(m)
                    dead += [a for a in ins if a is not x]
            changed = True
            break
    return changed


RULES = {"fuse_activation": rule_fuse_activation}
