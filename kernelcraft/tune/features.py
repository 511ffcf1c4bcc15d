"""Compiled-kernel features: what the compiler made of one configuration (CuAsmRL's read-only state).

A configuration is compiled as a launch would compile it (on a GPU through the JIT's `warmup`, filling
Triton's cache; else for sm_90 directly) and never run; registers, spills, shared memory, occupancy and the
SASS instruction mix are read from the cubin (`cuobjdump`, `nvdisasm`) into a dict with the fixed keys
`FEATURE_KEYS`. A compile error is returned, not raised.

Rationale: docs/design/tune.md#features
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kernelcraft.search.recipes import tunable, tunetemplates

# sm_90 per-SM limits
SM_REGS = 65536
SM_SMEM = 228 * 1024
SM_THREADS = 2048
SM_BLOCKS = 32
SM_WARPS = 64

SASS_CLASSES = {
    "wgmma": ("HGMMA", "QGMMA", "IGMMA", "BGMMA"),
    "mma": ("HMMA", "IMMA", "DMMA"),
    "ffma": ("FFMA",),
    "falu": ("FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "FCHK"),
    "mufu": ("MUFU",),
    "ldg": ("LDG",),
    "stg": ("STG",),
    "async_copy": ("LDGSTS", "UTMALDG", "UBLKCP", "UTMASTG", "LDGDEPBAR", "DEPBAR", "SYNCS"),
    "lds": ("LDS", "LDSM"),
    "sts": ("STS", "STSM"),
    "bar": ("BAR", "WARPSYNC", "MEMBAR", "WARPGROUP"),
    "shfl": ("SHFL", "REDUX", "VOTE"),
    "spill": ("LDL", "STL"),
    "int": ("IMAD", "IADD3", "LEA", "LOP3", "ISETP", "SHF", "IABS", "VIADD", "IMNMX", "SEL", "PRMT", "MOV"),
    "control": ("BRA", "EXIT", "BSSY", "BSYNC", "CALL", "RET", "NOP"),
}
FEATURE_KEYS = (["regs", "spill_bytes", "smem_kb", "threads", "blocks_per_sm", "occupancy", "n_instr"]
                + [f"sass_{c}" for c in SASS_CLASSES])
_TORCH_TO_TRITON = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "uint8": "u8"}


class FeatureError(RuntimeError):
    """The tools to compile or read a kernel are missing (triton, or the CUDA binary utilities)."""


def load_module(kernel: tunable.Kernel, directory: str | os.PathLike | None = None):
    """Import the template's module for `kernel` from a file (Triton's @jit reads its source from one)."""
    directory = Path(directory or tempfile.mkdtemp(prefix="kc-tune-"))
    directory.mkdir(parents=True, exist_ok=True)
    name = "kc_tune_" + re.sub(r"\W", "_", kernel.key())
    path = directory / f"{name}.py"
    path.write_text(tunetemplates.kernel_module(kernel))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def meta_operands(kernel: tunable.Kernel, shape: dict):
    """Meta tensors with the shapes and layouts a launch of `kernel` at `shape` receives."""
    import torch

    dt = getattr(torch, kernel.dtype)
    e = dict(device="meta", dtype=dt)
    if kernel.kind == "gemm":
        M, N, K = shape["M"], shape["N"], shape["K"]
        lead = (tunable.batch_of(shape),) if kernel.batched else ()
        a = torch.empty(*lead, K, M, **e).transpose(-1, -2) if kernel.a_trans else torch.empty(*lead, M, K, **e)
        b = torch.empty(*lead, N, K, **e).transpose(-1, -2) if kernel.b_trans else torch.empty(*lead, K, N, **e)
        vecs = tuple(torch.empty(N, **e) for _ in range(kernel.vectors))
        if kernel.split_k > 1:  # the launch writes one float32 partial product per K range
            return (a, b, vecs, torch.empty(kernel.split_k, M, N, device="meta", dtype=torch.float32))
        return (a, b, vecs, torch.empty(*lead, M, N, **e))
    rows, cols = shape["rows"], shape["cols"]
    if kernel.op in tunable.SCAN_OPS:  # x, y, the mask (as the launcher reads a bool one: bytes) or None
        mask = torch.empty(rows, cols, device="meta", dtype=torch.uint8) if kernel.masked else None
        return (torch.empty(rows, cols, **e), torch.empty(rows, cols, **e), mask)
    if kernel.channels:  # x (B, C, positions): one sample of every position
        return (torch.empty(1, cols, rows, **e), torch.empty(1, cols, rows, **e), ())
    per = kernel.groups or cols  # a grouped norm's affine is per channel: one channel per group stands for any
    params = tuple(torch.empty(per, **e) for on in (kernel.weight, kernel.bias) if on)
    return (torch.empty(rows, cols, **e), torch.empty(rows, cols, **e), params)


def _jit_fn(module):
    return getattr(module, "_kc_gemm_kernel", None) or module._kc_row_kernel


def compile_config(module, kernel: tunable.Kernel, shape: dict, config: dict, *, on_gpu: bool | None = None):
    """Compile one configuration as a launch would, without running it (docs/design/tune.md#features);
    returns Triton's CompiledKernel."""
    try:
        import torch
        import triton
    except ImportError as e:
        raise FeatureError(f"compiling Triton kernels needs triton: {e}") from None
    grid, args, meta = module._kc_launch(*meta_operands(kernel, shape), **config)
    fn = _jit_fn(module)
    if on_gpu is None:
        on_gpu = torch.cuda.is_available()
    if on_gpu:
        return fn.warmup(*[a.dtype if isinstance(a, torch.Tensor) else a for a in args], grid=grid, **meta)
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    options = {k: meta[k] for k in ("num_warps", "num_stages")}
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = args[i] if i < len(args) else meta[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            signature[p.name] = "*" + _TORCH_TO_TRITON[str(v.dtype).replace("torch.", "")]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            ty, spec = native_specialize_impl(BaseBackend, v, False, True, True)
            signature[p.name] = ty
            if ty == "constexpr":
                constexprs[(i,)] = v
            elif "D" in spec:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def _tool(name: str) -> str:
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which(name)
    if not found:
        raise FeatureError(f"{name} not found (it ships with triton and the CUDA toolkit)")
    return found


def read_cubin(cubin: bytes) -> dict:
    """Resource usage and SASS instruction counts of a cubin: {regs, stack, local, shared_static, sass: {op: n}}."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, timeout=60).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True, timeout=120).stdout
    res = {k.lower(): int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage)}
    ops: dict[str, int] = {}
    for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass):
        ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return {"regs": res.get("reg", 0), "stack": res.get("stack", 0), "local": res.get("local", 0),
            "shared_static": res.get("shared", 0), "sass": ops}


def occupancy(regs: int, smem_bytes: int, threads: int) -> tuple[int, float]:
    """(resident blocks per SM, fraction of the SM's warp slots) on sm_90."""
    warps = max(1, math.ceil(threads / 32))
    regs_per_warp = math.ceil(max(regs, 1) * 32 / 256) * 256
    by_regs = (SM_REGS // regs_per_warp) // warps
    by_smem = SM_SMEM // (smem_bytes + 1024) if smem_bytes else SM_BLOCKS
    blocks = max(0, min(by_regs, by_smem, SM_THREADS // (warps * 32), SM_BLOCKS))
    return blocks, blocks * warps / SM_WARPS


def features_of(compiled) -> dict:
    """The FEATURE_KEYS of a CompiledKernel."""
    info = read_cubin(compiled.asm["cubin"])
    threads = compiled.metadata.num_warps * 32
    smem = int(compiled.metadata.shared)
    blocks, occ = occupancy(info["regs"], smem, threads)
    total = max(1, sum(info["sass"].values()))
    feats = {"regs": info["regs"], "spill_bytes": info["stack"] + info["local"], "smem_kb": smem / 1024,
             "threads": threads, "blocks_per_sm": blocks, "occupancy": occ, "n_instr": total}
    for cls, names in SASS_CLASSES.items():
        feats[f"sass_{cls}"] = sum(n for op, n in info["sass"].items() if op in names) / total
    return {k: float(feats[k]) for k in FEATURE_KEYS}


def config_features(module, kernel: tunable.Kernel, shape: dict, config: dict, *, on_gpu: bool | None = None) -> dict:
    """{"ok": True, **features} or {"ok": False, "error": ...} for one configuration."""
    try:
        ck = compile_config(module, kernel, shape, config, on_gpu=on_gpu)
        return {"ok": True, **features_of(ck)}
    except FeatureError:
        raise
    except Exception as e:  # noqa: BLE001 - a configuration that does not compile is a result
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


_POOL_MODULES: dict = {}


def _pool_compile(kernel_json: dict, shape: dict, config: dict, workdir: str) -> dict:
    kernel = tunable.Kernel.from_json(kernel_json)
    if kernel.key() not in _POOL_MODULES:
        _POOL_MODULES[kernel.key()] = load_module(kernel, Path(workdir) / f"pool-{os.getpid()}")
    return config_features(_POOL_MODULES[kernel.key()], kernel, shape, config)


def compile_many(kernel: tunable.Kernel, shape: dict, configs: list[dict], *, workers: int | None = None,
                 workdir: str | os.PathLike | None = None) -> list[dict]:
    """`config_features` of every configuration, compiled in a pool of `workers` fresh processes (spawned:
    the caller may hold a CUDA context). On a GPU this also fills Triton's cache for the measurements."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    workers = workers or max(1, min(len(configs), (os.cpu_count() or 2) - 1))
    workdir = str(workdir or tempfile.mkdtemp(prefix="kc-tune-compile-"))
    if workers == 1 or len(configs) <= 1:
        mod = load_module(kernel, workdir)
        return [config_features(mod, kernel, shape, c) for c in configs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(_pool_compile, [kernel.to_json()] * len(configs), [shape] * len(configs), configs,
                             [workdir] * len(configs)))
