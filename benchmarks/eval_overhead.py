"""Evaluation overhead on this machine: warm-eval wall time, cold build time (and where it goes), CI width.

Usage: python benchmarks/eval_overhead.py [--device cuda] [--out results.json]

1. wall time of one evaluation of an already-built candidate (worker start included), for a plain
   PyTorch candidate and for an inline-CUDA one whose build is cached;
2. cold build time of a minimal `load_inline` CUDA kernel in an empty cache, split by ninja step
   (from the build directory's .ninja_log) into the host C++ compile (torch/pybind headers),
   the nvcc compile and the link;
3. the speedup CI width reached for a ~1 ms kernel within 3 s of timing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernelcraft.evaluate import evaluate

ELEMENTWISE_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    \"\"\"ReLU over a large tensor (memory-bound, ~{ms} ms on an H100).\"\"\"
    def forward(self, x):
        return torch.relu(x)

N = {n}

def get_inputs():
    return [torch.randn(N)]

def get_init_inputs():
    return []
"""

TORCH_CAND = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0.0)
"""

CUDA_CAND = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = "torch::Tensor relu_fwd(torch::Tensor x);"
cuda = r'''
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
'''
ext = load_inline(name="kc_bench_relu_%(tag)s", cpp_sources=cpp, cuda_sources=cuda, functions=["relu_fwd"],
                  extra_cuda_cflags=["-O3"])

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_fwd(x.contiguous())
"""


def ninja_steps(cache: Path) -> dict:
    """Per-step durations (s) from every .ninja_log under the cache: cuda compile, host compile, link."""
    steps: dict[str, float] = {}
    for log in cache.rglob(".ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 4:
                start, end, target = int(parts[0]), int(parts[1]), parts[3]
                kind = ("nvcc (.cu)" if target.endswith("cuda.o") else "host c++ (main.cpp)"
                        if target.endswith(".o") else "link" if target.endswith(".so") else target)
                steps[kind] = steps.get(kind, 0.0) + (end - start) / 1000
    return steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gpu = args.device.startswith("cuda")
    n = (1 << 27) if gpu else (1 << 20)  # 128M floats: 1 GiB in + 1 GiB out ≈ 0.7 ms at 3 TB/s
    task = ELEMENTWISE_TASK.format(n=n, ms=0.7)
    results: dict = {"device": args.device, "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name(0) if gpu else None}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        # 1. warm evaluation of a plain PyTorch candidate (nothing to build)
        walls = []
        for _ in range(args.repeats):
            v = evaluate(task, TORCH_CAND, device=args.device, cache_dir=cache, remeasure_above=None)
            walls.append(v.wall_s)
        results["warm_eval_torch_wall_s"] = {"median": statistics.median(walls), "all": walls,
                                              "status": v.status, "speedup": v.speedup, "samples": v.timing.samples,
                                              "ci95": v.timing.ci95}
        if gpu:
            # 2. cold build of a minimal load_inline kernel, then warm evaluations of it
            cand = CUDA_CAND % {"tag": f"{int(time.time())}"}
            cold = evaluate(task, cand, device=args.device, cache_dir=cache, remeasure_above=None)
            results["cold_build"] = {"build_s": cold.build_s, "wall_s": cold.wall_s, "status": cold.status,
                                     "message": cold.message[:500], "steps_s": ninja_steps(cache)}
            walls, builds = [], []
            for _ in range(args.repeats):
                v = evaluate(task, cand, device=args.device, cache_dir=cache, remeasure_above=None)
                walls.append(v.wall_s)
                builds.append(v.build_s)
            results["warm_eval_cuda_wall_s"] = {"median": statistics.median(walls), "all": walls,
                                                 "build_s": builds, "status": v.status, "speedup": v.speedup}
        # 3. CI width for a ~1 ms kernel within a 3 s timing budget (candidate vs itself: ~1.0x)
        v = evaluate(task, TORCH_CAND, device=args.device, cache_dir=cache, time_budget_s=3.0,
                     min_rounds=10, remeasure_above=None)
        t = v.timing
        results["ci_width_1ms"] = {"ref_ms": t.ref_ms, "cand_ms": t.cand_ms, "speedup": t.speedup,
                                   "ci95": t.ci95, "half_width_pct": 100 * max(t.ci95[1] / t.speedup - 1,
                                                                                1 - t.ci95[0] / t.speedup),
                                   "samples": t.samples, "converged": t.converged}
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
