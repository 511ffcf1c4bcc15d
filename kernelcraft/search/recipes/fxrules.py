"""FX rewrite rules: algebraic simplifications of a traced reference graph (used by `rewrite`).

Each rule mutates a shape-propagated `torch.fx.GraphModule` in place and returns True when it changed
something. Exact up to floating-point reassociation; a rule that needs shapes does nothing without them.
Rules: `diag_matmul`, `reduce_linear`, `fold_scalars`, `dead_code`, `inplace`.
Rationale: docs/design/recipes.md#fxrules
"""
from __future__ import annotations

import math
import operator

RULE_ORDER = ("diag_matmul", "reduce_linear", "fold_scalars", "dead_code", "inplace")

def _torch():
    import torch
    import torch.fx  # noqa: F401
    return torch


def generated_helper(source: str, name: str):
    """A rule's helper function `name` defined by `source` (which may use `torch`), as one function object: every
    match in a graph names the same global, and it carries its source (`_kc_source`) for `rewrite.render_graph`,
    so the candidate stands alone."""
    ns = {"torch": _torch()}
    exec(compile(source, f"<kernelcraft {name}>", "exec"), ns)
    fn = ns[name]
    fn.__module__ = "kernelcraft_generated"  # what FX needs to name it; render_graph writes `_kc_source` instead
    fn._kc_source = source.strip()
    return fn


def _meta(node):
    tm = node.meta.get("tensor_meta") if hasattr(node, "meta") else None
    return tm if tm is not None and hasattr(tm, "shape") else None


def _shape(node):
    tm = _meta(node)
    return tuple(tm.shape) if tm is not None else None


def _dtype(node):
    tm = _meta(node)
    return tm.dtype if tm is not None else None


def _is_float(node) -> bool:
    dt = _dtype(node)
    return dt is not None and dt.is_floating_point


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fn(node, *targets) -> bool:
    return node.op == "call_function" and any(node.target is t for t in targets)


def _meth(node, *names) -> bool:
    return node.op == "call_method" and node.target in names


def _replace(graph, old, new) -> None:
    old.replace_all_uses_with(new)
    graph.erase_node(old)


def _erase_if_dead(graph, node) -> None:
    if node.op in ("call_function", "call_method", "get_attr") and not node.users:
        graph.erase_node(node)


# ---- rules: each mutates gm.graph and returns True when it changed something ---------------------

def rule_diag_matmul(gm) -> bool:
    torch = _torch()
    g, changed = gm.graph, False
    for n in list(g.nodes):
        if not (_fn(n, operator.matmul, torch.matmul, torch.mm) or _meth(n, "matmul", "mm")) or len(n.args) != 2:
            continue
        a, b = n.args
        for left, dnode, other in ((True, a, b), (False, b, a)):
            if not hasattr(dnode, "op"):
                continue
            plain = (_fn(dnode, torch.diag) or _meth(dnode, "diag")) and len(dnode.args) == 1 \
                and dnode.kwargs.get("diagonal", 0) == 0 and _shape(dnode.args[0]) is not None \
                and len(_shape(dnode.args[0])) == 1
            embed = (_fn(dnode, torch.diag_embed) or _meth(dnode, "diag_embed")) and len(dnode.args) == 1 \
                and not dnode.kwargs
            if not (plain or embed) or _shape(other) is None:
                continue
            d = dnode.args[0]
            with g.inserting_before(n):
                if left and len(_shape(other)) == 1:
                    new = g.call_function(operator.mul, (d, other))
                elif left:
                    new = g.call_function(operator.mul, (g.call_method("unsqueeze", (d, -1)), other))
                elif embed:
                    new = g.call_function(operator.mul, (other, g.call_method("unsqueeze", (d, -2))))
                else:
                    new = g.call_function(operator.mul, (other, d))
            _replace(g, n, new)
            _erase_if_dead(g, dnode)
            changed = True
            break
    return changed


