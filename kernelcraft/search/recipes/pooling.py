"""Max and average pooling over one to three spatial dimensions as generated Triton kernels.

`nn.MaxPool1d/2d/3d`, `nn.AvgPool1d/2d/3d` and `F.max_pool1d/2d/3d`, `F.avg_pool1d/2d/3d` on a batched floating
input become a call to one kernel: one output element per lane, its window's taps unrolled, every size, stride,
padding and dilation a compile-time constant, the input read as (N*C, D, H, W). Max propagates NaNs as PyTorch
does; average divides by the window's size, or by its taps inside the input (`count_include_pad=False`).
Invariants: a module's settings are read at run time (the state of the model, not of the trace); `ceil_mode`,
`return_indices`, a `divisor_override` or anything the kernel does not take runs the PyTorch op instead.
Rationale: docs/design/recipes.md#pooling
"""
from __future__ import annotations

from kernelcraft.search.recipes.gemmparts import _floating_batched
from kernelcraft.search.recipes.render import replace_by_launcher

BLOCK = 256  # output elements per program

KERNELS = '''
@triton.jit
def _kc_pool_kernel(x_ptr, out_ptr, n_out, D: tl.constexpr, H: tl.constexpr, W: tl.constexpr, OD: tl.constexpr,
                    OH: tl.constexpr, OW: tl.constexpr, KD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                    SD: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PD: tl.constexpr, PH: tl.constexpr,
                    PW: tl.constexpr, DD: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr, IS_MAX: tl.constexpr,
                    COUNT_PAD: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = o < n_out
    ow = (o % OW).to(tl.int32)  # positions inside one (D, H, W) plane in int32: the taps' arithmetic is per tap
    t = o // OW
    oh = (t % OH).to(tl.int32)
    t = t // OH
    od = (t % OD).to(tl.int32)
    base = x_ptr + (t // OD) * (D * H * W)  # the plane's start in int64
    if IS_MAX:
        neutral = float("-inf")
    else:
        neutral = 0.0
    acc = tl.full([BLOCK], neutral, tl.float32)
    taps = tl.zeros([BLOCK], tl.float32)
    for kd in tl.static_range(KD):
        i_d = od * SD - PD + kd * DD
        ok_d = mask & (i_d >= 0) & (i_d < D)
        for kh in tl.static_range(KH):
            i_h = oh * SH - PH + kh * DH
            ok_h = ok_d & (i_h >= 0) & (i_h < H)
            for kw in tl.static_range(KW):
                i_w = ow * SW - PW + kw * DW
                ok = ok_h & (i_w >= 0) & (i_w < W)
                v = tl.load(base + (i_d * H + i_h) * W + i_w, mask=ok, other=neutral).to(tl.float32)
                if IS_MAX:
                    acc = tl.maximum(acc, v, propagate_nan=tl.PropagateNan.ALL)
                else:
                    acc += v
                    taps += ok.to(tl.float32)
    if not IS_MAX:
        if COUNT_PAD:
            acc = acc / (KD * KH * KW)
        else:
            acc = acc / tl.maximum(taps, 1.0)
    tl.store(out_ptr + o, acc.to(out_ptr.dtype.element_ty), mask=mask)
'''

LAUNCHER = '''
def _kc_pool(x, nd, is_max, kernel_size, stride, padding, dilation, count_include_pad, fallback):
    """x pooled by the generated kernel, or `fallback()` (the PyTorch op) where the kernel does not apply."""
    def per_dim(v, default):
        v = default if v is None or (isinstance(v, (list, tuple)) and len(v) == 0) else v
        v = tuple(v) if isinstance(v, (list, tuple)) else (v,) * nd
        v = v * nd if len(v) == 1 else v
        return v if len(v) == nd and all(isinstance(i, int) for i in v) else None
    k = per_dim(kernel_size, None)
    s, p, d = per_dim(stride, k), per_dim(padding, 0), per_dim(dilation, 1)
    if x.dim() != nd + 2 or x.numel() == 0 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16) \\
            or None in (k, s, p, d) or any(v < 1 for v in k + s + d) \\
            or any(2 * pp > (kk - 1) * dd + 1 for pp, kk, dd in zip(p, k, d)):
        return fallback()
    lift = (1,) * (3 - nd)
    size, k, s, d, p = lift + tuple(x.shape[2:]), lift + k, lift + s, lift + d, (0,) * (3 - nd) + p
    out_size = tuple((size[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(3))
    if min(out_size) < 1 or math.prod(size) >= 2 ** 31:  # one plane's offsets are int32 in the kernel
        return fallback()
    x = x.contiguous()
    out = torch.empty(tuple(x.shape[:2]) + out_size[3 - nd:], dtype=x.dtype, device=x.device)
    n = out.numel()
    _kc_pool_kernel[(triton.cdiv(n, {block}),)](x, out, n, *size, *out_size, *k, *s, *p, *d, IS_MAX=is_max,
                                                COUNT_PAD=count_include_pad, BLOCK={block}, num_warps=4)
    return out


def _kc_pool_module(m, x):
    """A pooling module's forward through `_kc_pool`, its settings read now; the module itself where the kernel
    does not take them."""
    name = type(m).__name__
    nd = int(name[-2])
    if getattr(m, "ceil_mode", False) or getattr(m, "return_indices", False) \\
            or getattr(m, "divisor_override", None) is not None:
        return m(x)
    if name.startswith("Max"):
        return _kc_pool(x, nd, True, m.kernel_size, m.stride, m.padding, m.dilation, True, lambda: m(x))
    return _kc_pool(x, nd, False, m.kernel_size, m.stride, m.padding, 1, m.count_include_pad, lambda: m(x))
'''


