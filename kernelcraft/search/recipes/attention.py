"""The rule `attention`: attention computed as one fused kernel instead of through its score matrix.

Two forms, same contract as `simplify` (exact in real arithmetic, no sizes baked in):
- written out, `softmax(q @ k^T * s [masked_fill(m, -inf)]) [dropout p=0] @ v` with nothing else reading the scores,
  becomes the helper `_kc_attention` (it travels with the candidate, `_kc_source`): PyTorch's
  `scaled_dot_product_attention` with the scale given and the mask as `attn_mask`, or `is_causal=True` when the mask is
  the causal one. A mask made only of buffers and sizes is tested once per (those buffer objects, their version,
  the sizes); one made from the inputs is passed as it is, every call.
- `nn.MultiheadAttention` whose averaged weights nobody reads is called with `need_weights=False` (its fused path).
Rationale: docs/design/recipes.md#attention
"""
from __future__ import annotations

import functools
import math
import operator

from kernelcraft.search.recipes.fxrules import (_dtype, _fn, _is_float, _meth, _num, _shape, _torch,
                                                generated_helper)
from kernelcraft.search.recipes.simplify import _alive, _dropout_p0, _each_call, _module, _torch_nn

HELPER = '''
import weakref

_kc_attention_causal = {}


def _kc_attention(q, k, v, scale, masked_out, mask_fixed, *mask_key):
    """softmax(q @ k^T * scale, -inf where masked_out) @ v in one fused kernel (kernelcraft's attention rule).
    mask_fixed: masked_out is a pure function of mask_key (buffers, sizes), so whether it is causal is kept, for as
    long as those very tensors live at that version."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if masked_out is None:
        return sdpa(q, k, v, scale=scale)
    causal = False
    if mask_fixed and not masked_out.is_meta:
        tensors = [t for t in mask_key if isinstance(t, torch.Tensor)]
        key = tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride(), str(t.device))
                    if isinstance(t, torch.Tensor) else t for t in mask_key) + (tuple(masked_out.shape),)
        try:
            kept = _kc_attention_causal.get(key)
        except TypeError:  # a leaf that cannot be a key (a list): the mask goes as it is
            key, kept = None, (False, ())
        if kept is not None and all(ref() is t for ref, t in zip(kept[1], tensors)):
            causal = kept[0]  # the same tensors, not others at a freed one's address
        else:
            L, S = q.shape[-2], k.shape[-2]
            causal = (masked_out.dim() >= 2 and tuple(masked_out.shape[-2:]) == (L, S)
                      and all(d == 1 for d in masked_out.shape[:-2])
                      and torch.equal(masked_out.reshape(L, S),
                                      torch.ones(L, S, dtype=torch.bool, device=masked_out.device).triu(1)))
            if key is not None:
                if len(_kc_attention_causal) > 256:
                    _kc_attention_causal.clear()
                _kc_attention_causal[key] = (causal, tuple(weakref.ref(t) for t in tensors))
    if causal:
        return sdpa(q, k, v, is_causal=True, scale=scale)
    return sdpa(q, k, v, attn_mask=masked_out.logical_not(), scale=scale)
'''.strip()

_MAX_MASK_NODES = 32  # a mask built of more ops than this is passed per call, never cached


@functools.lru_cache(maxsize=1)
def _helper():
    return generated_helper(HELPER, "_kc_attention")


def _only_reader(n, reader) -> bool:
    return hasattr(n, "op") and len(n.users) == 1 and reader in n.users


def _matmul(n):
    """(a, b) when n is a matrix product of two tensor nodes (`@`, matmul, bmm), else None."""
    torch = _torch()
    if (_fn(n, operator.matmul, torch.matmul, torch.bmm) or _meth(n, "matmul", "bmm")) and len(n.args) == 2 \
            and not n.kwargs and all(hasattr(a, "op") for a in n.args):
        return n.args
    return None


def _last_two_swapped(n):
    """k when n is k with its last two dimensions swapped (transpose(-2, -1), permute, .mT), else None."""
    shape = _shape(n)
    if shape is None or len(shape) < 2 or not n.args or not hasattr(n.args[0], "op"):
        return None
    rank, src = len(shape), n.args[0]
    torch = _torch()
    if (_meth(n, "transpose") or _fn(n, torch.transpose)) and len(n.args) == 3 and not n.kwargs:
        dims = {d % rank for d in n.args[1:] if isinstance(d, int)}
        return src if dims == {rank - 2, rank - 1} else None
    if (_meth(n, "permute") or _fn(n, torch.permute)) and not n.kwargs:
        perm = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (tuple, list)) else n.args[1:]
        want = list(range(rank - 2)) + [rank - 1, rank - 2]
        return src if [d % rank if isinstance(d, int) else None for d in perm] == want else None
    if n.op == "call_function" and n.target is getattr and n.args[1:] == ("mT",):
        return src
    return None


def _softmax_last(n):
    """x when n is softmax(x) over the last dimension in x's own dtype, else None."""
    torch = _torch()
    F = _torch_nn().functional
    shape = _shape(n)
    if shape is None or not n.args or not hasattr(n.args[0], "op"):
        return None
    if not (_fn(n, F.softmax, torch.softmax) or _meth(n, "softmax")):
        return None
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    if n.kwargs.get("dtype") is not None or len(n.args) > 2 or not isinstance(dim, int) \
            or dim % len(shape) != len(shape) - 1:
        return None
    return n.args[0]


def _scalar(a) -> bool:
    """A Python number, or a graph value that is not a tensor (a size, math on sizes)."""
    return _num(a) or (hasattr(a, "op") and a.op in ("call_function", "call_method") and "tensor_meta" not in a.meta)


