"""Do the judge's confidence intervals reproduce? The same candidate evaluated N times, each in its own
`kernelcraft eval` invocation (a fresh caller, zygote and workers), optionally while another process keeps
one core busy.

Usage:
    python benchmarks/reproducibility.py --device cpu --runs 10 --load 1 --out repro.json
    python benchmarks/reproducibility.py --device cuda --runs 10
    python3 benchmarks/reproducibility.py --device cuda --set calibration --gpus 0,1,2,3 --out cal.json

What it reports, per candidate: each run's speedup, 95% CI and timing record (medians, overhead, within-run
interval), and the reproducibility criterion — the share of runs 2..N whose point estimate falls inside run 1's
interval (goal: at least 90%) — plus the share over every ordered pair of runs (less dependent on which run
came first), the spread of the point estimates (max/min), the median CI half-width and the between-run
standard deviation of the log speedup. Candidates (each correct by construction), in sets:
- `diag` (the default): the reference's own code (`diag_matmul/same`, true speedup 1) and `diag(A) @ B`
  rewritten as a broadcast multiply (`diag_matmul/broadcast`, a large true speedup, the candidate's time far
  below the judge's round trip);
- `calibration`: those two plus the reference's own ReLU (both sides near the round trip) and a fused
  scaled add (a moderate speedup) — the runs `reproduce.BETWEEN_RUN` was calibrated from;
- `validation`: other tasks and candidates, not used for the calibration (the same softmax; an elementwise
  chain in place; a row-scaled diag matmul by `torch.mul`).
Tasks are the built-in suite's, `tiny/` on a CPU. `--gpus` runs each candidate's invocations on its own GPU,
the candidates at once (a multi-GPU host); runs of one candidate stay sequential.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BROADCAST = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return A.unsqueeze(1) * B
'''
ROW_MUL = BROADCAST.replace("A.unsqueeze(1) * B", "torch.mul(B, A[:, None])")
FUSED_ADD = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, a, b):
        return torch.add(b, a, alpha=self.alpha)
'''
CHAIN_INPLACE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.tanh(x * 2.0 + 1.0)
        return y.mul_(0.5).clamp_(-0.45, 0.45)
'''
SAME = None  # the reference's own code, renamed
SETS: dict[str, dict[str, tuple[str, str | None]]] = {
    "diag": {"diag_matmul/same": ("level1/diag_matmul", SAME),
             "diag_matmul/broadcast": ("level1/diag_matmul", BROADCAST)},
    "calibration": {"diag_matmul/same": ("level1/diag_matmul", SAME),
                    "diag_matmul/broadcast": ("level1/diag_matmul", BROADCAST),
                    "relu/same": ("level1/relu", SAME),
                    "scale_add/fused": ("level1/scale_add", FUSED_ADD)},
    "validation": {"softmax/same": ("level1/softmax", SAME),
                   "elementwise_chain/inplace": ("level2/elementwise_chain", CHAIN_INPLACE),
                   "diag_matmul/row_mul": ("level1/diag_matmul", ROW_MUL)},
}


def _burn(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


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
    keep = ("ci95", "within_ci95", "between_run_sd", "samples", "converged", "ref_ms", "cand_ms", "overhead_ms",
            "processes", "process_speedups", "cand_overhead_ms", "note")
    return {"status": v["status"], "speedup": v.get("speedup"), **{k: t.get(k) for k in keep}}


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
            "max_over_min": max(speeds) / min(speeds), "median_ci_half_width": statistics.median(half),
            "between_run_sd_log": statistics.stdev(math.log(s) for s in speeds)}


def run_candidate(name: str, task: str, path: Path, device: str, args, save) -> dict:
    runs: list[dict] = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        r = run_once(task, path, device, args.time_budget, args.extra.split())
        r["wall_s"] = round(time.perf_counter() - t0, 2)
        runs.append(r)
        save(name, {"task": task, "device": device, "runs": runs, "summary": summarise(runs)})
        ci = r.get("ci95") or [None, None]
        print(f"{name} run {i + 1} ({device}): {r.get('status')} {r.get('speedup')} CI {ci} "
              f"{r['wall_s']} s {r.get('error', '')}", flush=True)
    out = {"task": task, "device": device, "runs": runs, "summary": summarise(runs)}
    print(name, json.dumps(out["summary"]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the runs (0: none)")
    ap.add_argument("--time-budget", type=float, default=1.0)
    ap.add_argument("--set", default="diag", choices=sorted(SETS))
    ap.add_argument("--only", default=None, help="comma-separated candidate names of the set")
    ap.add_argument("--gpus", default=None, help="comma-separated GPU indices: one candidate per GPU at once")
    ap.add_argument("--extra", default="", help="extra eval options, space-separated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kernelcraft.task import load_task

    cands = SETS[args.set]
    if args.only:
        cands = {k: v for k, v in cands.items() if k in args.only.split(",")}
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"kc-repro-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    jobs = []
    for name, (task, src) in cands.items():
        task = ("tiny/" if args.device == "cpu" else "") + task
        if src is None:
            src = load_task(task).source.replace("class Model(", "class ModelNew(")
        path = work / f"{name.replace('/', '_')}.py"
        path.write_text(src)
        jobs.append((name, task, path))
    gpus = args.gpus.split(",") if args.gpus else None
    stop = mp.Event()
    burners = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    results: dict = {"set": args.set, "device": args.device, "load": args.load, "time_budget": args.time_budget,
                     "extra": args.extra, "gpus": args.gpus, "candidates": {}}
    lock = threading.Lock()

    def save(name: str, entry: dict) -> None:  # after every run: a run cut short keeps what it measured
        with lock:
            results["candidates"][name] = entry
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))

    try:
        if gpus:
            queue = list(jobs)
            with cf.ThreadPoolExecutor(len(gpus)) as ex:
                def lane(gpu: str) -> None:
                    while True:
                        try:
                            name, task, path = queue.pop(0)
                        except IndexError:
                            return
                        run_candidate(name, task, path, f"cuda:{gpu}", args, save)
                list(ex.map(lane, gpus))
        else:
            for name, task, path in jobs:
                run_candidate(name, task, path, args.device, args, save)
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)


if __name__ == "__main__":
    main()
