"""Scans over the last dimension as a row template: the FX match and the Triton source.

A scan is a `rownorm`-family Kernel whose `op` is `cumsum` or `cumprod`, with `reverse` (flip, scan, flip),
`exclusive` (the scan of all earlier elements: a zero column, by `cat` or `F.pad`, before the scan of all
but the last) and `masked` (the scan of `x * mask`, a second input). One program per row walks it in BLOCK_N
tiles, in scan order, with a running carry: one read of the input (and the mask) and one write, however the reference spelled it.
Invariants: a match covers the whole forward, a scan along the last dimension of one contiguous-able input;
anything else is no match.
Rationale: docs/design/recipes.md#rowscan
"""
from __future__ import annotations

import math
import operator

from kernelcraft.search.recipes.fxrules import _torch
from kernelcraft.search.recipes.gemmparts import _arg, _dt, _is_fn, _last_dim, _meta
from kernelcraft.search.recipes.render import indent_block
from kernelcraft.search.recipes.tunable import SCAN_OPS, Kernel, Match

IDENTITY = {"cumsum": "0.0", "cumprod": "1.0"}
_MASK = """
mask = mask.reshape(-1, shape[-1])
if mask.dtype == torch.bool:  # read as bytes
    mask = mask.view(torch.uint8)
if mask.stride(-1) != 1:
    mask = mask.contiguous()"""


# ---- the Triton source -----------------------------------------------------------------------------

def source(kernel: Kernel) -> str:
    """The module body: `_kc_row_kernel`, `_kc_launch(x, y, mask, BLOCK_N, num_warps, num_stages)` and
    `_kc_run(x, params, config, mask=None)` (params: always empty for a scan)."""
    ident, op = IDENTITY[kernel.op], kernel.op
    pos = "N - 1 - i" if kernel.reverse else "i"  # the column of scan position i
    src = ("c + 1" if kernel.reverse else "c - 1") if kernel.exclusive else "c"  # the column it scans
    inside = "(src >= 0) & (src < N) & live" if kernel.exclusive else "live"
    load_mask = f"\n        m = tl.load(m_row + src, mask=ok, other=1).to(tl.float32)\n        x = x * m" \
        if kernel.masked else ""
    block, combine = ("tl.cumsum(x, 0)", "carry + block") if op == "cumsum" else ("tl.cumprod(x, 0)", "carry * block")
    what = f"The {'reverse ' if kernel.reverse else ''}{'exclusive ' if kernel.exclusive else ''}{op}" \
        + (" of x * mask" if kernel.masked else "")
    prepare_mask = _MASK if kernel.masked else "mask = None"
    return f'''
@triton.jit
def _kc_row_kernel(x_ptr, y_ptr, m_ptr, stride_x, stride_y, stride_m, N: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    m_row = m_ptr + row * stride_m
    lanes = tl.arange(0, BLOCK_N)
    carry = tl.full([], {ident}, tl.float32)
    for off in range(0, N, BLOCK_N):
        i = off + lanes
        live = i < N
        c = {pos}
        src = {src}
        ok = {inside}
        x = tl.load(x_row + src, mask=ok, other={ident}).to(tl.float32){load_mask}
        block = {block}
        y = {combine}
        tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=live)
        carry = tl.sum(tl.where(lanes == BLOCK_N - 1, y, 0.0), 0)


def _kc_launch(x, y, mask, BLOCK_N, num_warps, num_stages):
    """(grid, positional arguments, compile-time options) of one launch; reads shapes and strides only."""
    rows, N = x.shape
    if x.stride(1) != 1 or y.stride(1) != 1 or (mask is not None and (tuple(mask.shape) != (rows, N)
                                                                      or mask.stride(1) != 1)):
        raise ValueError("kernelcraft scan: operands do not fit this kernel")
    m = mask if mask is not None else x
    return (rows,), (x, y, m, x.stride(0), y.stride(0), m.stride(0)), dict(N=N, BLOCK_N=BLOCK_N,
                                                                            num_warps=num_warps, num_stages=num_stages)


def _kc_run(x, params, config, mask=None):
    """{what} over the last dimension of x."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    if x.stride(-1) != 1:
        x = x.contiguous()
{indent_block(prepare_mask, 4)}
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    grid, args, meta = _kc_launch(x, y, mask, **config)
    _kc_row_kernel[grid](*args, **meta)
    return y.reshape(shape)
'''


def forward_call(match: Match) -> str:
    mask = f", {match.bindings['mask']}" if match.kernel.masked else ""
    return f"_kc_run({match.bindings['x']}, (), _KC_CONFIG{mask})"


# ---- the FX match ----------------------------------------------------------------------------------

def _scan_node(n, rank: int):
    """(op, its input) for cumsum/cumprod along the last dim without a dtype change, else None."""
    torch = _torch()
    for op in SCAN_OPS:
        if _is_fn(n, (getattr(torch, op),), (op,)) and _last_dim(_arg(n, 1, "dim"), rank) \
                and _arg(n, 2, "dtype") is None and hasattr(n.args[0], "op"):
            return op, n.args[0]
    return None


