"""Reductions over one dimension as generated Triton kernels: sum, mean, max and min values, argmax and argmin.

A node `torch.sum/mean/amax/amin/argmax/argmin(x, dim)` (function or method form, `keepdim` either way), or
`torch.max/min(x, dim)` whose indices are never read (`[0]` or `.values`), over a floating tensor, becomes a call
to a kernel that reads x once as (outer, R, inner): one program per outer index and tile of inner positions walks
R in chunks, one accumulator per lane (fp32), then combines its lanes. NaNs propagate as in PyTorch; argmax and
argmin give the first index of the extreme, or of the first NaN. A tensor with no elements runs the PyTorch op.
Invariants: only the reduction node is replaced; its input is read as it is (made contiguous when it is not).
Rationale: docs/design/recipes.md#dimreduce
"""
from __future__ import annotations

import operator

from kernelcraft.search.recipes.gemmparts import _arg, _meta
from kernelcraft.search.recipes.render import replace_by_launcher

KINDS = ("sum", "mean", "amax", "amin", "argmax", "argmin")
MAX_TILE = 2048  # elements of one program's (R chunk x inner tile) accumulator
MAX_INNER = 128  # inner positions per program
MIN_WORK = 2048  # elements one program must read, else the PyTorch op runs (decided at run time, by shape)

KERNELS = '''
@triton.jit
def _kc_max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _kc_min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _kc_dimreduce_kernel(x_ptr, out_ptr, R, I, TILES, KIND: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_I: tl.constexpr):
    # KIND: 0 sum, 1 mean, 2 amax, 3 amin, 4 argmax, 5 argmin
    pid = tl.program_id(0).to(tl.int64)
    o, t = pid // TILES, (pid % TILES).to(tl.int32)
    i = t * BLOCK_I + tl.arange(0, BLOCK_I)  # offsets inside one outer slab (R x I) in int32
    imask = i < I
    base = x_ptr + o * R * I
    lanes = tl.arange(0, BLOCK_R)
    if KIND <= 1:
        neutral = 0.0
    elif KIND % 2 == 0:
        neutral = float("-inf")
    else:
        neutral = float("inf")
    acc = tl.full([BLOCK_R, BLOCK_I], neutral, tl.float32)
    at = tl.full([BLOCK_R, BLOCK_I], -1, tl.int32)  # argmax/argmin: each lane's first extreme so far
    for r0 in range(0, R, BLOCK_R):
        r = r0 + lanes
        m = (r < R)[:, None] & imask[None, :]
        v = tl.load(base + r[:, None] * I + i[None, :], mask=m, other=neutral).to(tl.float32)
        if KIND <= 1:
            acc += v
        elif KIND == 2:
            acc = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
        elif KIND == 3:
            acc = tl.minimum(acc, v, propagate_nan=tl.PropagateNan.ALL)
        else:
            v_nan, acc_nan = v != v, acc != acc
            if KIND == 4:
                better = v > acc
            else:
                better = v < acc
            take = m & ((at < 0) | (v_nan & (acc_nan == 0)) | (better & (acc_nan == 0)))
            acc = tl.where(take, v, acc)
            at = tl.where(take, tl.broadcast_to(r[:, None], [BLOCK_R, BLOCK_I]), at)
    if KIND <= 1:
        res = tl.sum(acc, axis=0)
        if KIND == 1:
            res = res / R
        tl.store(out_ptr + o * I + i, res.to(out_ptr.dtype.element_ty), mask=imask)
    elif KIND == 2:
        tl.store(out_ptr + o * I + i, tl.reduce(acc, 0, _kc_max_nan).to(out_ptr.dtype.element_ty), mask=imask)
    elif KIND == 3:
        tl.store(out_ptr + o * I + i, tl.reduce(acc, 0, _kc_min_nan).to(out_ptr.dtype.element_ty), mask=imask)
    else:  # across the lanes: a NaN first, then the extreme value; the smallest index among the lanes that hold it
        used = at >= 0
        is_nan = (acc != acc) & used
        any_nan = tl.max(is_nan.to(tl.int32), axis=0) > 0
        if KIND == 4:
            ext = tl.max(tl.where(used & (is_nan == 0), acc, float("-inf")), axis=0)
        else:
            ext = tl.min(tl.where(used & (is_nan == 0), acc, float("inf")), axis=0)
        hit = used & tl.where(any_nan[None, :], is_nan, acc == ext[None, :])
        idx = tl.min(tl.where(hit, at, R), axis=0)
        tl.store(out_ptr + o * I + i, idx.to(tl.int64), mask=imask)
'''

