"""Depthwise 1-D and 2-D convolutions as generated Triton kernels.

`nn.Conv1d`, `nn.Conv2d` and `F.conv1d`, `F.conv2d` on a batched floating input, with one group per input channel
(`groups == in_channels > 1`, each group's `out_channels // groups` outputs reading its one channel), become a call
to one kernel: one output element per lane, the kernel's taps unrolled, every size, stride, padding and dilation a
compile-time constant, the input read as (N*C, H, W) (a 1-D convolution as a 2-D one of height 1). The weight and
bias are the kernel's tensor arguments, never constants of the source; products are summed in fp32.
Invariants: a module's settings, weight and bias are read at run time (the state of the model, not of the trace);
a `padding_mode` other than zeros, a convolution that is not depthwise at run time, or anything else the kernel
does not take runs the PyTorch op instead.
Rationale: docs/design/recipes.md#depthwise
"""
from __future__ import annotations

from kernelcraft.search.recipes.gemmparts import _floating_batched, _meta
from kernelcraft.search.recipes.render import replace_by_launcher

BLOCK = 256  # output elements per program

KERNELS = '''
@triton.jit
def _kc_dwconv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_out, C_OUT: tl.constexpr, M: tl.constexpr, H: tl.constexpr,
                      W: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                      SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr,
                      DW: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = o < n_out
    ow = (o % OW).to(tl.int32)  # positions inside one (H, W) plane in int32: the taps' arithmetic is per tap
    t = o // OW
    oh = (t % OH).to(tl.int32)
    t = t // OH  # the output plane, n * C_OUT + oc
    oc = (t % C_OUT).to(tl.int32)
    base = x_ptr + (t // M) * (H * W)  # the input plane n * C_IN + oc // M, its start in int64
    w_base = w_ptr + oc * (KH * KW)
    acc = tl.zeros([BLOCK], tl.float32)
    for kh in tl.static_range(KH):
        i_h = oh * SH - PH + kh * DH
        ok_h = mask & (i_h >= 0) & (i_h < H)
        for kw in tl.static_range(KW):
            i_w = ow * SW - PW + kw * DW
            ok = ok_h & (i_w >= 0) & (i_w < W)
            v = tl.load(base + i_h * W + i_w, mask=ok, other=0.0).to(tl.float32)
            acc += v * tl.load(w_base + (kh * KW + kw), mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + oc, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + o, acc.to(out_ptr.dtype.element_ty), mask=mask)
'''

LAUNCHER = '''
def _kc_dwconv(x, weight, bias, nd, stride, padding, dilation, groups, fallback):
    """x convolved depthwise by the generated kernel, or `fallback()` (the PyTorch op) where the kernel does not
    apply."""
    def per_dim(v):
        v = tuple(v) if isinstance(v, (list, tuple)) else (v,) * nd
        v = v * nd if len(v) == 1 else v
        return v if len(v) == nd and all(isinstance(i, int) for i in v) else None
    floating = (torch.float32, torch.float16, torch.bfloat16)
    if x.dim() != nd + 2 or weight.dim() != nd + 2 or x.dtype not in floating or x.numel() == 0 \\
            or weight.numel() == 0 or weight.dtype != x.dtype or weight.device != x.device \\
            or groups != x.shape[1] or groups < 2 or weight.shape[1] != 1 or weight.shape[0] % groups \\
            or (bias is not None and (tuple(bias.shape) != (weight.shape[0],) or bias.dtype != x.dtype
                                      or bias.device != x.device)):
        return fallback()
    k, s, d = tuple(weight.shape[2:]), per_dim(stride), per_dim(dilation)
    if None in (s, d) or any(v < 1 for v in s + d):
        return fallback()
    if padding == "same":  # PyTorch's: d * (k - 1) in all, its odd element on the right; stride 1 only
        if any(v != 1 for v in s):
            return fallback()
        lo = tuple(dd * (kk - 1) // 2 for kk, dd in zip(k, d))
        hi = tuple(dd * (kk - 1) - ll for kk, dd, ll in zip(k, d, lo))
    else:
        lo = hi = (0,) * nd if padding == "valid" else per_dim(padding)
    if lo is None or any(v < 0 for v in lo):
        return fallback()
    lift = (1,) * (2 - nd)
    size, k, s, d = lift + tuple(x.shape[2:]), lift + k, lift + s, lift + d
    lo, hi = (0,) * (2 - nd) + lo, (0,) * (2 - nd) + hi
    out_size = tuple((size[i] + lo[i] + hi[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    if min(out_size) < 1 or size[0] * size[1] >= 2 ** 31:  # one plane's offsets are int32 in the kernel
        return fallback()
    x, weight = x.contiguous(), weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    c_out = weight.shape[0]
    out = torch.empty((x.shape[0], c_out) + out_size[2 - nd:], dtype=x.dtype, device=x.device)
    n = out.numel()
    _kc_dwconv_kernel[(triton.cdiv(n, {block}),)](x, weight, weight if bias is None else bias, out, n, c_out,
                                                  c_out // groups, *size, *out_size, *k, *s, *lo, *d,
                                                  HAS_BIAS=bias is not None, BLOCK={block}, num_warps=4)
    return out


def _kc_dwconv_module(m, x):
    """A convolution module's forward through `_kc_dwconv`, its settings, weight and bias read now; the module
    itself where the kernel does not take them."""
    if type(m) not in (torch.nn.Conv1d, torch.nn.Conv2d) or m.padding_mode != "zeros":
        return m(x)
    nd = 1 if type(m) is torch.nn.Conv1d else 2
    return _kc_dwconv(x, m.weight, m.bias, nd, m.stride, m.padding, m.dilation, m.groups, lambda: m(x))
'''

