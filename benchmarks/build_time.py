"""Cold build time of typical `load_inline` CUDA candidates, per stage, with and without the fast path.

Usage: python3 benchmarks/build_time.py [--markdown] [--candidates elementwise,matmul,...] [--repeats 1]
                                        [--out results.json]

Each build runs in a fresh process with an empty cache directory, through kernelcraft's BuildCache (the
path the worker takes). Modes: `plain` sets KERNELCRAFT_FASTBUILD=0; `fast` leaves the fast path on (the
split of kernelcraft/builder/cusplit.py first, see kernelcraft/builder/fastbuild.py); `types` is the fast path without the
split (KERNELCRAFT_SPLIT=0); a `+pch` suffix adds the precompiled headers for main.cpp (kernelcraft/builder/pch.py:
the full and the light one, made once, outside the build's clock, in a shared temp directory and reused),
else KERNELCRAFT_PCH=0. Every mode is compared with the first (same output on a GPU, same trimmed error). Stages come from the build directory's .ninja_log (nvcc on the .cu, host c++
on main.cpp, link; the two compiles run in parallel, so wall ≈ max of them + link) and nvcc's own phase
table (`-time`, through NVCC_APPEND_FLAGS): cudafe++ (EDG, host side), cicc (EDG + NVVM, device side),
gcc (host compile of cudafe++'s output), the rest (preprocessing, ptxas, fatbinary).

With a CUDA build of torch the module is also imported and called once; the outputs of the two variants
are compared. With a CPU-only torch (no GPU here) CUDA_HOME is pointed at nvcc's toolkit and the link
gets empty stand-ins for libc10_cuda / libtorch_cuda (and the include path a stand-in for the generated
c10/cuda/impl/cuda_cmake_macros.h the CPU wheel lacks): compile and link are measured; the module is
imported where its symbols resolve (status `ok`), else reported as `built (no import)`; nothing is run.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kernelcraft, also when run as a script

CANDIDATES: dict[str, dict] = {
    "elementwise": {
        "cpp": "torch::Tensor relu_fwd(torch::Tensor x);",
        "cuda": r"""
#include <torch/extension.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
torch::Tensor relu_fwd(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 132L * 16);
    relu_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
""",
        "functions": ["relu_fwd"], "cuda_cflags": ["-O3"],
        "call": "ext.relu_fwd(torch.randn(1 << 20, device='cuda'))"},
    "matmul": {
        "cpp": "torch::Tensor matmul_tiled(torch::Tensor A, torch::Tensor B);",
        "cuda": r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define TILE 32

__global__ void matmul_tiled_kernel(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int a_col = t * TILE + threadIdx.x;
        int b_row = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && a_col < K) ? A[row * K + a_col] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (b_row < K && col < N) ? B[b_row * N + col] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

torch::Tensor matmul_tiled(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(A.dtype() == torch::kFloat32 && B.dtype() == torch::kFloat32, "float32 only");
    TORCH_CHECK(A.size(1) == B.size(0), "shape mismatch");
    auto a = A.contiguous();
    auto b = B.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(1);
    auto C = torch::zeros({M, N}, a.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_tiled_kernel<<<grid, block>>>(a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err));
    return C;
}
""",
        "functions": ["matmul_tiled"], "cuda_cflags": ["-O3", "--use_fast_math"],
        "call": "ext.matmul_tiled(torch.randn(256, 192, device='cuda'), torch.randn(192, 320, device='cuda'))"},
    "reduction": {
        "cpp": "torch::Tensor row_sum(torch::Tensor x);",
        "cuda": r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

template <typename scalar_t, int BLOCK>
__global__ void row_sum_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int cols) {
    __shared__ float buf[BLOCK];
    const scalar_t* row = x + (long)blockIdx.x * cols;
    float acc = 0.f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) acc += static_cast<float>(row[c]);
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = BLOCK / 2; s > 32; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x < 32) {
        float v = buf[threadIdx.x] + buf[threadIdx.x + 32];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
        if (threadIdx.x == 0) out[blockIdx.x] = static_cast<scalar_t>(v);
    }
}

