"""Techniques: a short list of what a candidate does (fusion, CUDA graphs, algebraic rewrite, ...).

Recipes map their tokens to technique names; other code is classified statically from its source, never
executed (what it *uses*). The names are stable strings shared by the prompt, the progress display and the
report.
Rationale: docs/design/search.md#techniques
"""
from __future__ import annotations

import re

TOKEN_TECHNIQUES = {
    "rewrite:diag_matmul": "algebraic rewrite (diag matmul -> broadcast multiply)",
    "rewrite:reduce_linear": "algebraic rewrite (reduce the weights, not the outputs)",
    "rewrite:fold_scalars": "algebraic rewrite (folded scalar chain)",
    "rewrite:dead_code": "dead/recomputed op removal",
    "rewrite:inplace": "in-place elementwise ops",
    "rewrite:identities": "algebraic rewrite (identities: x*1, x+x, cancelling transposes, unobserved clones)",
    "rewrite:clamp_chain": "algebraic rewrite (clamp/affine chain merged, redundant clamps removed)",
    "rewrite:size1_reduce": "short-circuit (reduction over a size-1 dim is the input)",
    "rewrite:sink_pointwise": "algebraic rewrite (pointwise op moved past a reduction/pool)",
    "rewrite:fuse_activation": "fused activation (x*sigmoid(x) -> silu, ...)",
    "rewrite:pool_merge": "algebraic rewrite (two tiling pools merged into one)",
    "rewrite:pool_linear": "algebraic rewrite (average-pool the weights, not the outputs)",
    "rewrite:attention": "fused attention (scaled_dot_product_attention: the scores never written)",
    "rewrite:conv_reduce": "algebraic rewrite (a convolution's global sum/mean without the convolution)",
    "triton": "generated Triton kernels (fused elementwise chains, reductions, poolings, depthwise convolutions)",
    "tuned": "tuned Triton kernel (a template for the whole forward: GEMM + epilogue, row norm or scan)",
    "tuned_gemm": "tuned Triton GEMM kernels (each GEMM + its elementwise tail; the rest PyTorch)",
    "compile:default": "torch.compile (default)",
    "compile:max-autotune-no-cudagraphs": "torch.compile (max-autotune-no-cudagraphs)",
    "compile:max-autotune": "torch.compile (max-autotune)",
    "compile:reduce-overhead": "torch.compile (reduce-overhead, CUDA graphs)",
    "cudagraph": "CUDA graph",
    "channels_last": "channels_last memory format",
    "cudnn_benchmark": "cudnn benchmark",
    "tf32": "reduced precision (TF32)",
    "bf16": "reduced precision (bf16 autocast)",
}

_PATTERNS = [
    (r"load_inline\s*\(|cpp_extension", "custom CUDA kernel (load_inline)"),
    (r"@\s*triton\.jit|@\s*jit\b", "Triton kernel"),
    (r"torch\.compile\s*\(", "torch.compile"),
    (r"CUDAGraph\s*\(|torch\.cuda\.graph\s*\(|make_graphed_callables", "CUDA graph"),
    (r"channels_last", "channels_last memory format"),
    (r"cudnn\.benchmark\s*=\s*True", "cudnn benchmark"),
    (r"allow_tf32\s*=\s*True|set_float32_matmul_precision", "reduced precision (TF32)"),
    (r"autocast|bfloat16|\.half\(\)|float16", "reduced precision (fp16/bf16)"),
    (r"__shared__|smem|shared memory", "shared-memory tiling"),
    (r"wmma|mma\.sync|tl\.dot", "tensor cores"),
]


def techniques(source: str | None, meta: dict | None = None) -> list[str]:
    meta = meta or {}
    if meta.get("recipe") is not None:
        return [TOKEN_TECHNIQUES.get(t, t) for t in meta["recipe"]] or ["reference (unchanged)"]
    if not source:
        return []
    found = []
    for pat, name in _PATTERNS:
        if re.search(pat, source) and name not in found:
            found.append(name)
    if "Triton kernel" in found or "custom CUDA kernel (load_inline)" in found:
        found.append("fusion / custom kernel")
    return found or ["PyTorch-level rewrite"]
