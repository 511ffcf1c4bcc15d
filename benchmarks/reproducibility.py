"""Do the judge's confidence intervals reproduce? The same candidate evaluated N times, each in its own
`kernelcraft eval` invocation (a fresh caller, zygote and workers), optionally while another process keeps
one core busy.

Usage:
    python benchmarks/reproducibility.py --device cpu --runs 10 --load 1 --out repro.json
    python benchmarks/reproducibility.py --device cuda --runs 10

What it reports, per candidate: each run's speedup and 95% CI, and the issue-16 criterion — the share of runs
2..N whose point estimate falls inside run 1's interval (goal: at least 90%) — plus the share over every
ordered pair of runs (less dependent on which run came first), the spread of the point estimates (max/min) and
the median CI half-width. Candidates (both correct by construction):
- `same`: the reference's own code (true speedup 1),
- `broadcast`: `diag(A) @ B` rewritten as a broadcast multiply (a large true speedup),
on the task `tiny/level1/diag_matmul` (CPU) or `level1/diag_matmul` (GPU).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _burn(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def candidates(task_source: str) -> dict[str, str]:
    same = task_source.replace("class Model(", "class ModelNew(")
    broadcast = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return A.unsqueeze(1) * B
'''
    return {"same": same, "broadcast": broadcast}


def run_once(task: str, cand_path: Path, device: str, budget: float, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "kernelcraft.cli", "eval", task, str(cand_path), "--device", device, "--json",
           "--time-budget", str(budget), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])})
    if r.returncode != 0:
        return {"error": r.stderr[-500:]}
    v = json.loads(r.stdout.strip().splitlines()[-1])
    t = v.get("timing") or {}
    return {"status": v["status"], "speedup": v.get("speedup"), "ci95": t.get("ci95"), "samples": t.get("samples"),
            "spread": t.get("between_spread"), "note": t.get("note")}


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("speedup") and r.get("ci95")]
    if len(ok) < 2:
        return {"usable_runs": len(ok)}
    first = ok[0]
    inside_first = [first["ci95"][0] <= r["speedup"] <= first["ci95"][1] for r in ok[1:]]
    pairs = [a["ci95"][0] <= b["speedup"] <= a["ci95"][1] for a in ok for b in ok if a is not b]
    speeds = [r["speedup"] for r in ok]
    half = [(r["ci95"][1] - r["ci95"][0]) / 2 / r["speedup"] for r in ok]
    return {"usable_runs": len(ok), "inside_first_ci": sum(inside_first) / len(inside_first),
            "inside_pairwise": sum(pairs) / len(pairs), "median_speedup": statistics.median(speeds),
            "max_over_min": max(speeds) / min(speeds), "median_ci_half_width": statistics.median(half)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the runs (0: none)")
    ap.add_argument("--time-budget", type=float, default=1.0)
    ap.add_argument("--only", default=None, help="comma-separated candidate names")
    ap.add_argument("--extra", default="", help="extra eval options, space-separated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kernelcraft.task import load_task

    task = ("tiny/" if args.device == "cpu" else "") + "level1/diag_matmul"
    cands = candidates(load_task(task).source)
    if args.only:
        cands = {k: v for k, v in cands.items() if k in args.only.split(",")}
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"kc-repro-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    stop = mp.Event()
    burners = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    results: dict = {"task": task, "device": args.device, "load": args.load, "time_budget": args.time_budget,
                     "extra": args.extra, "candidates": {}}
    try:
        for name, src in cands.items():
            path = work / f"{name}.py"
            path.write_text(src)
            runs = []
            for i in range(args.runs):
                t0 = time.perf_counter()
                r = run_once(task, path, args.device, args.time_budget, args.extra.split())
                r["wall_s"] = round(time.perf_counter() - t0, 2)
                runs.append(r)
                ci = r.get("ci95") or [None, None]
                print(f"{name} run {i + 1}: {r.get('status')} {r.get('speedup')} CI {ci} "
                      f"(spread {r.get('spread')}) {r['wall_s']} s {r.get('error', '')}", flush=True)
            results["candidates"][name] = {"runs": runs, "summary": summarise(runs)}
            print(name, json.dumps(results["candidates"][name]["summary"]), flush=True)
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