LAUNCHER = '''
def _kc_dimreduce(x, dim, keepdim, kind, fallback):
    """x reduced over `dim` by the generated kernel; `fallback()` (the PyTorch op) for a tensor with no elements,
    or where one program would read fewer than {min_work} elements (short rows: PyTorch packs several per block)."""
    if x.numel() == 0:
        return fallback()
    dim = dim % x.dim()
    outer = math.prod(x.shape[:dim])
    R, inner = x.shape[dim], math.prod(x.shape[dim + 1:])
    if R * min(inner, {max_inner}) < {min_work} or R * inner >= 2 ** 31:  # a slab's offsets are int32
        return fallback()
    x = x.contiguous()
    shape = list(x.shape)
    if keepdim:
        shape[dim] = 1
    else:
        del shape[dim]
    code = ("sum", "mean", "amax", "amin", "argmax", "argmin").index(kind)
    out = torch.empty(shape, dtype=torch.int64 if code >= 4 else x.dtype, device=x.device)
    block_i = min({max_inner}, triton.next_power_of_2(inner))
    block_r = max(1, min(triton.next_power_of_2(R), {max_tile} // block_i))
    tiles = triton.cdiv(inner, block_i)
    _kc_dimreduce_kernel[(outer * tiles,)](x, out, R, inner, tiles, KIND=code, BLOCK_R=block_r, BLOCK_I=block_i,
                                           num_warps=8 if block_r * block_i >= 1024 else 4)
    return out
'''


def _dim(dim, rank: int) -> int | None:
    """`dim` (an int or a one-element list/tuple) as a dimension index of `rank` dimensions, else None."""
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
        return None
    return dim % rank


def match(n):
    """(node to replace, kind, input node, dim as written, keepdim) when `n` is a reduction over one dimension
    this module lowers, else None. For `torch.max/min(x, dim)`, `n` is the `[0]`/`.values` node and the pair is never read
    otherwise."""
    import torch

    if n.op == "call_function" and n.target in (operator.getitem, getattr) and len(n.args) == 2 \
            and n.args[1] in (0, "values") and hasattr(n.args[0], "op"):
        pair = n.args[0]
        if not all(u.op == "call_function" and u.target in (operator.getitem, getattr) and u.args[1] in (0, "values")
                   for u in pair.users):
            return None
        if (pair.op == "call_function" and pair.target in (torch.max, torch.min)) or \
                (pair.op == "call_method" and pair.target in ("max", "min")):
            name = pair.target if isinstance(pair.target, str) else pair.target.__name__
            if _arg(pair, 1, "dim") is None:
                return None
            return _checked(n, pair, "amax" if name == "max" else "amin", set(pair.kwargs) - {"dim", "keepdim"})
        return None
    if n.op == "call_function" and getattr(n.target, "__name__", None) in KINDS and \
            getattr(torch, n.target.__name__, None) is n.target:
        return _checked(n, n, n.target.__name__, set(n.kwargs) - {"dim", "keepdim"})
    if n.op == "call_method" and n.target in KINDS:
        return _checked(n, n, n.target, set(n.kwargs) - {"dim", "keepdim"})
    return None


def _checked(out, call, kind: str, extra_kwargs: set):
    """The match for `call` (the op) replacing `out` (its value node), when its operands and shapes qualify."""
    import torch

    if extra_kwargs or len(call.args) > 3 or not call.args or not hasattr(call.args[0], "op"):
        return None
    x, xm, om = call.args[0], _meta(call.args[0]), _meta(out)
    if xm is None or om is None or xm.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not xm.shape:
        return None
    raw = _arg(call, 1, "dim")
    raw = raw[0] if isinstance(raw, (list, tuple)) and len(raw) == 1 else raw
    dim = _dim(raw, len(xm.shape))
    keepdim = _arg(call, 2, "keepdim", False)
    if dim is None or not isinstance(keepdim, bool):
        return None
    want = list(xm.shape)
    want[dim:dim + 1] = [1] if keepdim else []
    dtype = torch.int64 if kind.startswith("arg") else xm.dtype
    if list(om.shape) != want or om.dtype != dtype:
        return None
    return out, kind, x, raw, keepdim


def lower(gm) -> tuple[str, list[dict]] | None:
    """Replace every reduction over one dimension in gm.graph by a call to `_kc_dimreduce`; (source, regions) or
    None when there is none."""
    found = [m for m in (match(n) for n in list(gm.graph.nodes)) if m is not None]
    if not found:
        return None
    g, info, defs = gm.graph, [], []
    for idx, (out, kind, x, dim, keepdim) in enumerate(found):
        name = f"_kc_red{idx}"
        defs.append(f"def {name}(x):\n    return _kc_dimreduce(x, {dim}, {keepdim}, {kind!r}, "
                    f"lambda: torch.{kind}(x, dim={dim}, keepdim={keepdim}))\n")
        pair = out.args[0] if out.target in (operator.getitem, getattr) else None
        rank = len(_meta(x).shape)
        info.append(replace_by_launcher(gm, out, name, lambda g, x=x: (x,), f"{kind} over dimension {dim % rank}"))
        if pair is not None and not pair.users:
            g.erase_node(pair)
    g.lint()
    gm.recompile()
    launcher_src = LAUNCHER.format(max_inner=MAX_INNER, max_tile=MAX_TILE, min_work=MIN_WORK)
    return "import math\n" + KERNELS + "\n" + launcher_src + "\n\n" + "\n\n".join(defs), info
