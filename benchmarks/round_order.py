"""Order effects inside the judge's timed rounds: is the first call of a round slower, and is one side slower?

Usage:
    python benchmarks/round_order.py tiny/level1/diag_matmul            # the reference's own code, CPU
    python benchmarks/round_order.py level1/diag_matmul --device cuda --reps 3
    python benchmarks/round_order.py tiny/level3/small_cnn --candidate cand.py --precision calibrated

Runs the judge's `Evaluation.run()` in this process, as `worker_phases.py` does (the sides forked here, the
runner's OpenMP environment and the zygote's imports; a diagnostic, not a verdict), with one candidate process,
and logs every timed round's sequence. Each round is the reference and the candidate in random order, then the
null pair. It prints, per rep:
- the speedup the judge reported;
- both sides' raw round-trip ms (overhead not subtracted) and their ratio, split by which side went first;
- the median first and second call of a round, and the null.
With the reference as its own candidate, every split should read 1. A first call slower than the second is an
order effect: random order cancels it on average, but the per-round ratios become bimodal. A side that is slower in
both positions is a difference between the two processes. BENCHMARKS.md, 2026-11-25 · e4f5d55 ("Order effects inside
a round"), has what this found on the 2-core host.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # as the zygote: nothing before the sides' fork may initialise CUDA
os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # as the runner gives every process of an evaluation
os.environ.setdefault("KMP_BLOCKTIME", "0")

from worker_phases import end_sides, fork_sides, in_process_job  # noqa: E402  (torch and the zygote's imports)

from kernelcraft.judge.speed import rounds, timing  # noqa: E402
from kernelcraft.judge.process import worker as W
from kernelcraft.protocol import Protocol  # noqa: E402
from kernelcraft.task import load_task  # noqa: E402


def logged_measure(log: list):
    """`timing.measure` with every timed call of every round recorded as (round, [(side, ms), ...])."""
    real = timing.measure

    def measure(time_ref, time_cand, time_null, next_round, check_round, **kw):
        state = {"round": None, "seq": []}

        def wrap(fn, tag):
            def timed():
                got = fn()
                state["seq"].append((tag, got[0] if isinstance(got, tuple) else got))  # a null pair: the reference's
                return got
            return timed

        def round_start(i):
            if state["seq"]:
                log.append((state["round"], list(state["seq"])))
            state["round"], state["seq"] = i, []
            next_round(i)

        out = real(wrap(time_ref, "r"), wrap(time_cand, "c"), wrap(time_null, "n"), round_start, check_round, **kw)
        if state["seq"]:
            log.append((state["round"], list(state["seq"])))
        return out
    return measure


def one_rep(task, source: str, device: str, precision: str, budget: float | None) -> tuple[float, list]:
    log: list = []
    rounds.timing.measure = logged_measure(log)
    protocol = Protocol(seed=0, processes=1, precision=precision, time_budget_s=budget).resolved(device)
    job = in_process_job(task, source, device, protocol, "kc-order-")
    r, w = os.pipe()
    sides = fork_sides(w)
    ev = W.Evaluation(job, W.Channel(os.dup(w), "order"), sides, {})
    try:
        res = ev.run()
    finally:
        gate = ev.hand_over_lock()  # as `jobs.serve` does at a job's end: the next rep's timing needs the device
        if gate is not None:
            gate.close()
        end_sides(sides)
        os.close(r)
        os.close(w)
    return res["timing"]["speedup"], [(i, seq) for i, seq in log if i is not None and i >= 0 and len(seq) >= 2]


def report(speedup: float, rows: list) -> None:
    med = lambda v: statistics.median(v) if v else float("nan")  # noqa: E731
    print(f"  judge's speedup {speedup:.3f}x over {len(rows)} rounds")
    for name, first in (("reference first", "r"), ("candidate first", "c")):
        group = [dict(seq[:2]) for _, seq in rows if seq[0][0] == first]
        r_, c_ = [g["r"] for g in group], [g["c"] for g in group]
        print(f"  {name:16s} n={len(group):4d}  reference {med(r_):.4f} ms  candidate {med(c_):.4f} ms  "
              f"ratio {med([a / b for a, b in zip(r_, c_)]):.3f}")
    nulls = [ms for _, seq in rows for tag, ms in seq[2:] if tag == "n"]
    print(f"  first call of a round {med([seq[0][1] for _, seq in rows]):.4f} ms, second "
          f"{med([seq[1][1] for _, seq in rows]):.4f} ms, null {med(nulls):.4f} ms (raw round trips)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task")
    ap.add_argument("--candidate", help="candidate file (default: the reference itself as ModelNew)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fixed", choices=("fixed", "calibrated"))
    ap.add_argument("--time-budget", type=float, default=None)
    ap.add_argument("--reps", type=int, default=3, help="evaluations, each in a fresh process")
    ap.add_argument("--quiet-header", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    task = load_task(args.task)
    source = (Path(args.candidate).read_text() if args.candidate
              else task.source.replace("class Model(", "class ModelNew("))
    if args.reps > 1:  # each rep in a fresh process: a parent whose OpenMP pool ran (rep 0's judge work) forks
        failed = 0
        for rep in range(args.reps):  # sides that hang in their first parallel op
            print(f"rep {rep}:", flush=True)
            failed += subprocess.run([sys.executable, __file__, *sys.argv[1:], "--reps", "1", "--quiet-header"],
                                     check=False).returncode != 0
        return 1 if failed else 0  # a rep that failed says so in the exit status, not only in its missing lines
    speedup, rows = one_rep(task, source, args.device, args.precision, args.time_budget)
    if not args.quiet_header:
        print("rep 0:")
    report(speedup, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