def _reduction(n):
    """(input, dim, keepdim, kind) for sum/mean over one dim, else None."""
    torch = _torch()
    if not (_fn(n, torch.sum, torch.mean) or _meth(n, "sum", "mean")):
        return None
    args, kw = list(n.args), dict(n.kwargs)
    if "dtype" in kw or len(args) > 3:
        return None
    dim = args[1] if len(args) > 1 else kw.get("dim")
    keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int):
        return None
    kind = "mean" if n.target in ("mean",) or n.target is torch.mean else "sum"
    return args[0], dim, bool(keep), kind


def rule_reduce_linear(gm) -> bool:
    torch = _torch()
    g, changed = gm.graph, False
    for n in list(g.nodes):
        red = _reduction(n)
        if red is None:
            continue
        lin, dim, keep, kind = red
        shape = _shape(lin)
        if not hasattr(lin, "op") or shape is None or dim not in (-1, len(shape) - 1) or len(lin.users) != 1:
            continue
        with g.inserting_before(n):
            if lin.op == "call_module" and isinstance(gm.get_submodule(lin.target), torch.nn.Linear):
                x = lin.args[0]
                w = g.get_attr(f"{lin.target}.weight")
                b = g.get_attr(f"{lin.target}.bias") if gm.get_submodule(lin.target).bias is not None else None
                wr = g.call_method(kind, (w, 0))
            elif (_fn(lin, operator.matmul, torch.matmul, torch.mm) and hasattr(lin.args[1], "op")
                  and lin.args[1].op == "get_attr" and _shape(lin.args[1]) is not None
                  and len(_shape(lin.args[1])) == 2):
                x, b = lin.args[0], None
                wr = g.call_method(kind, (lin.args[1], 1))
            elif _fn(lin, operator.matmul, torch.matmul, torch.mm) and _transposed_weight(lin.args[1]) is not None:
                x, b = lin.args[0], None  # x @ W.T: reduce W over its rows
                wr = g.call_method(kind, (_transposed_weight(lin.args[1]), 0))
            else:
                continue
            y = g.call_function(torch.matmul, (x, wr))
            if b is not None:
                y = g.call_function(operator.add, (y, g.call_method(kind, (b,))))
            if keep:
                y = g.call_method("unsqueeze", (y, -1))
        _replace(g, n, y)
        wt = lin.args[1] if lin.op != "call_module" else None
        g.erase_node(lin)
        if wt is not None and wt.op != "get_attr" and not wt.users:
            g.erase_node(wt)
        changed = True
    return changed


def _transposed_weight(n):
    """W when n is W.T, W.t() or W.transpose(0, 1) of a 2-D parameter/buffer W, else None."""
    torch = _torch()
    if not hasattr(n, "op") or not n.args or not hasattr(n.args[0], "op") or n.args[0].op != "get_attr":
        return None
    w = n.args[0]
    if _shape(w) is None or len(_shape(w)) != 2:
        return None
    if (_fn(n, getattr) and n.args[1:] == ("T",)) or ((_meth(n, "t") or _fn(n, torch.t)) and len(n.args) == 1):
        return w
    if (_meth(n, "transpose") or _fn(n, torch.transpose)) and len(n.args) == 3 \
            and {n.args[1] % 2 if isinstance(n.args[1], int) else None,
                 n.args[2] % 2 if isinstance(n.args[2], int) else None} == {0, 1}:
        return w
    return None


def _affine(n):
    """(x, s, t) when n computes s * x + t for a floating tensor node x and Python numbers s, t."""
    torch = _torch()
    if not hasattr(n, "op") or n.kwargs or not _is_float(n):
        return None
    a = n.args
    if _fn(n, operator.neg, torch.neg) or _meth(n, "neg"):
        return (a[0], -1.0, 0.0) if hasattr(a[0], "op") else None
    if len(a) != 2:
        return None
    x, c = (a[0], a[1]) if hasattr(a[0], "op") else (a[1], a[0])
    if not hasattr(x, "op") or not _num(c) or not _is_float(x) or not math.isfinite(c):
        return None
    first = hasattr(a[0], "op")
    if _fn(n, operator.mul, torch.mul) or _meth(n, "mul"):
        return x, c, 0.0
    if _fn(n, operator.add, torch.add) or _meth(n, "add"):
        return x, 1.0, c
    if _fn(n, operator.sub, torch.sub) or _meth(n, "sub"):
        return (x, 1.0, -c) if first else (x, -1.0, c)
    if (_fn(n, operator.truediv, torch.div) or _meth(n, "div")) and first and c != 0:
        return x, 1.0 / c, 0.0
    return None