torch::Tensor row_sum(torch::Tensor x) {
    TORCH_CHECK(x.dim() == 2, "expected a 2-D tensor");
    const c10::cuda::CUDAGuard guard(x.device());
    auto xc = x.contiguous();
    auto out = torch::empty({xc.size(0)}, xc.options());
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, xc.scalar_type(), "row_sum", [&] {
        row_sum_kernel<scalar_t, 256><<<xc.size(0), 256, 0, stream>>>(
            xc.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), (int)xc.size(1));
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
""",
        "functions": ["row_sum"], "cuda_cflags": ["-O3"],
        "call": "ext.row_sum(torch.randn(512, 1000, device='cuda'))"},
    # the same ReLU with the torch wrapper in cpp_sources: the .cu names nothing of torch (fast path "bare")
    "elementwise_split": {
        "cpp": r"""
#include <c10/cuda/CUDAStream.h>
void relu_launch(const float* x, float* y, long n, cudaStream_t stream);
torch::Tensor relu_fwd(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 CUDA tensor expected");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    relu_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), c10::cuda::getCurrentCUDAStream());
    return y;
}
""",
        "cuda": r"""
#include <algorithm>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long stride = (long)gridDim.x * blockDim.x;
    for (; i < n; i += stride) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
}
void relu_launch(const float* x, float* y, long n, cudaStream_t stream) {
    int threads = 256;
    int blocks = (int)std::min<long>((n + threads - 1) / threads, 132L * 16);
    if (n > 0) relu_kernel<<<blocks, threads, 0, stream>>>(x, y, n);
}
""",
        "functions": ["relu_fwd"], "cuda_cflags": ["-O3"],
        "call": "ext.relu_fwd(torch.randn(1 << 20, device='cuda'))"},
    # a compile error in the kernel: what the fast path costs a broken candidate (fast try + plain retry)
    "broken": {
        "cpp": "torch::Tensor scale(torch::Tensor x, double a);",
        "cuda": r"""