def _functions():
    import torch.nn.functional as F

    return {F.max_pool1d: (1, True), F.max_pool2d: (2, True), F.max_pool3d: (3, True),
            F.avg_pool1d: (1, False), F.avg_pool2d: (2, False), F.avg_pool3d: (3, False)}


def _modules():
    import torch.nn as nn

    return (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)


def _settings(n, is_max: bool) -> dict | None:
    """A functional pooling call's arguments by name, when the kernel takes them."""
    names = (["kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"] if is_max else
             ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"])
    if len(n.args) > len(names) + 1 or set(n.kwargs) - set(names):
        return None
    got = dict(zip(names, n.args[1:]), **n.kwargs)
    defaults = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False,
                "count_include_pad": True, "divisor_override": None}
    got = {k: got.get(k, defaults.get(k)) for k in names}
    if got["kernel_size"] is None or got["ceil_mode"] or got.get("return_indices") or got.get("divisor_override") \
            is not None or any(hasattr(v, "op") for v in got.values()):
        return None
    return got


def match(gm, n):
    """("module", node) or ("function", node, nd, is_max, settings) when `n` is a pooling this module lowers."""
    if n.op == "call_module" and len(n.args) == 1 and not n.kwargs:
        m = gm.get_submodule(n.target)
        if type(m) in _modules() and _floating_batched(n.args[0], int(type(m).__name__[-2])) \
                and not getattr(m, "ceil_mode", False) and not getattr(m, "return_indices", False) \
                and getattr(m, "divisor_override", None) is None:
            return ("module", n)
        return None
    if n.op == "call_function" and n.args and hasattr(n.args[0], "op"):
        spec = next((v for f, v in _functions().items() if n.target is f), None)
        if spec is None or not _floating_batched(n.args[0], spec[0]):
            return None
        settings = _settings(n, spec[1])
        return ("function", n, spec[0], spec[1], settings) if settings is not None else None
    return None


def lower(gm) -> tuple[str, list[dict]] | None:
    """Replace every pooling in gm.graph by a call to a generated launcher; (source, regions) or None."""
    found = [m for m in (match(gm, n) for n in list(gm.graph.nodes)) if m is not None]
    if not found:
        return None
    info, defs = [], []
    for idx, m in enumerate(found):
        n, name = m[1], f"_kc_pool{idx}"
        x = n.args[0]
        if m[0] == "module":
            defs.append(f"def {name}(m, x):\n    return _kc_pool_module(m, x)\n")
            info.append(replace_by_launcher(gm, n, name, lambda g, n=n, x=x: (g.get_attr(n.target), x),
                                            type(gm.get_submodule(n.target)).__name__))
            continue
        _, _, nd, is_max, st = m
        fn = f"torch.nn.functional.{'max' if is_max else 'avg'}_pool{nd}d"
        given = ", ".join(f"{k}={v!r}" for k, v in st.items())
        defs.append(f"def {name}(x):\n    return _kc_pool(x, {nd}, {is_max}, {st['kernel_size']!r}, "
                    f"{st['stride']!r}, {st['padding']!r}, {st.get('dilation', 1)!r}, "
                    f"{st.get('count_include_pad', True)!r}, lambda: {fn}(x, {given}))\n")
        info.append(replace_by_launcher(gm, n, name, lambda g, x=x: (x,), fn.rsplit(".", 1)[1]))
    gm.graph.lint()
    gm.recompile()
    return "import math\n" + KERNELS + "\n" + LAUNCHER.format(block=BLOCK) + "\n\n" + "\n\n".join(defs), info