def _scaled(n):
    """(p, scale, divide) when n is p * scale, scale * p or p / scale with a scalar scale, else None."""
    torch = _torch()
    if len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    if _fn(n, operator.mul, torch.mul) or _meth(n, "mul"):
        if hasattr(a, "op") and _scalar(b):
            return a, b, False
        if hasattr(b, "op") and _scalar(a) and n.op == "call_function":
            return b, a, False
    if (_fn(n, operator.truediv, torch.div) or _meth(n, "div")) and hasattr(a, "op") and _scalar(b):
        return a, b, True
    return None


def _mask_key(mask):
    """The leaves masked_out is a pure function of (buffers and scalar graph values), or None when it reads an
    input or an op that may not be pure."""
    leaves, todo, seen = [], [mask], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > _MAX_MASK_NODES:
            return None
        if n.op == "get_attr" or _scalar(n):
            leaves.append(n)
            continue
        if n.op not in ("call_function", "call_method") or _unlisted_op(n):
            return None
        todo.extend(n.all_input_nodes)  # args and kwargs, inside tuples and slices too
    return tuple(sorted(leaves, key=lambda x: x.name))


# what a mask kept between calls may be made of: comparisons, views and factories of sizes (no random, no input)
_PURE_MASK_OPS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "bool", "to",
                  "float", "view", "reshape", "unsqueeze", "expand", "expand_as", "narrow", "contiguous", "getitem",
                  "invert", "__invert__", "not_", "and_", "or_", "tril", "triu", "squeeze", "transpose", "permute",
                  "ones", "zeros", "full", "arange", "eye"}


def _unlisted_op(n) -> bool:
    name = getattr(n.target, "__name__", n.target) if n.op == "call_function" else n.target
    return str(name) not in _PURE_MASK_OPS


def _match_written_out(gm, out):
    """(q, k, v, scale, divide, mask, chain) when out = softmax(q @ k^T * scale [masked]) [dropout p=0] @ v and each
    step is read only by the next; `chain`: the nodes the fused call replaces, from `out` back. Else None."""
    pair = _matmul(out)
    if pair is None or not _is_float(out):
        return None
    node, v = pair
    chain = [out]
    if _dropout_p0(gm, node) and node.args and hasattr(node.args[0], "op") and _only_reader(node, chain[-1]):
        chain.append(node)
        node = node.args[0]
    if not _only_reader(node, chain[-1]):
        return None
    scores = _softmax_last(node)
    if scores is None or not _only_reader(scores, node):
        return None
    chain.append(node)
    mask = None
    if (_meth(scores, "masked_fill") or _fn(scores, _torch().masked_fill)) and len(scores.args) == 3 \
            and not scores.kwargs:
        filled, mask, value = scores.args
        if not (_num(value) and value == -math.inf) or not hasattr(mask, "op") or not hasattr(filled, "op") \
                or _dtype(mask) is not _torch().bool or not _only_reader(filled, scores):
            return None
        chain.append(scores)
        scores = filled
    scale, divide = None, False
    scaled = _scaled(scores)
    if scaled is not None:
        chain.append(scores)
        scores, scale, divide = scaled
        if not _only_reader(scores, chain[-1]):
            return None
    qk = _matmul(scores)
    if qk is None:
        return None
    chain.append(scores)
    q, kt = qk
    k = _last_two_swapped(kt)
    qs, ks, vs = _shape(q), _shape(k) if k is not None else None, _shape(v)
    if k is None or qs is None or ks is None or vs is None or len(qs) < 3 or not (len(qs) == len(ks) == len(vs)):
        return None
    if qs[:-2] != ks[:-2] or ks[:-2] != vs[:-2] or qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        return None  # the same batch dimensions on all three: no broadcasting
    if len({_dtype(q), _dtype(k), _dtype(v)}) != 1 or not _is_float(q):
        return None
    return q, k, v, scale, divide, mask, chain + [kt]


def _rewrite_written_out(gm, out) -> bool:
    match = _match_written_out(gm, out)
    if match is None:
        return False
    q, k, v, scale, divide, mask, chain = match
    g = gm.graph
    with g.inserting_before(out):
        if scale is None:
            scale = 1.0
        elif divide:
            scale = 1.0 / scale if _num(scale) else g.call_function(operator.truediv, (1.0, scale))
        leaves = _mask_key(mask) if mask is not None else None
        fused = g.call_function(_helper(), (q, k, v, scale, mask, leaves is not None, *(leaves or ())))
    fused.meta = dict(out.meta)
    out.replace_all_uses_with(fused)
    for n in chain:  # from the product back to the scores and the transposed keys
        if _alive(n) and not n.users:
            g.erase_node(n)
    return True


def _rewrite_mha(gm, n) -> bool:
    nn = _torch_nn()
    mod = _module(gm, n)
    if not isinstance(mod, nn.MultiheadAttention) or len(n.args) > 4 or "need_weights" in n.kwargs:
        return False
    if mod.training and mod.dropout > 0:
        return False  # a different random stream: not the same program
    for user in n.users:
        if not (_fn(user, operator.getitem) and len(user.args) == 2 and user.args[1] in (0, 1)):
            return False
        if user.args[1] == 1 and user.users:
            return False  # the weights are read
    for user in list(n.users):
        if user.args[1] == 1:
            gm.graph.erase_node(user)
    n.kwargs = {**n.kwargs, "need_weights": False}
    return True


def rule_attention(gm) -> bool:
    def one(gm, n):
        return _rewrite_mha(gm, n) if n.op == "call_module" else _rewrite_written_out(gm, n)

    return _each_call(gm, one)


RULES = {"attention": rule_attention}