def _flip_of(n, rank: int):
    """The flipped node when n flips its input along the last dim only (`x.flip(d)`, `torch.flip(x, [d])`)."""
    torch = _torch()
    if not _is_fn(n, (torch.flip,), ("flip",)) or not n.args or not hasattr(n.args[0], "op"):
        return None
    if n.op == "call_method" and len(n.args) > 2:
        dims = tuple(n.args[1:])
    else:
        dims = _arg(n, 1, "dims")
    return n.args[0] if _last_dim(dims, rank) else None


def _all_but_last_column(n, x, rank: int, cols: int) -> bool:
    """n is x without its last column: `x.narrow(d, 0, x.size(d) - 1)`, `x[..., :-1]` or `x[:, :N-1]`."""
    torch = _torch()
    m = _meta(n)
    if m is None or tuple(m.shape) != tuple(_meta(x).shape[:-1]) + (cols - 1,):
        return False
    if _is_fn(n, (torch.narrow,), ("narrow",)) and n.args[0] is x:
        return _last_dim(_arg(n, 1, "dim"), rank) and _arg(n, 2, "start") == 0
    if _is_fn(n, (operator.getitem,)) and n.args[0] is x and isinstance(n.args[1], tuple):
        idx = list(n.args[1])
        last = idx[-1]
        lead = idx[:-1]
        if lead and lead[0] is Ellipsis:
            lead = lead[1:]
        if len(idx) != rank and not (idx and idx[0] is Ellipsis):
            return False
        return all(s == slice(None) for s in lead) and isinstance(last, slice) and last.step in (None, 1) \
            and last.start in (None, 0) and last.stop in (-1, cols - 1)
    return False


def _zeros_column(n, x, cols: int) -> bool:
    """n is zeros shaped like one column of x (`zeros_like` of such a value, `torch.zeros`, `new_zeros`)."""
    torch = _torch()
    m = _meta(n)
    if m is None or tuple(m.shape) != tuple(_meta(x).shape[:-1]) + (1,) or _dt(n) != _dt(x):
        return False
    return _is_fn(n, (torch.zeros_like, torch.zeros), ("new_zeros",)) and set(n.kwargs) <= {"dtype", "device"}


def _zero_column_in_front(n) -> bool:
    """n is `F.pad(v, (1, 0))`: one zero column before the last dimension (constant mode, value 0)."""
    pad = _arg(n, 1, "pad")
    return hasattr(n.args[0], "op") and isinstance(pad, (list, tuple)) and list(pad) == [1, 0] \
        and _arg(n, 2, "mode", "constant") == "constant" and _arg(n, 3, "value", None) in (None, 0, 0.0)


def match_scan(gm, model, out) -> Match | None:
    xs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not xs or len(xs) > 2 or any(_meta(p) is None or p.target.startswith("*") for p in xs):
        return None
    x = xs[0]
    dtype, shape = _dt(x), tuple(int(d) for d in _meta(x).shape)
    if dtype is None or len(shape) < 1 or shape[-1] < 1 or _dt(out) != dtype or tuple(_meta(out).shape) != shape:
        return None
    rank, cols = len(shape), shape[-1]
    reverse = exclusive = False
    core = out
    inner = _flip_of(core, rank)
    if inner is not None:
        reverse, core = True, inner
    torch = _torch()
    if _is_fn(core, (torch.cat,)) and not reverse and _last_dim(_arg(core, 1, "dim", 0), rank) \
            and isinstance(core.args[0], (list, tuple)) and len(core.args[0]) == 2:
        zeros, core = core.args[0]
        if not hasattr(zeros, "op") or not hasattr(core, "op") or not _zeros_column(zeros, x, cols):
            return None
        exclusive = True
    elif _is_fn(core, (torch.nn.functional.pad,)) and not reverse and _zero_column_in_front(core):
        core, exclusive = core.args[0], True
    found = _scan_node(core, rank)
    if found is None:
        return None
    op, src = found
    if exclusive:
        if not _all_but_last_column(src, x, rank, cols):
            return None
        src = x
    if reverse:
        src = _flip_of(src, rank)
        if src is None:
            return None
    masked, mask = False, None
    if src is not x:
        if not _is_fn(src, (operator.mul, torch.mul), ("mul",)) or exclusive or len(xs) != 2:
            return None
        a, b = src.args[0], src.args[1]
        mask = b if a is x else a if b is x else None
        if mask is not xs[1] or tuple(_meta(mask).shape) != shape or str(_meta(mask).dtype) not in (
                "torch.bool", f"torch.{dtype}"):
            return None
        masked = True
    if len(xs) != 1 + int(masked):
        return None
    used = {n for n in gm.graph.nodes if n.op not in ("placeholder", "output")}
    if used != _ancestors(out):
        return None  # another computation beside the scan
    rows = math.prod(shape[:-1])
    kernel = Kernel("rownorm", dtype, op=op, reverse=reverse, exclusive=exclusive, masked=masked)
    return Match(kernel, {"rows": rows, "cols": cols}, {"x": x.target, **({"mask": mask.target} if masked else {})})


def _ancestors(out) -> set:
    """Every node `out` depends on (itself included), placeholders excluded."""
    seen, todo = set(), [out]
    while todo:
        n = todo.pop()
        if n in seen or n.op == "placeholder":
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return seen
