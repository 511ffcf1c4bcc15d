"""Triton source for the tunable templates, and the standalone `ModelNew` candidate that runs one.

The same source text is imported by the schedule game and embedded in the candidate, so what was tuned is
what is judged. Every launcher is split: `*_launch(...)` computes grid, arguments and options from shapes
and strides only (meta tensors work), the caller launches.
Rationale: docs/design/recipes.md#tunetemplates
"""
from __future__ import annotations

from kernelcraft.search.recipes import rownorm, rowscan, tunable
from kernelcraft.search.recipes.render import indent_block, reference_parts

HEADER = "import torch\nimport triton\nimport triton.language as tl\n"
TL_DTYPE = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16"}


# ---- GEMM with a fused epilogue --------------------------------------------------------------------

def _triangle(kernel: tunable.Kernel) -> tuple[str, str]:
    """(the K loop's bound, the output mask) of the kept triangle: j - i >= d (upper) or <= d (lower);
    a tile with no kept element runs no K iteration and stores zeros."""
    if not kernel.tri:
        return "", ""
    d = int(kernel.tri_diag)
    if kernel.tri == "upper":
        none_kept = f"(pid_n * BLOCK_N + BLOCK_N - 1) - pid_m * BLOCK_M < {d}"
        keep = f"(offs_cn[None, :] - offs_cm[:, None]) >= {d}"
    else:
        none_kept = f"pid_n * BLOCK_N - (pid_m * BLOCK_M + BLOCK_M - 1) > {d}"
        keep = f"(offs_cn[None, :] - offs_cm[:, None]) <= {d}"
    return (f"\n    k_hi = K\n    if {none_kept}:\n        k_hi = 0",
            f"\n    out = tl.where({keep}, out, 0.0)")


_LAUNCH_2D = """    M, K = a.shape
    N = b.shape[1]
    if b.shape[0] != K or len(vectors) != {v} or any(t.numel() >= 2 ** 31 for t in (a, b, out)):"""
_LAUNCH_BATCHED = """    nb, M, K = a.shape
    N = b.shape[2]
    if b.shape[0] != nb or b.shape[1] != K or tuple(out.shape) != (nb, M, N) or len(vectors) != {v} \\
            or any(t[0].numel() >= 2 ** 31 for t in (a, b, out)):"""
_PAD = """
    if a.shape[-1] % 16:  # copies with K in whole 64-blocks: aligned rows, no masked loads
        a = torch.nn.functional.pad(a, (0, -a.shape[-1] % 64))
        b = torch.nn.functional.pad(b, (0, 0, 0, -b.shape[-2] % 64))"""
_ALIGNED = """
    if b.stride(-1) == 1 and b.shape[-1] % 16 and b.stride(-2) % 16 == 0:  # the N tile wraps: no vector may cross
        b = b.contiguous()
    if a.stride(-2) == 1 and a.shape[-2] % 16 and a.stride(-1) % 16 == 0:  # the M tile wraps: likewise
        a = a.contiguous()"""
_K_MAJOR = """
    if b.stride(-2) != 1:  # B K-major, as Hopper's tf32 tensor-core MMA reads it (a copy, timed with the rest)
        b = b.transpose(-1, -2).contiguous().transpose(-1, -2)"""
_RUN_2D = '''def _kc_run(a, b, vectors, config):
    """a (..., M, K) @ b (K, N), then the epilogue; `vectors` are length-N tensors."""
    lead = a.shape[:-1]
    a = a.reshape(-1, a.shape[-1]){pad}{kmajor}{aligned}
    out = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype)
    vectors = tuple(v.reshape(-1).contiguous() for v in vectors)
    grid, args, meta = _kc_launch(a, b, vectors, out, **config)
    _kc_gemm_kernel[grid](*args, **meta)
    return out.reshape(*lead, out.shape[-1])'''
_LAUNCH_SPLIT = """    M, K = a.shape
    N = b.shape[1]
    if b.shape[0] != K or tuple(out.shape) != ({s}, M, N) or any(t.numel() >= 2 ** 31 for t in (a, b, out)):"""
