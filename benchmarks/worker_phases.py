"""Where one evaluation's judge time goes: each step of `judge.worker.Evaluation` timed in the judge's process.

Usage:
    python benchmarks/worker_phases.py --task level2/elementwise_chain --mode strict --throughput-candidate
    python benchmarks/worker_phases.py --task level1/conv2d                  # the reference as its own candidate
    python benchmarks/worker_phases.py --task tiny/level1/diag_matmul --candidate my.py --device cpu
    python benchmarks/worker_phases.py --task KernelBench/level2/12_Gemm_Multiply_LeakyReLU.py --baseline inductor \
        --side-profile /tmp/sides                                             # ... and each side's commands

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
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path

t0 = time.perf_counter()
import torch  # noqa: E402

IMPORT_TORCH_S = time.perf_counter() - t0
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # as the zygote: nothing before the sides' fork may initialise CUDA
try:  # what the zygote imports before it forks a worker (judge/caller/zygote_process.py): not a cost any evaluation pays
    import torch._dynamo  # noqa: E402, F401
    import triton  # noqa: E402, F401
except ImportError:
    pass

from kernelcraft.judge.process import audit, freeze  # noqa: E402
from kernelcraft.judge.correctness import partial, precision, weights
from kernelcraft.judge.speed import rounds, timing
from kernelcraft.judge.process import side as side_mod, sideproc, worker as W  # noqa: E402
from kernelcraft.judge.correctness import trials
from kernelcraft.judge.correctness.acceptance import Acceptance, Sample
from kernelcraft.judge.speed import treecpu
from kernelcraft.candidate import preloads  # noqa: E402
from kernelcraft.judge.caller.screen import screen  # noqa: E402
from kernelcraft.protocol import Protocol  # noqa: E402
from kernelcraft.task import load_task  # noqa: E402

STEPS = [(trials, "compare_outputs"), (Acceptance, "compare"), (Sample, "take"), (treecpu, "tree_cpu_ns"), (freeze, "freeze"), (freeze, "thaw"),
         (audit.Audit, "problems"), (timing.RoundTripClock, "settle"), (timing.RoundTripClock, "flush"),
         (sideproc.SideProc, "request"), (sideproc.SideProc, "timed"), (precision.Rule, "truth"),
         (precision.Rule, "trial"), (precision.Rule, "_pool"), (partial, "mix"), (weights, "check"),
         (rounds, "time_candidate")] + [(W.Evaluation, n) for n in (
             "_draw", "_write_inputs", "_inputs_intact", "_poison", "_output", "_construct", "run")] + [(trials, "run_trials")]


PEAK = {"used": 0}  # bytes of device memory in use, all processes, the most seen by `watch_memory`


def watch_memory(stop: threading.Event) -> None:
    """Sample the device's memory in use (every process's) every 10 ms until `stop`."""
    while not stop.wait(0.01):
        free, total = torch.cuda.mem_get_info()
        PEAK["used"] = max(PEAK["used"], total - free)


def _nothing() -> None:
    pass


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
                key = _label
                if _label == "SideProc.request":  # by side and command: where a side's time goes
                    msg = a[1] if len(a) > 1 else k.get("msg", {})
                    key = f"{_label}[{a[0].role}.{msg.get('cmd')}]"
                spent[key] += time.perf_counter() - t
                calls[key] += 1
        setattr(owner, name, timed)
    return spent, calls


def profile_sides(folder: Path) -> None:
    """Every side command timed in the side's own process (patched before the sides are forked): the reference's
    under cProfile, the candidate's by wall clock only (its guards reject an interpreter profile hook). Written to
    `folder/<role>-<pid>.prof|.json` after every command but the timed ones (`run` without check, `null`), and
    after every 50th of those."""
    seen = {"n": 0}

    def wrap(name, fn):
        def profiled(self, msg, fds, _fn=fn):
            if getattr(self, "_bench_depth", 0):  # a command run by another (import runs prepare): counted there
                return _fn(self, msg, fds)
            self._bench_depth = 1
            if self.role == "reference":
                prof = getattr(self, "_bench_prof", None)
                if prof is None:
                    prof = self._bench_prof = cProfile.Profile()
                call = lambda: prof.runcall(_fn, self, msg, fds)  # noqa: E731
            else:
                prof, call = None, lambda: _fn(self, msg, fds)  # noqa: E731
            wall = getattr(self, "_bench_wall", None)
            if wall is None:
                wall = self._bench_wall = {}
            t = time.perf_counter()
            try:
                return call()
            finally:
                self._bench_depth = 0
                label = name[4:] + ("+check" if msg.get("check") else "")
                n, s = wall.get(label, (0, 0.0))
                wall[label] = (n + 1, s + time.perf_counter() - t)
                seen["n"] += 1
                timed_cmd = name == "cmd_null" or (name == "cmd_run" and not msg.get("check"))
                if not timed_cmd or seen["n"] % 50 == 0:
                    stem = folder / f"{self.role}-{os.getpid()}"
                    Path(f"{stem}.json").write_text(json.dumps(wall))
                    if prof is not None:
                        prof.dump_stats(f"{stem}.prof")
        return profiled

    for name in dir(side_mod.Side):
        if name.startswith("cmd_"):
            setattr(side_mod.Side, name, wrap(name, getattr(side_mod.Side, name)))


def print_side_profiles(folder: Path, top: int) -> None:
    for path in sorted(folder.glob("*.json")):
        print(f"--- side {path.stem}: seconds per command (calls) ---")
        for label, (n, s) in sorted(json.loads(path.read_text()).items(), key=lambda kv: -kv[1][1]):
            print(f"  {label:24s} {s:8.3f} s  x{n}")
    for path in sorted(folder.glob("*.prof")):
        print(f"--- side {path.stem}, by cumulative ---")
        pstats.Stats(str(path)).sort_stats("cumulative").print_stats(top)


def in_process_job(task, source: str, device: str, protocol: Protocol, prefix: str, mode: str = "open",
                   cache: str | None = None) -> dict:
    """The files and the job message for judging `source` against `task` in this process (as the runner would)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "reference.py").write_text(task.source)
    (work / "candidate.py").write_text(source)
    return dict(task_path=str(work / "reference.py"), candidate_path=str(work / "candidate.py"), device=device,
                protocol=protocol.key(), cache_dir=cache or str(work / "cache"),
                kernel_names=screen(source, mode).kernel_names, lock_scope="timing", needs_build=True, preload=preloads(source),
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
    ap.add_argument("--baseline", help="a bench baseline of the task as the candidate (inductor, cudagraph, ...)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mode", default="open", choices=("open", "strict"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--time-budget", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile the last rep (cProfile, the judge's process) and print its top N functions")
    ap.add_argument("--side-profile", metavar="DIR",
                    help="also profile every side command in the sides' own processes; print the last rep's")
    args = ap.parse_args()

    task = load_task(args.task)
    if args.throughput_candidate:
        sys.path.insert(0, str(Path(__file__).parent))
        from throughput import cuda_candidate
        source = cuda_candidate(0, "phases")
    elif args.baseline:
        from kernelcraft.bench import baselines
        source = baselines.source(task.source, args.baseline)
    elif args.candidate:
        source = Path(args.candidate).read_text()
    else:
        source = task.source.replace("class Model(", "class ModelNew(")
    protocol = Protocol(trials=args.trials, seed=0, mode=args.mode, time_budget_s=args.time_budget).resolved(args.device)
    job = in_process_job(task, source, args.device, protocol, "kc-phases-", args.mode,
                         os.environ.get("KERNELCRAFT_CACHE"))
    cuda = args.device.startswith("cuda")
    spent, calls = instrument(torch.cuda.synchronize if cuda else _nothing)
    r, w = os.pipe()
    print(f"import torch {IMPORT_TORCH_S:.2f} s · {task.name} · {args.device} · {args.mode}")
    threads = torch.get_num_threads()

    def one_rep(rep: int) -> None:
        spent.clear()
        calls.clear()
        PEAK["used"] = 0
        torch.set_num_threads(threads)  # the sides get the default, as a real judge's (forked before it sets 1)
        side_dir = None
        if args.side_profile and rep == args.reps - 1:
            side_dir = Path(args.side_profile)
            side_dir.mkdir(parents=True, exist_ok=True)
            for old in [*side_dir.glob("*.json"), *side_dir.glob("*.prof")]:
                old.unlink()
            profile_sides(side_dir)
        sides = fork_sides(w)
        stop = threading.Event()
        if cuda:  # started after the fork: it initialises CUDA here
            threading.Thread(target=watch_memory, args=(stop,), daemon=True).start()
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
        finally:
            gate = ev.hand_over_lock()  # as `jobs.serve` does at a job's end: the next rep's timing needs the device
            if gate is not None:
                gate.close()
        stop.set()
        end_sides(sides)
        os.read(r, 1 << 20)
        print(f"rep {rep}: {outcome}")
        if cuda:
            print(f"  device memory in use (all processes), peak (10 ms samples): {PEAK['used'] / 2**30:.1f} GiB")
        for label, s in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"  {label:36s} {s:8.3f} s  x{calls[label]}")
        if prof:
            for key in ("tottime", "cumulative"):
                print(f"--- cProfile of rep {rep}, by {key} ---")
                pstats.Stats(prof).sort_stats(key).print_stats(args.profile)
        if side_dir is not None:
            print_side_profiles(side_dir, args.profile or 25)

    for rep in range(args.reps):
        if not cuda:
            one_rep(rep)
            continue
        # each rep in a child: the judge initialises CUDA, and sides forked after that could not use it
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                one_rep(rep)
            finally:
                sys.stdout.flush()
                os._exit(0)
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
