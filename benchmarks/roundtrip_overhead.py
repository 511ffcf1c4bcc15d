"""The judge's round-trip overhead and what it does to speedups, for kernels of a known length (GPU).

Usage (on a GPU box):
    python benchmarks/roundtrip_overhead.py --out rt.json          # 10 us, 100 us, 1 ms; 3 s timing budget

For each length L it writes a task whose forward is one `torch.cuda._sleep` kernel of length L (calibrated
here with CUDA events) plus a tiny add, and two candidates: the same code (true speedup 1.00) and a
half-length sleep (true speedup ~2 for the kernel part). Each is judged once with `evaluate()` (3 s
budget, no re-measure) and the record's numbers are printed: the round trip's overhead (`overhead_ms`, an
empty request timed by the judge, subtracted from both sides), the raw and corrected reference time, the
speedup with its 95% CI, rounds and whether the CI reached ±1%.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        torch.cuda._sleep({cycles})
        return x + 1


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
'''

CAND = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        torch.cuda._sleep({cycles})
        return x + 1
'''


def cycles_per_us() -> float:
    import torch

    torch.cuda.init()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 2_000_000
    torch.cuda._sleep(n)
    vals = []
    for _ in range(5):
        s.record()
        torch.cuda._sleep(n)
        e.record()
        torch.cuda.synchronize()
        vals.append(s.elapsed_time(e) * 1000)
    return n / sorted(vals)[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths-us", default="10,100,1000")
    ap.add_argument("--budget", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from kernelcraft.evaluate import evaluate

    per_us = cycles_per_us()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for us in [float(x) for x in args.lengths_us.split(",")]:
            c = int(us * per_us)
            task = tmp / f"sleep_{int(us)}us.py"
            task.write_text(TASK.format(cycles=c))
            for label, cc in (("same code", c), ("half sleep", c // 2)):
                cand = tmp / f"cand_{int(us)}_{cc}.py"
                cand.write_text(CAND.format(cycles=cc))
                t0 = time.perf_counter()
                v = evaluate(task, cand, device="cuda", time_budget_s=args.budget, remeasure_above=None)
                t = v.timing
                row = dict(kernel_us=us, candidate=label, status=v.status, wall_s=round(time.perf_counter() - t0, 1))
                if t is not None:
                    row.update(overhead_ms=t.overhead_ms, host_ref_ms=t.host_ref_ms, ref_ms=t.ref_ms,
                               cand_ms=t.cand_ms, speedup=t.speedup, ci95=list(t.ci95), samples=t.samples,
                               converged=t.converged, hidden_work_ms=t.hidden_work_ms)
                else:
                    row["message"] = v.message[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| kernel | candidate | overhead ms | raw ref ms | ref ms | speedup | 95% CI | rounds | ±1% reached |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "speedup" in r:
            print(f"| {r['kernel_us']:g} µs | {r['candidate']} | {r['overhead_ms']:.4f} | {r['host_ref_ms']:.4f} | "
                  f"{r['ref_ms']:.4f} | {r['speedup']:.3f} | {r['ci95'][0]:.3f}–{r['ci95'][1]:.3f} | {r['samples']} | "
                  f"{'yes' if r['converged'] else 'no'} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"cycles_per_us": per_us, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