_RUN_SPLIT = '''def _kc_run(a, b, vectors, config):
    """a (..., M, K) @ b (K, N) as {s} products over consecutive K ranges, summed."""
    lead = a.shape[:-1]
    a = a.reshape(-1, a.shape[-1]){kmajor}{aligned}
    part = torch.empty(({s}, a.shape[0], b.shape[1]), device=a.device, dtype=torch.float32)
    grid, args, meta = _kc_launch(a, b, vectors, part, **config)
    _kc_gemm_kernel[grid](*args, **meta)
    return part.sum(0).to(a.dtype).reshape(*lead, b.shape[1])'''
_RUN_BATCHED = '''def _kc_run(a, b, vectors, config):
    """a (batch, M, K) @ b (batch, K, N), then the epilogue; `vectors` are length-N tensors."""{kmajor}{aligned}
    out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), device=a.device, dtype=a.dtype)
    vectors = tuple(v.reshape(-1).contiguous() for v in vectors)
    grid, args, meta = _kc_launch(a, b, vectors, out, **config)
    _kc_gemm_kernel[grid](*args, **meta)
    return out'''


def _prepare(kernel: tunable.Kernel, run: str) -> str:
    """The launcher's operand copies (docs/design/recipes.md#tunable). For a plain fp32 product (neither
    batched nor split K, whose tuned configurations measured worse with it): A and B padded with zeros to whole
    64-blocks of K when K is not a multiple of 16 (unaligned rows leave every load unvectorised and masked), and
    B made K-major unless it is (Hopper's tf32 MMA takes K-major operands). Always: an operand whose
    contiguous dimension is the one a tile wraps around (`% M`, `% N` in the kernel) and not a multiple of 16,
    on 16-aligned rows, is copied, so that no vector load crosses the wrap (a misaligned address otherwise)."""
    plain = kernel.dtype == "float32" and not (kernel.batched or kernel.split_k > 1)
    pads = plain and not (kernel.a_trans or kernel.b_trans)
    kmajor = plain and not kernel.b_trans
    return (run.replace("{pad}", _PAD if pads else "").replace("{kmajor}", _K_MAJOR if kmajor else "")
            .replace("{aligned}", _ALIGNED))


def _gemm(kernel: tunable.Kernel) -> str:
    vs = [f"v{i}_ptr" for i in range(kernel.vectors)]
    vparams = "".join(f"{v}, " for v in vs)
    dot = 'acc = tl.dot(a, b, acc, input_precision="tf32x3")' if kernel.dtype == "float32" else "acc = tl.dot(a, b, acc)"
    loads = "\n".join(f"v{i} = tl.load(v{i}_ptr + offs_cn, mask=offs_cn < N, other=0.0).to(tl.float32)[None, :]"
                      for i in range(kernel.vectors))
    bound, tri_mask = _triangle(kernel)
    k_start, k_stop = "0", "k_hi" if kernel.tri else "K"
    if kernel.split_k > 1:  # a second grid axis over K ranges; each writes its partial sum to its own slice
        bparams, k_start, k_stop = "stride_cs, K_SPLIT, ", "k_lo", "k_lo + K_SPLIT"
        bstart = ("\n    k_lo = tl.program_id(1) * K_SPLIT\n    c_ptr += tl.program_id(1).to(tl.int64) * stride_cs")
        checks, run = _LAUNCH_SPLIT.format(s=kernel.split_k), _prepare(kernel, _RUN_SPLIT.replace("{s}", str(kernel.split_k)))
        grid = (f"(triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), {kernel.split_k})\n"
                f"    k_split = triton.cdiv(triton.cdiv(K, {kernel.split_k}), BLOCK_K) * BLOCK_K  # a whole number of blocks")
        strides = ("out.stride(0), k_split, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),\n"
                   "            out.stride(1), out.stride(2)")
    elif kernel.batched:  # a second grid axis over the products; the pointers start at this product's matrices
        bparams = "stride_ab, stride_bb, stride_cb, "
        bstart = ("\n    pid_b = tl.program_id(1).to(tl.int64)\n    a_ptr += pid_b * stride_ab"
                  "\n    b_ptr += pid_b * stride_bb\n    c_ptr += pid_b * stride_cb")
        checks, run = _LAUNCH_BATCHED.format(v=kernel.vectors), _prepare(kernel, _RUN_BATCHED)
        grid = "(triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N), nb)"
        strides = ("a.stride(0), b.stride(0), out.stride(0), M, N, K, a.stride(1), a.stride(2), b.stride(1),\n"
                   "            b.stride(2), out.stride(1), out.stride(2)")
    else:
        bparams, bstart = "", ""
        checks, run = _LAUNCH_2D.format(v=kernel.vectors), _prepare(kernel, _RUN_2D)
        grid = "(triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)"
        strides = "M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),\n            out.stride(0), out.stride(1)"
    even_k = "K % BLOCK_K == 0" if kernel.split_k == 1 else "K % k_split == 0"
    body = f'''
@triton.jit
def _kc_gemm_kernel(a_ptr, b_ptr, c_ptr, {vparams}{bparams}M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    pid = tl.program_id(0){bstart}
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m{bound}
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + ({k_start} + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + ({k_start} + offs_k)[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range({k_start}, {k_stop}, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k, other=0.0)
        {dot}
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
{indent_block(loads, 4) if loads else ""}
{indent_block(kernel.epilogue, 4)}{tri_mask}
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def _kc_launch(a, b, vectors, out, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages):
    """(grid, positional arguments, compile-time options) of one launch; reads shapes and strides only."""
{checks}
        raise ValueError("kernelcraft gemm: operands do not fit this kernel")
    grid = {grid}
    args = (a, b, out, *vectors, {strides})
    meta = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M, EVEN_K={even_k},
                num_warps=num_warps, num_stages=num_stages)
    return grid, args, meta


{run}
'''
    return body