def rule_fold_scalars(gm) -> bool:
    g, changed = gm.graph, False
    for n in reversed(list(g.nodes)):
        if n.graph is not g or _affine(n) is None:
            continue
        user = next(iter(n.users)) if len(n.users) == 1 else None
        if user is not None and _affine(user) is not None and _affine(user)[0] is n:
            continue  # not the top of a chain: handled from its top
        s, t, x, chain = 1.0, 0.0, n, []
        while True:
            aff = _affine(x)
            if aff is None or (x is not n and len(x.users) != 1):
                break
            inner, s1, t1 = aff
            s, t = s * s1, s * t1 + t
            chain.append(x)
            x = inner
        n_ops = (s != 1.0) + (t != 0.0) or 1
        if len(chain) < 2 or n_ops >= len(chain):
            continue
        with g.inserting_before(n):
            y = x
            if s != 1.0 or t == 0.0:
                y = g.call_function(operator.mul, (y, s))
            if t != 0.0:
                y = g.call_function(operator.add, (y, t))
        n.replace_all_uses_with(y)
        for c in chain:  # top first: each becomes dead once its user is gone
            g.erase_node(c)
        changed = True
    return changed


_RANDOM = ("rand", "dropout", "bernoulli", "normal", "multinomial", "uniform", "poisson", "exponential_")


def _impure(gm, n) -> bool:
    name = getattr(n.target, "__name__", str(n.target)).lower()
    if any(r in name for r in _RANDOM):
        return True
    if n.op == "call_method" and n.target.endswith("_") and not n.target.endswith("__"):
        return True
    if n.op == "call_function" and name.endswith("_") and not name.endswith("__"):
        return True
    if n.kwargs.get("inplace") or n.kwargs.get("out") is not None:
        return True
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        return bool(getattr(mod, "inplace", False)) or "dropout" in type(mod).__name__.lower() \
            or (mod.training and "batchnorm" in type(mod).__name__.lower())
    return False


def _key(x):
    if hasattr(x, "op"):
        return ("node", x.name)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_key(i) for i in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, _key(v)) for k, v in sorted(x.items()))
    if isinstance(x, slice):
        return ("slice", _key(x.start), _key(x.stop), _key(x.step))
    try:
        hash(x)
        return ("v", type(x).__name__, x)
    except TypeError:
        return ("r", repr(x))


def rule_dead_code(gm) -> bool:
    g = gm.graph
    if any(_impure(gm, n) for n in g.nodes if n.op.startswith("call")):
        return False
    changed, seen = False, {}
    for n in list(g.nodes):
        if n.op not in ("call_function", "call_method", "call_module", "get_attr"):
            continue
        k = (n.op, str(n.target), _key(n.args), _key(n.kwargs))
        if k in seen:
            _replace(g, n, seen[k])
            changed = True
        else:
            seen[k] = n
    before = len(g.nodes)
    g.eliminate_dead_code(is_impure_node=_kept)
    return changed or len(g.nodes) < before


def _kept(n) -> bool:
    """A node dead-code elimination keeps though nothing uses it: FX's impure ones, and the assertion that a
    parameter traced at its default still has it (`rewrite._trace`)."""
    return n.is_impure() or getattr(n.target, "__name__", "") == "_assert_is_none"


