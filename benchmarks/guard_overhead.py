"""Cost of the runtime guards: evaluation wall time with and without them, on built-in tasks.

Usage: python benchmarks/guard_overhead.py [--device cuda] [--tier gpu] [--repeats 3] [--out FILE]

The candidate for each task is the reference itself (renamed ModelNew), so both variants do identical
work; "off" disables the runtime layer (output snapshots, poisoning, thread census, process-state
verification, spot checks of timed outputs) and the static screen. Timing runs a fixed number of
rounds (`--rounds`), so the difference is the guards' cost, not a different convergence.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import torch

from kernelcraft.evaluate import evaluate
from kernelcraft.task import load_task

TASKS = ["level1/matmul_square", "level1/softmax", "level2/gemm_bias_relu", "level2/conv2d_relu_bias",
         "level3/mlp"]


def as_candidate(source: str) -> str:
    return re.sub(r"\bclass Model\(", "class ModelNew(", source)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tier", default="gpu" if torch.cuda.is_available() else "tiny")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for name in TASKS:
        task = load_task(f"{args.tier}/{name}")
        cand = as_candidate(task.source)
        walls = {"on": [], "off": []}
        for _ in range(args.repeats):
            for variant in ("on", "off"):  # alternate, so drift hits both alike
                guarded = variant == "on"
                v = evaluate(task, cand, device=args.device, screen=guarded, runtime_guards=guarded,
                             remeasure_above=None, min_rounds=args.rounds, target_ci=0.0, time_budget_s=0.0)
                assert v.status == "correct", (name, variant, v.status, v.message)
                walls[variant].append(v.wall_s)
        on, off = statistics.median(walls["on"]), statistics.median(walls["off"])
        rows.append({"task": task.name, "wall_on_s": on, "wall_off_s": off, "overhead_pct": 100 * (on / off - 1),
                     "all_on": walls["on"], "all_off": walls["off"]})
        print(f"{task.name:32s} guards on {on:6.2f} s  off {off:6.2f} s  overhead {rows[-1]['overhead_pct']:+5.1f}%",
              flush=True)
    total_on = sum(r["wall_on_s"] for r in rows)
    total_off = sum(r["wall_off_s"] for r in rows)
    summary = {"device": args.device, "torch": torch.__version__, "rounds": args.rounds, "tasks": rows,
               "total_overhead_pct": 100 * (total_on / total_off - 1)}
    print(f"total: guards on {total_on:.1f} s, off {total_off:.1f} s, overhead {summary['total_overhead_pct']:+.1f}%")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