def kernel_module(kernel: tunable.Kernel) -> str:
    """A Python module: the Triton kernel, `_kc_launch` and `_kc_run(operands..., config)`."""
    if kernel.kind == "gemm":
        body = _gemm(kernel)
    else:
        body = rowscan.source(kernel) if kernel.op in tunable.SCAN_OPS else rownorm.source(kernel)
    return f"# kernelcraft tunable template: {kernel.key()}\n{HEADER}\n{body.strip()}\n"


def forward_call(match: tunable.Match) -> str:
    """The expression ModelNew.forward returns (operands from the match's bindings)."""
    b = match.bindings
    if match.kernel.kind == "gemm":
        vecs = "".join(f"{v}, " for v in b.get("vectors", []))
        return f"_kc_run({b['a']}, {b['b']}, ({vecs}), _KC_CONFIG)"
    return (rowscan if match.kernel.op in tunable.SCAN_OPS else rownorm).forward_call(match)


def runner_source(task_source: str, match: tunable.Match) -> str:
    """The kernel module plus `_kc_forward(self, ...)`, the forward ModelNew gets, reading the
    configuration from the module global `_KC_CONFIG` (the schedule game switches it between
    measurements)."""
    _, sig = reference_parts(task_source)
    return "\n".join([kernel_module(match.kernel), "", "_KC_CONFIG = None", "", "",
                      f"def _kc_forward(self{', ' if sig.params else ''}{sig.params}):",
                      f"    return {forward_call(match)}", ""])


def candidate_source(task_source: str, match: tunable.Match, config: dict, *, note: str = "") -> str:
    """A standalone candidate: the kernel module first, then the reference embedded unchanged, then a
    `ModelNew` (a subclass of the reference `Model`, so parameters are created identically) whose
    forward runs the tuned kernel with `config`. The kernel module comes first so that the kernel sits
    on the same source lines as in the module the tuning compiled: Triton's cache key includes the line
    a kernel starts on, and the judge's worker then loads the binary instead of compiling it again."""
    reason = tunable.why_invalid(match.kernel, match.shape, config)
    if reason:
        raise tunable.TunableError(f"configuration {config} is not valid here: {reason}")
    ref, sig = reference_parts(task_source)
    cfg = ", ".join(f"{k!r}: {config[k]!r}" for k in tunable.KNOBS[match.kernel.kind])
    return "\n".join([
        kernel_module(match.kernel), "",
        f"# ---- kernelcraft recipe: tuned Triton kernel ({match.kernel.key()}, shape {match.shape})",
        f"# configuration: {tunable.config_key(config)}" + (f" ({note})" if note else ""),
        "# The reference model is embedded unchanged; ModelNew subclasses it and runs the kernel above.",
        ref, "", "# ---- generated " + "-" * 84,
        f"_KC_CONFIG = {{{cfg}}}", "", "",
        "class ModelNew(Model):",
        '    """The reference model, its forward replaced by one tuned Triton kernel."""', "",
        f"    def forward(self{', ' if sig.params else ''}{sig.params}):",
        f"        return {forward_call(match)}", ""])
