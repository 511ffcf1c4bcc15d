"""Does a launch-bound forward's time depend on the CPU its process runs on? One fresh process per (CPU, device),
pinned to that CPU, times a small network's eager forward (many small kernels: its time is the host's dispatch).

Usage:
    python benchmarks/launch_by_cpu.py --device cuda --gpus 0,1 --out launch_by_cpu.json
    python benchmarks/launch_by_cpu.py --device cpu --cpus 0,1 --reps 20          # the CPU path (no GPU)

Per (CPU, device, process): the median forward time of `--reps` calls after warm-up; per device, the spread over
CPUs (max over min of each CPU's median) and, with `--repeat` processes per CPU, within them (the largest max over
min among one CPU's processes): a CPU-bound spread is placement, a within-CPU one is the process itself. Each process
also times as many launches of nothing (`probe_ms`); `probe_r`, the correlation of the two over processes, says
whether such a probe reads a process's draw. The judge's eager references of launch-bound networks moved 1.3-1.9x
between evaluations of one bench run while the host's load stayed low; on two H200s of one host this measured the
spread within one CPU's processes as large as over CPUs (BENCHMARKS.md): the process, not its CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys, time, statistics, torch
cpu, dev, reps, width, depth = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
os.sched_setaffinity(0, {cpu})
torch.set_num_threads(1)
torch.manual_seed(0)
layers = []
for _ in range(depth):
    layers += [torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.BatchNorm2d(width), torch.nn.ReLU()]
net = torch.nn.Sequential(*layers).to(dev).eval()
x = torch.randn(2, width, 16, 16, device=dev)
sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)


def median_ms(fn):
    times = []
    for i in range(reps + 5):  # 5 warm-up calls
        sync(); t0 = time.perf_counter(); fn(); sync(); t1 = time.perf_counter()
        if i >= 5:
            times.append((t1 - t0) * 1e3)
    return statistics.median(times)


one = torch.zeros(1, device=dev)
with torch.no_grad():
    forward = median_ms(lambda: net(x))
    probe = median_ms(lambda: [one.add_(1.0) for _ in range(3 * depth)])  # as many launches, each of nothing
print(forward, os.sched_getcpu() if hasattr(os, "sched_getcpu") else cpu, probe)
"""


def measure(cpu: int, dev: str, reps: int, width: int, depth: int) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(cpu), dev, str(reps), str(width), str(depth)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"cpu": cpu, "device": dev, "error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    ms, ran_on, probe = r.stdout.split()
    return {"cpu": cpu, "device": dev, "median_ms": float(ms), "ran_on": int(ran_on), "probe_ms": float(probe)}


def log_correlation(rows: list[dict]) -> float | None:
    """Pearson's r of ln(forward) on ln(probe) over processes: near 1, a null probe of launches reads a process's
    draw, and a judge could correct for it; near 0, it does not."""
    pts = [(math.log(r["probe_ms"]), math.log(r["median_ms"])) for r in rows if r.get("probe_ms") and r.get("median_ms")]
    if len(pts) < 3:
        return None
    try:
        return statistics.correlation([p for p, _ in pts], [m for _, m in pts])
    except statistics.StatisticsError:  # every probe (or forward) read the same
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--gpus", default="0", help="comma-separated GPU indices (cuda)")
    ap.add_argument("--cpus", default=None, help="comma-separated CPUs (default: every CPU this process may use)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2, help="fresh processes per (CPU, device)")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--depth", type=int, default=20, help="conv-bn-relu blocks: 3 kernels each")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    try:
        cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else allowed
        gpus = [int(g) for g in args.gpus.split(",")]
    except ValueError:
        ap.error("--cpus and --gpus take comma-separated integers")
    if not set(cpus) <= set(allowed):
        ap.error(f"CPUs {sorted(set(cpus) - set(allowed))} are not among this process's ({allowed})")
    devices = [f"cuda:{g}" for g in gpus] if args.device == "cuda" else ["cpu"]
    if args.repeat < 1 or args.reps < 1:
        ap.error("--repeat and --reps must be at least 1")
    rows, meta = [], {"reps": args.reps, "repeat": args.repeat, "width": args.width, "depth": args.depth}
    for _ in range(args.repeat):  # each row printed and written as it comes: a run cut short keeps what it measured
        for d in devices:
            for c in cpus:
                rows.append(measure(c, d, args.reps, args.width, args.depth))
                print(json.dumps(rows[-1]), flush=True)
                if args.out:
                    args.out.write_text(json.dumps({"rows": rows, **meta, "partial": True}))
    spread = {}
    for d in devices:
        per_cpu = {c: [r["median_ms"] for r in rows if r["device"] == d and r["cpu"] == c and "median_ms" in r]
                   for c in cpus}
        ms = [statistics.median(v) for v in per_cpu.values() if v]
        within = max((max(v) / min(v) for v in per_cpu.values() if len(v) > 1), default=None)
        r_probe = log_correlation([r for r in rows if r["device"] == d])
        spread[d] = {"min_ms": min(ms), "max_ms": max(ms), "median_ms": statistics.median(ms),
                     "over_cpus": max(ms) / min(ms), "within_cpu": within, "probe_r": r_probe} if ms else None
        if ms:
            print(f"{d}: {len(ms)} CPUs, median {statistics.median(ms):.3f} ms, {min(ms):.3f}-{max(ms):.3f} "
                  f"(x{max(ms) / min(ms):.2f} over CPUs" + (f", up to x{within:.2f} between one CPU's processes)"
                                                            if within else ")")
                  + (f"; ln forward on ln null-launch probe over processes: r = {r_probe:.2f}" if r_probe is not None
                     else ""))
    for r in rows:
        if "error" in r:
            print(f"{r['device']} cpu {r['cpu']}: {r['error']}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "spread": spread, **meta}, indent=1))
    return 0 if any("median_ms" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