def _fresh(gm, n) -> bool:
    """n produces a new tensor that aliases nothing (a safe target for an in-place op)."""
    torch = _torch()
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        fresh_mods = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
                      torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d, torch.nn.LayerNorm, torch.nn.GroupNorm,
                      torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.MaxPool2d, torch.nn.AvgPool2d,
                      torch.nn.Softmax, torch.nn.GELU, torch.nn.Bilinear, torch.nn.Embedding)
        return isinstance(mod, fresh_mods)
    if n.op == "call_function":
        fresh_fns = {operator.add, operator.mul, operator.sub, operator.truediv, operator.matmul, torch.matmul,
                     torch.mm, torch.bmm, torch.addmm, torch.relu, torch.sigmoid, torch.tanh, torch.exp,
                     torch.softmax, torch.log_softmax, torch.layer_norm, torch.group_norm, torch.conv2d,
                     torch.conv1d, torch.cat, torch._C._nn.linear, torch._C._nn.gelu, torch.nn.functional.gelu}
        if n.target in _inplace_kw_fns():
            return n.kwargs.get("inplace", False) is False
        return any(n.target is f for f in fresh_fns)
    return False


def _inplace_kw_fns():
    F = _torch().nn.functional
    return {F.relu, F.relu6, F.hardswish, F.hardsigmoid, F.silu, F.leaky_relu, F.elu, F.hardtanh, F.mish}


def rule_inplace(gm) -> bool:
    torch = _torch()
    g, changed = gm.graph, False
    unary_fns = {torch.relu: "relu_", torch.sigmoid: "sigmoid_", torch.tanh: "tanh_", torch.exp: "exp_",
                 operator.neg: "neg_", torch.neg: "neg_"}
    unary_mods = {torch.nn.ReLU: "relu_", torch.nn.Sigmoid: "sigmoid_", torch.nn.Tanh: "tanh_"}
    binary = {operator.add: "add_", torch.add: "add_", operator.mul: "mul_", torch.mul: "mul_",
              operator.sub: "sub_", torch.sub: "sub_", operator.truediv: "div_", torch.div: "div_"}
    for n in list(g.nodes):
        method, args = None, None
        if n.op == "call_function" and n.target in unary_fns and len(n.args) == 1 and not n.kwargs:
            method, args = unary_fns[n.target], n.args
        elif n.op == "call_module" and type(gm.get_submodule(n.target)) in unary_mods and len(n.args) == 1:
            method, args = unary_mods[type(gm.get_submodule(n.target))], n.args
        elif n.op == "call_method" and n.target in ("relu", "sigmoid", "tanh", "exp", "clamp") and len(n.args) >= 1:
            method, args = n.target + "_", n.args
        elif _fn(n, torch.clamp):
            method, args = "clamp_", n.args
        elif n.op == "call_function" and n.target in _inplace_kw_fns() and n.kwargs.get("inplace") is False \
                and n.args and hasattr(n.args[0], "op"):
            target = n.args[0]
            if (_fresh(gm, target) and len(target.users) == 1 and _shape(n) is not None
                    and _shape(target) == _shape(n) and _dtype(target) == _dtype(n)):
                n.kwargs = {**n.kwargs, "inplace": True}
                changed = True
            continue
        elif n.op == "call_function" and n.target in binary and len(n.args) == 2 and not n.kwargs:
            a, b = n.args
            method = binary[n.target]
            commutative = method in ("add_", "mul_")
            args = (a, b) if hasattr(a, "op") and _fresh(gm, a) else ((b, a) if commutative else (a, b))
        if method is None or not hasattr(args[0], "op"):
            continue
        target = args[0]
        if not (_fresh(gm, target) and len(target.users) == 1 and _shape(target) is not None
                and _shape(target) == _shape(n) and _dtype(target) == _dtype(n)):
            continue
        with g.inserting_before(n):
            new = g.call_method(method, tuple(args), dict(n.kwargs))
        _replace(g, n, new)
        changed = True
    return changed


RULES = {"diag_matmul": rule_diag_matmul, "reduce_linear": rule_reduce_linear,
         "fold_scalars": rule_fold_scalars, "dead_code": rule_dead_code, "inplace": rule_inplace}
