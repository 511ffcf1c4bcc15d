"""Where one evaluation's judge time goes: each step of `judge.worker.Evaluation` timed in the judge's process.

Usage:
    python benchmarks/worker_phases.py --task level2/elementwise_chain --mode strict --throughput-candidate
    python benchmarks/worker_phases.py --task level1/conv2d                  # the reference as its own candidate
    python benchmarks/worker_phases.py --task tiny/level1/diag_matmul --candidate my.py --device cpu

Runs the judge's `Evaluation.run()` in this process, which forks the two sides as the judge process does (no
sandbox: a diagnostic, not a verdict), `--reps` times, and prints the seconds spent in each judge step (input
draws, side requests, timed round trips, freezes, idle probes, comparisons, audits) with a device sync after
each, plus the `import torch` time; `--profile N` adds cProfile's top N functions of the last rep (the
judge's process only: time in a side shows as waiting on its wire). Every rep
after the first shows the steady state; the first shows one-time costs a fresh worker pays (CUDA
context, profiler start, lazy module loading), which is what every real evaluation pays.
The per-phase split of real evaluations is in each verdict's `phases_s`.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

t0 = time.perf_counter()
import torch  # noqa: E402

IMPORT_TORCH_S = time.perf_counter() - t0
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # as the zygote: nothing before the sides' fork may initialise CUDA
try:  # what the zygote imports before it forks a worker (judge/zygote.py): not a cost any evaluation pays
    import torch._dynamo  # noqa: E402, F401
    import triton  # noqa: E402, F401
except ImportError:
    pass

from kernelcraft.judge import isolation, partial, precision, rounds, timing, tripwires, weights  # noqa: E402
from kernelcraft.judge import sideproc, worker as W  # noqa: E402
from kernelcraft.judge.screen import screen  # noqa: E402
from kernelcraft.protocol import Protocol  # noqa: E402
from kernelcraft.task import load_task  # noqa: E402

STEPS = [(W, "compare_outputs"), (tripwires.SpotChecker, "agrees"), (isolation, "freeze"), (isolation, "thaw"),
         (isolation.Audit, "problems"), (timing.RoundTripClock, "settle"), (timing.RoundTripClock, "flush"),
         (sideproc.SideProc, "request"), (sideproc.SideProc, "timed"), (precision.Rule, "truth"),
         (precision.Rule, "trial"), (precision.Rule, "_pool"), (partial, "mix"), (weights, "check"),
         (rounds, "time_candidate")] + [(W.Evaluation, n) for n in (
             "_draw", "_write_inputs", "_inputs_intact", "_poison", "_output", "_construct", "_check", "_time", "run")]


def instrument(sync) -> tuple[dict, collections.Counter]:
    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    for owner, name in STEPS:
        fn, label = getattr(owner, name), f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"

        def timed(*a, _fn=fn, _label=label, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                sync()
                spent[_label] += time.perf_counter() - t
                calls[_label] += 1
        setattr(owner, name, timed)
    return spent, calls


def in_process_job(task, source: str, device: str, protocol: Protocol, prefix: str, mode: str = "open",
                   cache: str | None = None) -> dict:
    """The files and the job message for judging `source` against `task` in this process (as the runner would)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "reference.py").write_text(task.source)
    (work / "candidate.py").write_text(source)
    return dict(task_path=str(work / "reference.py"), candidate_path=str(work / "candidate.py"), device=device,
                protocol=protocol.key(), cache_dir=cache or str(work / "cache"),
                kernel_names=screen(source, mode).kernel_names, lock_scope="timing", needs_build=True, preload=[],
                lock_path=str(work / "device.lock"))


def fork_sides(w: int) -> dict:
    """The reference's and the candidate's side processes, forked from this one (the channel's `w` closed in both)."""
    sides = {"reference": sideproc.SideProc.fork("reference", [os.getpid()], [w])}
    sides["candidate"] = sideproc.SideProc.fork("candidate", [os.getpid(), sides["reference"].pid],
                                                [w, sides["reference"].end.sock.fileno()])
    return sides


def end_sides(sides: dict) -> None:
    for side in sides.values():
        try:
            os.killpg(side.pid, 9)
            os.waitpid(side.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="level2/elementwise_chain")
    ap.add_argument("--candidate", help="candidate file (default: the reference itself as ModelNew)")
    ap.add_argument("--throughput-candidate", action="store_true", help="the CUDA candidate of throughput.py")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mode", default="open", choices=("open", "strict"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the last rep (cProfile, the judge's process) and print its top N functions")
    args = ap.parse_args()

    task = load_task(args.task)
    if args.throughput_candidate:
        sys.path.insert(0, str(Path(__file__).parent))
        from throughput import cuda_candidate
        source = cuda_candidate(0, "phases")
    elif args.candidate:
        source = Path(args.candidate).read_text()
    else:
        source = task.source.replace("class Model(", "class ModelNew(")
    protocol = Protocol(trials=args.trials, seed=0, mode=args.mode, time_budget_s=args.time_budget).resolved(args.device)
    job = in_process_job(task, source, args.device, protocol, "kc-phases-", args.mode,
                         os.environ.get("KERNELCRAFT_CACHE"))
    cuda = args.device.startswith("cuda")
    spent, calls = instrument(torch.cuda.synchronize if cuda else (lambda: None))
    r, w = os.pipe()
    print(f"import torch {IMPORT_TORCH_S:.2f} s · {task.name} · {args.device} · {args.mode}")
    threads = torch.get_num_threads()
    for rep in range(args.reps):
        spent.clear()
        calls.clear()
        torch.set_num_threads(threads)  # the sides get the default, as a real judge's (forked before it sets 1)
        sides = fork_sides(w)
        # the judge's own work single-threaded, as in `jobs.serve`: an OpenMP pool run here would be inherited by
        # the next rep's sides, which then hung in their first parallel op on the CPU
        torch.set_num_threads(1)
        ev = W.Evaluation(job, W.Channel(os.dup(w), "phases"), sides, {})
        prof = cProfile.Profile() if args.profile and rep == args.reps - 1 else None
        try:
            res = prof.runcall(ev.run) if prof else ev.run()
            outcome = f"correct, {res['timing']['speedup']:.3f}x"
        except BaseException as e:  # noqa: BLE001 - a diagnostic: report and go on
            outcome = f"{type(e).__name__}: {e}"
        end_sides(sides)
        os.read(r, 1 << 20)
        print(f"rep {rep}: {outcome}")
        for label, s in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"  {label:36s} {s:8.3f} s  x{calls[label]}")
        if prof:
            for key in ("tottime", "cumulative"):
                print(f"--- cProfile of rep {rep}, by {key} ---")
                pstats.Stats(prof).sort_stats(key).print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