#include <torch/extension.h>
__global__ void scale_kernel(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + undefined_offset;
}
torch::Tensor scale(torch::Tensor x, double a) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), (float)a, n);
    return y;
}
""",
        "functions": ["scale"], "cuda_cflags": ["-O3"], "call": None},
}
DEFAULT = ["elementwise", "matmul", "reduction", "elementwise_split", "broken"]


def _stub_cuda_libs(where: Path) -> list[str]:
    """CPU-only torch: empty libc10_cuda / libtorch_cuda so the link step runs (import will not)."""
    where.mkdir(parents=True, exist_ok=True)
    src = where / "empty.c"
    src.write_text("void kc_build_time_stub(void) {}\n")
    for lib in ("c10_cuda", "torch_cuda"):
        subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(where / f"lib{lib}.so")], check=True)
    return [f"-L{where}"]


def one(cand: str, mode: str, work: Path) -> dict:
    """Child process: one cold build of `cand` in `work` (`mode` already in the environment)."""
    import torch
    import torch.utils.cpp_extension as cpp_ext

    from kernelcraft.builder.cache import BuildCache
    from kernelcraft.devices import arch_for

    # a built-in candidate, or `@spec.json` (cpp, cuda, functions, cuda_cflags, cflags; see split_coverage.py)
    spec = CANDIDATES[cand] if not cand.startswith("@") else json.loads(Path(cand[1:]).read_text())
    name = f"kc_bt_{cand}" if not cand.startswith("@") else spec.get("name", "kc_bt_spec")
    ldflags = includes = None
    has_cuda = torch.version.cuda is not None
    if not has_cuda:
        if shutil.which("nvcc") is None:
            return {"status": "no nvcc"}
        dry = subprocess.run(["nvcc", "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True,
                             check=False)
        top = [ln.split("TOP=", 1)[1] for ln in (dry.stdout + dry.stderr).splitlines() if "TOP=" in ln]
        cpp_ext.CUDA_HOME = os.environ.get("CUDA_HOME") or (str(Path(top[0]).resolve()) if top else "/usr/local/cuda")
        ldflags = _stub_cuda_libs(work / "stubs")
        # the CPU wheel ships c10/cuda headers but not their generated config header (at a fixed path: the
        # include path is part of the build flags, hence of the precompiled header's key)
        top_shim = Path(tempfile.gettempdir()) / "kc-bt-shim"
        shim = top_shim / "c10" / "cuda" / "impl"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes = [str(top_shim)]
    gpu = torch.cuda.is_available()
    arch = arch_for(torch.cuda.get_device_capability() if gpu else None) or "9.0a"
    cache = BuildCache(work / "ext", arch)
    cache.install()
    pch_s = None
    if mode.endswith("+pch"):  # the PCH is made once, outside the build's clock, and shared by the runs
        from kernelcraft.builder import pch

        shared = Path(os.environ["KC_BT_PCH_DIR"])
        shared.mkdir(parents=True, exist_ok=True)
        (work / "pch").symlink_to(shared, target_is_directory=True)
        t_pch = time.perf_counter()
        if any(pch.make(work / "pch", [], includes, True, header=h) is None for h in pch.HEADERS):
            return {"status": "no pch (see KC_BT_PCH_DIR/*/failed)"}
        pch_s = time.perf_counter() - t_pch
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the PCH's compile is not the build's
    t0 = time.perf_counter()
    status, ext = "ok", None
    try:
        ext = cpp_ext.load_inline(name=name, cpp_sources=spec["cpp"], cuda_sources=spec["cuda"],
                                  functions=spec["functions"], extra_cuda_cflags=spec["cuda_cflags"],
                                  extra_cflags=spec.get("cflags"),
                                  extra_ldflags=ldflags, extra_include_paths=includes)
    except Exception as e:  # noqa: BLE001  CPU-only torch: the import of a linked module may fail
        built = any((work / "ext").glob(f"*/{name}*.so"))
        status = "built (no import)" if built and not has_cuda else "compile_error"
        # build directories differ (temporary root, key): name them alike so errors can be compared
        msg = re.sub(r"/ext/[0-9a-f]{24}/", "/ext/KEY/", str(e).replace(str(work), "WORK"))
        (work / "error.txt").write_text(msg)
    wall = time.perf_counter() - t0
    if ext is not None and gpu and spec.get("call"):
        try:
            torch.manual_seed(0)
            torch.save(eval(spec["call"], {"ext": ext, "torch": torch}).cpu(), work / "out.pt")
        except Exception as e:  # noqa: BLE001
            status = f"run failed: {str(e)[:200]}"
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the compilers: robust to other load on the host
    ru_cpu = ru.ru_utime + ru.ru_stime - (ru0.ru_utime + ru0.ru_stime)
    dirs = [d for d in (work / "ext").iterdir() if d.is_dir()]
    variant = next(((d / ".variant").read_text().strip() for d in dirs if (d / ".variant").exists()), None)
    if pch_s is not None:
        variant = f"{variant or 'plain'}+pch"
    return {"status": status, "wall_s": wall, "cpu_s": ru_cpu, "variant": variant or "plain",
            "pch_make_s": pch_s,
            "steps": ninja_steps(work),
            "nvcc": nvcc_phases(work / "nvcc_time.csv")}


def ninja_steps(root: Path) -> dict:
    steps: dict[str, float] = {}
    for log in root.rglob(".ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 4:
                start, end, target = int(parts[0]), int(parts[1]), parts[3]
                kind = "nvcc" if target.endswith(".cuda.o") else "c++" if target.endswith(".o") else \
                    "link" if target.endswith(".so") else target
                steps[kind] = steps.get(kind, 0.0) + (end - start) / 1000
    return steps


def nvcc_phases(path: Path) -> dict:
    """nvcc -time table, summed by phase over every nvcc run (a fallback build runs nvcc twice)."""
    phases: dict[str, float] = {}
    if not path.exists():
        return phases
    for row in csv.reader(path.read_text().splitlines()[1:]):
        if len(row) >= 8:
            name = row[1].strip()
            name = "gcc" if name == "gcc (compiling)" else name if name in ("cudafe++", "cicc") else "other"
            phases[name] = phases.get(name, 0.0) + float(row[6]) / 1000
    return phases


PCH_DIR = Path(tempfile.gettempdir()) / "kc-bt-pch"  # shared by the fast+pch runs (~0.8 GB, kept)


def run_child(cand: str, mode: str) -> dict:
    tag = re.sub(r"[^\w.+-]", "_", cand)  # `@/path/spec.json` too
    with tempfile.TemporaryDirectory(prefix=f"kc-bt-{tag}-{mode}-") as tmp:
        work = Path(tmp)
        base = mode.split("+")[0]
        no_templates = os.environ.get("KERNELCRAFT_SPLIT", "").strip().lower() == "notemplates"  # kept if asked for
        env = {**os.environ, "KERNELCRAFT_FASTBUILD": "0" if base == "plain" else "1",
               "KERNELCRAFT_SPLIT": "0" if base == "types" else "notemplates" if no_templates else "1",
               "KERNELCRAFT_PCH": "1" if mode.endswith("+pch") else "0", "KC_BT_PCH_DIR": str(PCH_DIR),
               "NVCC_APPEND_FLAGS": f"{os.environ.get('NVCC_APPEND_FLAGS', '')} -time {work / 'nvcc_time.csv'}",
               "TORCH_EXTENSIONS_DIR": str(work / "torch_extensions"),
               "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--one", cand, mode, str(work)], env=env,
                           capture_output=True, text=True, check=False)
        if p.returncode != 0:
            return {"status": f"child failed ({p.returncode})", "stderr": p.stderr[-2000:],
                    "process_s": time.perf_counter() - t0}
        res = json.loads(p.stdout.strip().splitlines()[-1])
        res["process_s"] = time.perf_counter() - t0
        if (work / "out.pt").exists():
            import torch
            res["out_tensor"] = torch.load(work / "out.pt")
        if (work / "error.txt").exists():
            res["error"] = (work / "error.txt").read_text()
        return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=3, metavar=("CAND", "MODE", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--candidates", default=",".join(DEFAULT))
    ap.add_argument("--modes", default="plain,fast")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.one:
        cand, mode, work = args.one
        print(json.dumps(one(cand, mode, Path(work))))
        return 0

    import torch

    from kernelcraft.builder.cache import trim_compiler_output

    rows, results = [], []
    for cand in args.candidates.split(","):
        per_mode: dict[str, dict] = {}
        for mode in args.modes.split(","):
            for rep in range(args.repeats):
                r = run_child(cand, mode)
                out = r.pop("out_tensor", None)
                per_mode.setdefault(mode, r)
                if out is not None:
                    per_mode[mode]["_out"] = out
                results.append({"candidate": cand, "mode": mode, "repeat": rep,
                                **{k: v for k, v in r.items() if not k.startswith("_")}})
                rows.append((cand, mode, r))
                print(f"{cand:12s} {mode:6s} {r.get('status')} wall {r.get('wall_s', 0):.1f}s "
                      f"steps {r.get('steps')} nvcc {r.get('nvcc')}", file=sys.stderr, flush=True)
        modes = list(per_mode)
        for other in modes[1:]:  # each mode against the first: same output, same trimmed error
            a, b = per_mode[modes[0]].get("_out"), per_mode[other].get("_out")
            same = None if a is None or b is None else bool(torch.equal(a, b))
            ea, eb = per_mode[modes[0]].get("error"), per_mode[other].get("error")
            same_err = None if ea is None or eb is None else trim_compiler_output(ea) == trim_compiler_output(eb)
            results.append({"candidate": cand, "modes": [modes[0], other], "outputs_identical": same,
                            "errors_identical": same_err})
            print(f"{cand}: {modes[0]} vs {other}: outputs identical {same}, trimmed errors identical {same_err}",
                  file=sys.stderr)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "cpus": os.cpu_count(), "nvcc": subprocess.run(["nvcc", "--version"], capture_output=True,
                                                          text=True, check=False).stdout.strip().splitlines()[-1:]}
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "results": results}, indent=2, default=str))
    if args.markdown:
        print(f"\n{env}\n")
        print("| candidate | path | status | wall | compiler CPU | nvcc .cu | host c++ main.cpp | link "
              "| cudafe++ | cicc | gcc (in nvcc) | other nvcc |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for cand, mode, r in rows:
            st, nv = r.get("steps", {}), r.get("nvcc", {})
            f = lambda v: "–" if v is None else f"{v:.1f} s"
            path = mode if mode == "plain" else f"{mode.split('+')[0]} ({r.get('variant')})"
            print(f"| {cand} | {path} | {r.get('status')} | {f(r.get('wall_s'))} | {f(r.get('cpu_s'))} "
                  f"| {f(st.get('nvcc'))} "
                  f"| {f(st.get('c++'))} | {f(st.get('link'))} | {f(nv.get('cudafe++'))} | {f(nv.get('cicc'))} "
                  f"| {f(nv.get('gcc'))} | {f(nv.get('other'))} |")
    else:
        print(json.dumps({"env": env, "results": results}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
