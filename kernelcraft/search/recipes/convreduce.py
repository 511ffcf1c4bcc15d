"""The rule `conv_reduce`: a sum or mean over every output position of a convolution, without the convolution.

Exact in real arithmetic: the input is summed per kernel tap, then contracted with the weights. The helper
`_kc_conv_reduce` travels with the candidate (`_kc_source`) and reads every size and the weights at run time.
Rationale: docs/design/recipes.md#convreduce
"""

from __future__ import annotations

import functools

from kernelcraft.search.recipes.fxrules import _fn, _is_float, _shape, _torch, generated_helper
from kernelcraft.search.recipes.reductions import _reduce_op
from kernelcraft.search.recipes.simplify import _each_call, _module, _torch_nn

HELPER = '''
def _kc_conv_reduce(x, weight, bias, stride, padding, dilation, output_padding, transposed, mean, keepdim):
    """sum (or mean) over every output position of conv(x) or conv_transpose(x), per sample and channel,
    without the convolution (kernelcraft's conv_reduce rule)."""
    t, count = x, 1
    for j in range(x.dim() - 2):
        size, k = x.shape[2 + j], weight.shape[2 + j]
        s, p, d = stride[j], padding[j], dilation[j]
        taps = torch.arange(k, device=x.device).unsqueeze(1) * d
        q = torch.arange(size, device=x.device).unsqueeze(0)
        if transposed:
            out = (size - 1) * s - 2 * p + d * (k - 1) + output_padding[j] + 1
            pos = q * s + taps - p
            m = (pos >= 0) & (pos < out)
        else:
            out = (size + 2 * p - d * (k - 1) - 1) // s + 1
            rel = q - taps + p
            m = (rel >= 0) & (rel % s == 0) & (rel < out * s)
        count *= out
        t = torch.tensordot(t, m.to(x.dtype), dims=([2], [1]))  # this dim becomes a tap dim, moved last
    w = weight.transpose(0, 1) if transposed else weight  # [C_out, C_in, taps...]
    y = t.flatten(1) @ w.flatten(1).t()
    if bias is not None:
        y = y + count * bias
    if mean:
        y = y / count
    return y.view(y.shape + (1,) * (x.dim() - 2)) if keepdim else y
'''

_CONVS = {"Conv1d": False, "Conv2d": False, "Conv3d": False,
          "ConvTranspose1d": True, "ConvTranspose2d": True, "ConvTranspose3d": True}  # torch.nn's, by name


def _conv_kind(mod):
    """(spatial dims, transposed) for a torch.nn convolution module (not a look-alike of the same name)."""
    nn = _torch_nn()
    for name, transposed in _CONVS.items():
        if type(mod) is getattr(nn, name):
            return int(name[-2]), transposed
    return None


@functools.lru_cache(maxsize=1)
def _helper():
    return generated_helper(HELPER, "_kc_conv_reduce")


def _conv(gm, n):
    """(module, transposed) for a matched convolution node (docs/design/recipes.md#convreduce), else None."""
    mod = _module(gm, n)
    kind = _conv_kind(mod) if mod is not None else None
    if kind is None or len(n.args) != 1 or n.kwargs:
        return None
    nd = kind[0]
    if mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
        return None
    x = n.args[0]
    if not hasattr(x, "op") or _shape(x) is None or len(_shape(x)) != nd + 2 or not _is_float(x):
        return None
    return mod, kind[1]


def _global_reduce(gm, n, nd):
    """(y, mean, keepdim) when n sums or averages y over exactly its nd spatial dims, else None."""
    F = _torch_nn().functional
    red = _reduce_op(n)
    if red is not None:
        kind, y, dims, keep = red
        rank = nd + 2
        if kind not in ("sum", "mean") or sorted(d % rank for d in dims) != list(range(2, rank)):
            return None
        return y, kind == "mean", keep
    mod = _module(gm, n)
    pools = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
    if mod is not None and type(mod) is getattr(_torch_nn(), f"AdaptiveAvgPool{nd}d") and len(n.args) == 1 \
            and not n.kwargs:
        size = mod.output_size
    elif _fn(n, pools[nd]) and len(n.args) == 2 and not n.kwargs:
        size = n.args[1]
    else:
        return None
    if size != 1 and (not isinstance(size, (tuple, list)) or any(s != 1 for s in size)):
        return None
    return n.args[0], True, True


def _reduce_one(gm, n) -> bool:
    g = gm.graph
    for nd in (1, 2, 3):
        red = _global_reduce(gm, n, nd)
        if red is not None:
            break
    else:
        return False
    y, mean, keep = red
    if not hasattr(y, "op") or len(y.users) != 1:
        return False
    conv = _conv(gm, y)
    if conv is None or _conv_kind(conv[0])[0] != nd:
        return False
    mod, transposed = conv
    with g.inserting_before(n):
        w = g.get_attr(f"{y.target}.weight")
        b = g.get_attr(f"{y.target}.bias") if mod.bias is not None else None
        out_pad = tuple(mod.output_padding) if transposed else (0,) * nd
        new = g.call_function(_helper(), (y.args[0], w, b, tuple(mod.stride), tuple(mod.padding),
                                          tuple(mod.dilation), out_pad, transposed, mean, keep))
    new.meta = dict(n.meta)
    n.replace_all_uses_with(new)
    g.erase_node(n)
    g.erase_node(y)
    return True


def rule_conv_reduce(gm) -> bool:
    return _each_call(gm, _reduce_one)


RULES = {"conv_reduce": rule_conv_reduce}
