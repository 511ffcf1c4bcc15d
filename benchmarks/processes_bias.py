"""Does the number of candidate processes (`Protocol.processes`) move a verdict's speedup? Interleaved processes
make intervals reproduce; this measures what they cost in bias.

Usage:
    python benchmarks/processes_bias.py tiny/level1/diag_matmul                      # the reference's own code
    python benchmarks/processes_bias.py tiny/level3/small_cnn --candidate cand.py --processes 1,2,3 --reps 2
    python benchmarks/processes_bias.py level1/diag_matmul --device cuda --processes 1,2

For each repetition and each process count (in that order, so a drifting host moves them alike), one
`kernelcraft.evaluate` (no re-measure) prints the speedup, its CI, each process's median, the reference's and the
candidate's overhead-corrected ms and the round-trip overhead. A candidate identical to the reference should read
1.0 whatever the count; a count that moves it is a bias of the judge, not a property of the candidate.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from kernelcraft.evaluate import evaluate
from kernelcraft.task import load_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task")
    ap.add_argument("--candidate", help="candidate file (default: the reference itself as ModelNew)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--processes", default="1,2,3", help="comma-separated process counts")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--time-budget", type=float, default=None)
    ap.add_argument("--out", default=None, help="write every row as JSON lines here")
    args = ap.parse_args()
    source = (Path(args.candidate).read_text() if args.candidate
              else load_task(args.task).source.replace("class Model(", "class ModelNew("))
    counts = [int(x) for x in args.processes.split(",")]
    rows = []
    for rep in range(args.reps):
        for k in counts:
            v = evaluate(args.task, source, device=args.device, processes=k, remeasure_above=None,
                         time_budget_s=args.time_budget)
            t = v.timing
            row = {"rep": rep, "processes": k, "status": v.status, "speedup": v.speedup,
                   "ci95": list(t.ci95) if t else None, "process_speedups": t.process_speedups if t else None,
                   "ref_ms": t.ref_ms if t else None, "cand_ms": t.cand_ms if t else None,
                   "overhead_ms": t.overhead_ms if t else None, "rounds": t.samples if t else None}
            rows.append(row)
            if t is None:
                print(f"rep {rep} processes {k}: {v.status} {v.reasons} {v.message[:200]}", flush=True)
                continue
            print(f"rep {rep} processes {k}: {v.speedup:.3f}x [{t.ci95[0]:.3f}-{t.ci95[1]:.3f}] per process "
                  f"{t.process_speedups} ref {t.ref_ms:.4f} ms cand {t.cand_ms:.4f} ms overhead {t.overhead_ms:.3f} ms "
                  f"{t.samples} rounds", flush=True)
    for k in counts:
        got = [r["speedup"] for r in rows if r["processes"] == k and r["speedup"]]
        if got:
            print(f"processes {k}: median {statistics.median(got):.3f}x over {len(got)} ({min(got):.3f}-{max(got):.3f})")
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