ARGS = ("weight", "bias", "stride", "padding", "dilation", "groups")
DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def _functions():
    import torch.nn.functional as F

    return {F.conv1d: 1, F.conv2d: 2}


def _modules():
    import torch.nn as nn

    return {nn.Conv1d: 1, nn.Conv2d: 2}


def _depthwise(channels: int, groups, weight_shape) -> bool:
    """One group per input channel, each with a whole number of outputs and a weight of one input channel."""
    return isinstance(groups, int) and groups == channels > 1 and weight_shape[0] % groups == 0 \
        and weight_shape[1] == 1


def _settings(n, nd: int) -> dict | None:
    """A functional convolution's arguments by name, when the kernel takes them: the weight and bias parameters
    or graph inputs, everything else a constant, the input depthwise."""
    if len(n.args) > len(ARGS) + 1 or set(n.kwargs) - set(ARGS):
        return None
    got = {**DEFAULTS, **dict(zip(ARGS, n.args[1:])), **n.kwargs}
    w, b = got["weight"], got["bias"]
    tensors_ok = all(v is None or getattr(v, "op", None) in ("get_attr", "placeholder") for v in (w, b))
    if w is None or not tensors_ok or any(hasattr(got[k], "op") for k in ARGS[2:]):
        return None
    w_meta = _meta(w)
    if w_meta is None or len(w_meta.shape) != nd + 2 \
            or not _depthwise(_meta(n.args[0]).shape[1], got["groups"], w_meta.shape):
        return None
    return got


def match(gm, n):
    """("module", node) or ("function", node, nd, settings) when `n` is a depthwise convolution this module
    lowers."""
    if n.op == "call_module" and len(n.args) == 1 and not n.kwargs:
        m = gm.get_submodule(n.target)
        nd = _modules().get(type(m))
        if nd is not None and _floating_batched(n.args[0], nd) and m.padding_mode == "zeros" \
                and _meta(n.args[0]).shape[1] == m.in_channels and _depthwise(m.in_channels, m.groups, m.weight.shape):
            return ("module", n)
        return None
    if n.op == "call_function" and n.args and hasattr(n.args[0], "op"):
        nd = next((v for f, v in _functions().items() if n.target is f), None)
        if nd is None or not _floating_batched(n.args[0], nd):
            return None
        settings = _settings(n, nd)
        return ("function", n, nd, settings) if settings is not None else None
    return None


def lower(gm) -> tuple[str, list[dict]] | None:
    """Replace every depthwise convolution in gm.graph by a call to a generated launcher; (source, regions) or
    None."""
    found = [m for m in (match(gm, n) for n in list(gm.graph.nodes)) if m is not None]
    if not found:
        return None
    info, defs = [], []
    for idx, m in enumerate(found):
        n, name = m[1], f"_kc_dwconv{idx}"
        x = n.args[0]
        if m[0] == "module":
            defs.append(f"def {name}(m, x):\n    return _kc_dwconv_module(m, x)\n")
            what = type(gm.get_submodule(n.target)).__name__
            info.append(replace_by_launcher(gm, n, name, lambda g, n=n, x=x: (g.get_attr(n.target), x),
                                            f"depthwise {what}"))
            continue
        _, _, nd, st = m
        given = ", ".join(f"{st[k]!r}" for k in ARGS[2:])
        defs.append(f"def {name}(x, w, b):\n    return _kc_dwconv(x, w, b, {nd}, {given}, "
                    f"lambda: torch.nn.functional.conv{nd}d(x, w, b, {given}))\n")
        info.append(replace_by_launcher(gm, n, name, lambda g, x=x, st=st: (x, st["weight"], st["bias"]),
                                        f"depthwise conv{nd}d"))
    gm.graph.lint()
    gm.recompile()
    return KERNELS + "\n" + LAUNCHER.format(block=BLOCK) + "\n\n" + "\n\n".join(defs), info
