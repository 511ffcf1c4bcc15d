"""The baselines timed outside the judge: eager, `torch.compile` and CUDA-graph forms of each task in one plain process.

Usage:
    python benchmarks/compile_gap.py TASK_DIR [--baselines inductor,cudagraph] [--rounds 30] [--limit N]
        [--match REGEX] [--bench-out DIR] [--json OUT.json] [--markdown]

Why: the judge times each side in its own process (round trips, outputs copied, L2 flushed, the other side frozen).
If `torch.compile` reads slower than eager there, this says whether the compiled program is slower on its own:
each program is built here from the same rendered source the bench judges (`bench.baselines.source`), loads the
reference's weights, runs on the same inputs, and is timed with CUDA events around one call, the L2 flushed
before every call, programs in a random order each round (the stopping rule: a fixed number of rounds after
three warm-up calls each). Trusted code only (the task and our own renders): no sandbox. `--bench-out` puts the
judge's baseline speedups from a `kernelcraft bench --out` directory beside these.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from kernelcraft.bench import baselines as bl


def _module(source: str, name: str, tmp: Path):
    path = tmp / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _to(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


def programs(task_path: Path, names: list[str], tmp: Path):
    """(inputs, {name: callable}) for one task: the reference (`eager`) and each baseline, same weights."""
    src = task_path.read_text()
    ref_mod = _module(src, "kc_task", tmp)
    torch.manual_seed(0)
    init = [_to(x, "cuda") for x in ref_mod.get_init_inputs()]
    ref = ref_mod.Model(*init).cuda()
    progs = {"eager": ref}
    for n in names:
        mod = _module(bl.source(src, n), f"kc_{re.sub(r'[^a-z0-9]', '_', n)}", tmp)
        m = mod.ModelNew(*init).cuda()
        m.load_state_dict(ref.state_dict())
        progs[n] = m
    torch.manual_seed(1)
    inputs = [_to(x, "cuda") for x in ref_mod.get_inputs()]
    return inputs, progs


def benchmark(progs: dict, inputs: list, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call of each program: 3 warm-up calls each, then `rounds` rounds in a random order,
    each call alone on a flushed L2, timed by CUDA events."""
    flush = torch.empty(512 * 2**20 // 4, dtype=torch.float32, device="cuda")
    times: dict[str, list[float]] = {n: [] for n in progs}
    with torch.no_grad():
        for m in progs.values():
            for _ in range(3):
                m(*inputs)
        torch.cuda.synchronize()
        order = list(progs)
        for _ in range(rounds):
            random.shuffle(order)
            for n in order:
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                progs[n](*inputs)
                end.record()
                torch.cuda.synchronize()
                times[n].append(start.elapsed_time(end))
    return times


def judged(bench_out: Path | None) -> dict[tuple[str, str], float]:
    """(task stem, baseline) -> the judge's speedup, from a bench output directory's baselines.jsonl."""
    if bench_out is None or not (bench_out / "baselines.jsonl").exists():
        return {}
    out = {}
    for line in (bench_out / "baselines.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("status") == "correct" and r.get("speedup"):
            out[(r["task"], r["baseline"])] = r["speedup"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", type=Path)
    ap.add_argument("--baselines", default="inductor,cudagraph")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--match", help="only task files whose name matches this regular expression")
    ap.add_argument("--bench-out", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compile_gap: needs a CUDA device")
    names = [n for n in a.baselines.split(",") if n]
    bad = [n for n in names if n not in bl.RECIPES or n == "eager"]
    if bad:
        sys.exit(f"compile_gap: unknown baseline(s) {bad}; choose from {[n for n in bl.RECIPES if n != 'eager']}")
    paths = sorted(p for p in a.tasks.glob("*.py") if not a.match or re.search(a.match, p.name))[:a.limit]
    if not paths:
        sys.exit(f"compile_gap: no task files in {a.tasks}")
    seen, rows = judged(a.bench_out), []
    for p in paths:
        row = {"task": p.stem}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                inputs, progs = programs(p, names, Path(tmp))
                t = benchmark(progs, inputs, a.rounds)
            med = {n: statistics.median(v) for n, v in t.items()}
            row["ms"] = med
            row["spread_ms"] = {n: [min(v), max(v)] for n, v in t.items()}
            row["speedup"] = {n: med["eager"] / med[n] for n in names}
            row["judged"] = {n: seen.get((p.stem, n)) for n in names}
        except Exception as e:  # noqa: BLE001 - one task's failure (out of memory, a compile error) is its row
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            progs = inputs = None
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                      "rounds": a.rounds, "rows": rows}, indent=1))
    if a.markdown:
        head = " | ".join(f"{n}: here · judged" for n in names)
        print(f"\n| task | eager ms | {head} |\n|---|---|" + "---|" * len(names))
        for r in rows:
            if "error" in r:
                print(f"| {r['task']} | {r['error']} |" + " |" * len(names))
                continue
            cells = " | ".join(f"{r['speedup'][n]:.2f} · " + (f"{r['judged'][n]:.2f}" if r["judged"][n] else "—")
                               for n in names)
            print(f"| {r['task']} | {r['ms']['eager']:.3f} | {cells} |")


if __name__ == "__main__":
    main()
