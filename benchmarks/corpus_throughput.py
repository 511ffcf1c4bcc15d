"""Throughput of the judge on real LLM-written candidates: CUDA-L1's published kernels for KernelBench tasks.

Usage:
    python benchmarks/corpus_throughput.py pack --out .corpus/corpus.jsonl            # 24 candidates + inductor
    python benchmarks/corpus_throughput.py pack --gpu-file h100 --n 48 --seed 1 --baselines none --out c.jsonl
    python benchmarks/corpus_throughput.py run --pack .corpus/corpus.jsonl --out corpus.json --markdown
    python benchmarks/corpus_throughput.py run --pack tiny.jsonl --device cpu   # smoke test (tiny sizes only)

`pack` reads `cuda_l1/<gpu-file>.jsonl` of the datasets (`$KERNELCRAFT_DATASETS` or --datasets): each non-empty
code field of a row whose task has a file in `kernelbench/level<L>/` is a candidate (`custom`: the CUDA rewrite;
`cuda_graph`, `cudnn`: PyTorch rewrites). `--n` of them are sampled per level in proportion to the pool (one per
level at least) with `--seed`, sorted by (level, task_id, kind), plus the `--baselines` (torch.compile) candidates
of each sampled task. The reference is the row's own ref_code. The pack (JSON lines) is all `run` needs.

`run`, for each scope of `--scopes` and each phase of `--phases`, judges every pack item through one fresh
`kernelcraft.serve.pool.Pool` (all submitted at once; wall clock from first submission to last verdict). `cold`
uses a fresh cache directory, `warm` the same one again (builds and Inductor caches hot). Scope `timing`: the
device lock covers timed rounds and a first call's tuning only; `first_call`: also an autotuning candidate's whole
first call, its compile included; `device`: each evaluation holds the device from construction to the end of
timing. A scope may name its slots per GPU (`--scopes device:4,timing:8`; else `--per-gpu`, else the pool's).
Results go to `--out` after every block; a re-run with the same `--out` skips the blocks already there,
and SIGINT keeps the finished ones. Per block: candidates per GPU-minute, device seconds per verdict (the phases
on the device, by `kernelcraft.bench.timeuse`'s rule) median and p90, the seconds it had the device alone (phase
`time`) median and p90 and their share of the GPUs' wall time, each phase's median, statuses.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import as_completed
from dataclasses import replace
from pathlib import Path

import torch

from kernelcraft.bench import baselines as bl
from kernelcraft.bench.sources import NO_CODE, BenchError, resolve
from kernelcraft.bench.timeuse import _clocks
from kernelcraft.evaluate import LOCK_SCOPES as SCOPES
from kernelcraft.judge.speed import reproduce
from kernelcraft.serve.pool import Pool

CODE_FIELDS = {"custom_code": "custom", "cuda_graph_code": "cuda_graph", "cudnn_code": "cudnn"}
PHASES = ("cold", "warm")
_TASK_FILE_RE = re.compile(r"^(\d+)_.+\.py$")


# -- pack ------------------------------------------------------------------------------------------------
def task_files(kernelbench: Path) -> set[tuple[int, int]]:
    """(level, task_id) of every KernelBench file `level<L>/<ID>_<Name>.py`."""
    return {(int(d.name[5:]), int(m.group(1))) for d in kernelbench.glob("level[0-9]*") for p in d.glob("*.py")
            if (m := _TASK_FILE_RE.match(p.name))}


def candidate_pool(rows: list[dict], known: set[tuple[int, int]]) -> list[dict]:
    """One entry per non-empty code field of each row with a KernelBench task file (first row of a task wins)."""
    pool, seen = [], set()
    for row in rows:
        key = (int(row["level_id"]), int(row["task_id"]))
        if key not in known or key in seen:
            continue
        seen.add(key)
        for field, kind in CODE_FIELDS.items():
            code = row.get(field)
            if isinstance(code, str) and code.strip() and code.strip().lower() not in NO_CODE:
                pool.append(pack_row(key[0], key[1], kind, row["ref_code"], row[field]))
    return pool


def pack_row(level: int, task_id: int, kind: str, ref_code: str, code: str) -> dict:
    return {"item": f"{level}_{task_id}_{kind}", "level": level, "task_id": task_id, "kind": kind,
            "ref_code": ref_code, "code": code}


def level_quotas(counts: dict[int, int], n: int) -> dict[int, int]:
    """`n` split over levels in proportion to `counts` (largest remainder), 1 <= quota <= count."""
    total = sum(counts.values())
    n = min(n, total)
    if n < len(counts):  # one per level at least
        raise ValueError(f"--n {n} is fewer than the {len(counts)} levels in the pool (one per level at least)")
    exact = {lv: n * c / total for lv, c in counts.items()}
    quota = {lv: min(counts[lv], max(1, int(x))) for lv, x in exact.items()}
    while sum(quota.values()) > n:  # the minimum of one pushed it over: take from the largest
        lv = max((lv for lv in quota if quota[lv] > 1), key=lambda lv: (quota[lv] - exact[lv], quota[lv]))
        quota[lv] -= 1
    while sum(quota.values()) < n:
        lv = max((lv for lv in quota if quota[lv] < counts[lv]), key=lambda lv: (exact[lv] - quota[lv], -lv))
        quota[lv] += 1
    return quota


def sample(pool: list[dict], n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    by_level: dict[int, list[dict]] = {}
    for c in sorted(pool, key=sort_key):
        by_level.setdefault(c["level"], []).append(c)
    quota = level_quotas({lv: len(cs) for lv, cs in by_level.items()}, n)
    return sorted((c for lv in sorted(by_level) for c in rng.sample(by_level[lv], quota[lv])), key=sort_key)


def sort_key(c: dict) -> tuple:
    return c["level"], c["task_id"], c["kind"]


def with_baselines(chosen: list[dict], names: list[str]) -> list[dict]:
    tasks = {(c["level"], c["task_id"]): c["ref_code"] for c in chosen}
    extra = [pack_row(lv, tid, name, ref, bl.source(ref, name)) for (lv, tid), ref in tasks.items() for name in names]
    return sorted(chosen + extra, key=sort_key)


def baseline_names(spec: str) -> list[str]:
    names, _ = bl.parse(spec, "cuda")
    if "eager" in names:
        raise ValueError("eager is the reference itself, not a candidate: leave it out of --baselines")
    return names


def pack(args) -> int:
    root = Path(args.datasets)
    gpu_file = root / "cuda_l1" / f"{args.gpu_file}.jsonl"
    if not gpu_file.is_file() or not (root / "kernelbench").is_dir():
        raise SystemExit(f"pack: need {gpu_file} and {root / 'kernelbench'}/ (--datasets or $KERNELCRAFT_DATASETS)")
    rows = [json.loads(line) for line in gpu_file.read_text().splitlines() if line.strip()]
    pool = candidate_pool(rows, task_files(root / "kernelbench"))
    if not pool:
        raise SystemExit(f"pack: no row of {gpu_file} has code for a task in {root / 'kernelbench'}")
    try:
        items = with_baselines(sample(pool, args.n, args.seed), baseline_names(args.baselines))
    except ValueError as e:
        raise SystemExit(f"pack: {e}") from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in items))
    kinds = Counter(r["kind"] for r in items)
    print(f"{out}: {len(items)} items from a pool of {len(pool)} ({dict(sorted(kinds.items()))})")
    return 0


# -- run -------------------------------------------------------------------------------------------------
def read_pack(path: Path) -> list[tuple[dict, object]]:
    """(row, Task) per pack line; the Task is made by `kernelcraft bench`'s pairs reader from the row's ref_code
    (named by the row's item)."""
    if not path.is_file():
        raise SystemExit(f"run: no pack file {path} (make one with `pack`)")
    try:
        items = resolve(str(path)).items
    except BenchError as e:
        raise SystemExit(f"run: {e}") from None
    bad = next((item.error for item in items if item.error), None)
    rows = [] if bad else [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bad = bad or next((f"{path.name}: row {i + 1} needs item, kind, code and level" for i, row in enumerate(rows)
                       if not all(isinstance(row.get(k), str) for k in ("item", "kind", "code"))
                       or not isinstance(row.get("level"), int)), None)
    if bad:
        raise SystemExit(f"run: bad pack row: {bad}")
    return [(row, replace(item.task, name=row["item"], level=row["level"])) for row, item in zip(rows, items)]


def run_block(pairs, scope: str, device: str, gpus: int, per_gpu: int | None, cache_dir: str,
              time_budget: float | None) -> dict:
    """One block: every pair through a fresh pool with the device lock's `scope` and `per_gpu` slots."""
    devices = [f"cuda:{i}" for i in range(gpus)] if device == "cuda" else ["cpu"]
    knobs = {"time_budget_s": time_budget} if time_budget else {}
    verdicts = [None] * len(pairs)
    with Pool(devices=devices, per_device=per_gpu or None, cache_dir=cache_dir, lock_scope=scope, **knobs) as pool:
        t0 = time.monotonic()
        futures = {pool.submit(task, row["code"], **baseline_timeout(row["kind"], pool)): i
                   for i, (row, task) in enumerate(pairs)}
        for f in as_completed(futures):
            verdicts[futures[f]] = verdict_record(pairs[futures[f]][0]["item"], f.result())
        wall = time.monotonic() - t0
        slots = len(pool.devices)
    return summarize(verdicts, wall, gpus if device == "cuda" else 1, slots)


def baseline_timeout(kind: str, pool: Pool) -> dict:
    """torch.compile baselines compile inside the run clock: they get `bench`'s longer limit."""
    if kind not in bl.MIN_TIMEOUT_S:
        return {}
    default = pool.protocol.resolved(pool.devices[0]).timeout_s
    return {"timeout_s": max(default, bl.MIN_TIMEOUT_S[kind])}


# what `between_run_pairs.py` recomputes an interval from, and the host's load beside it
TIMING_FIELDS = reproduce.INPUT_FIELDS + ("host_busy_cores",)


def verdict_record(item: str, v) -> dict:
    t = v.timing.model_dump() if v.timing else None
    return {"item": item, "status": v.status, "reasons": list(v.reasons), "speedup": v.speedup,
            "ci95": list(v.timing.ci95) if v.timing else None, "phases_s": dict(v.phases_s), "wall_s": v.wall_s,
            "device": v.device, "timing": {k: t.get(k) for k in TIMING_FIELDS} if t else None}


def pct(values: list[float], q: int) -> float | None:
    """The q-th percentile (inclusive method); the value itself for one; None for none."""
    if not values:
        return None
    return round(values[0] if len(values) == 1 else statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)


def busy_share(verdicts: list[dict], wall: float, gpus: int) -> float | None:
    """Sum of the timed rounds (the phase with a GPU alone) over the GPUs' wall time."""
    return round(sum(v["phases_s"].get("time", 0.0) for v in verdicts) / (wall * gpus), 3) if wall > 0 else None


def makespan(verdicts: list[dict], wall: float, slots: int) -> dict:
    """How far the block's wall is from what its verdicts allow: `packed_s`, their walls summed over the slots (every
    slot busy to the end), and `longest_s`, the slowest one (no schedule ends before it). A wall well above both is
    the schedule's tail; walls that grow with the GPUs at the same slots per GPU are the host's contention."""
    walls = [v["wall_s"] or 0.0 for v in verdicts]
    packed, longest = sum(walls) / slots, max(walls, default=0.0)
    bound = max(packed, longest)
    return {"slots": slots, "packed_s": round(packed, 2), "longest_s": round(longest, 2),
            "wall_over_bound": round(wall / bound, 3) if bound > 0 else None}


def summarize(verdicts: list[dict], wall: float, gpus: int, slots: int | None = None) -> dict:
    on_device = [_clocks(v["phases_s"])[2] for v in verdicts]
    alone = [v["phases_s"].get("time", 0.0) for v in verdicts]  # the timed rounds: the device to itself
    names = sorted({p for v in verdicts for p in v["phases_s"]})
    return {"n": len(verdicts), "gpus": gpus, "wall_s": round(wall, 2),
            "per_gpu_min": round(len(verdicts) / (wall / 60 * gpus), 2) if wall > 0 else None,
            "device_s": {"median": round(statistics.median(on_device), 3), "p90": pct(on_device, 90)},
            "alone_s": {"median": round(statistics.median(alone), 3), "p90": pct(alone, 90),
                        "busy_share": busy_share(verdicts, wall, gpus)},
            "phase_medians": {p: round(statistics.median(v["phases_s"][p] for v in verdicts if p in v["phases_s"]), 3)
                              for p in names},
            "makespan": makespan(verdicts, wall, slots) if slots else None,
            "statuses": dict(Counter(v["status"] for v in verdicts)), "verdicts": verdicts}


def load_results(out: Path, header: dict) -> dict:
    if not out.is_file():
        return {**header, "cache_dirs": {}, "blocks": []}
    results = json.loads(out.read_text())
    for key in ("pack_sha256", "device", "gpus", "per_gpu", "time_budget_s"):
        if results.get(key) != header[key]:
            raise SystemExit(f"run: {out} holds results for another {key} ({results.get(key)}): use another --out")
    return results


def save(out: Path, results: dict) -> None:
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out)


def scope_cache(results: dict, scope: str, phase: str) -> tuple[str, str]:
    """(cache dir, what it held): a fresh one for `cold`; the scope's cold one for `warm` while it exists."""
    kept = results["cache_dirs"].get(scope)
    if phase == "warm" and kept and Path(kept).is_dir():
        return kept, "warm"
    shutil.rmtree(kept or "", ignore_errors=True)  # an interrupted block's
    results["cache_dirs"][scope] = tempfile.mkdtemp(prefix=f"kc-corpus-{scope}-")
    return results["cache_dirs"][scope], "cold" if phase == "cold" else "cold (the cold block's cache is gone)"


def run(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    scopes, phases = split(args.scopes, SCOPES, "--scopes"), split(args.phases, PHASES, "--phases")
    pack_path = Path(args.pack)
    pairs = read_pack(pack_path)
    header = {"pack": str(pack_path), "pack_sha256": hashlib.sha256(pack_path.read_bytes()).hexdigest(),
              "device": device, "gpus": args.gpus, "per_gpu": args.per_gpu, "time_budget_s": args.time_budget}
    out = Path(args.out)
    results = load_results(out, header)
    done = {(b["scope"], b["phase"]) for b in results["blocks"]}
    try:
        for scope in scopes:
            lock_scope, per_gpu = scope.split(":")[0], int(scope.split(":")[1]) if ":" in scope else args.per_gpu
            for phase in phases:
                if (scope, phase) in done:
                    print(f"{scope}/{phase}: already in {out}, skipped")
                    continue
                cache_dir, cache = scope_cache(results, scope, phase)
                block = run_block(pairs, lock_scope, device, args.gpus, per_gpu, cache_dir, args.time_budget)
                results["blocks"].append({"scope": scope, "phase": phase, "cache": cache, "per_gpu": per_gpu,
                                          **block})
                done.add((scope, phase))
                save(out, results)
                print(f"{scope}/{phase}: {block['n']} in {block['wall_s']} s, {block['per_gpu_min']}/GPU-min, "
                      f"{block['statuses']}")
            if all((scope, p) in done for p in phases):  # its cache has served every phase
                shutil.rmtree(results["cache_dirs"].pop(scope, ""), ignore_errors=True)
                save(out, results)
    except KeyboardInterrupt:
        save(out, results)
        print(f"interrupted: {len(results['blocks'])} finished block(s) are in {out}", file=sys.stderr)
        return 130
    if args.markdown:
        print(markdown(results))
    return 0


def split(spec: str, allowed: tuple, flag: str) -> list[str]:
    """A comma list of `allowed` names; a scope may name its slots per GPU (`timing:8`)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in names if s.split(":")[0] not in allowed
           or ":" in s and (flag != "--scopes" or not s.split(":", 1)[1].isdigit() or int(s.split(":", 1)[1]) < 1)]
    if bad or not names:
        raise SystemExit(f"run: {flag} takes a comma list of {', '.join(allowed)}, not {spec!r}")
    return names


# -- markdown --------------------------------------------------------------------------------------------
def alone(block: dict) -> str:
    a = block.get("alone_s")
    return f"{a['median']:.2f} · {a['p90']:.2f} · {a['busy_share']}" if a else "-"


def markdown(results: dict) -> str:
    lines = ["| scope | phase | n | wall s | cand/GPU-min | device s/verdict median · p90 | alone s median · p90 · "
             "GPU share | phase medians (s) | statuses |", "|---|---|--:|--:|--:|--:|--:|---|---|"]
    for b in results["blocks"]:
        phases = ", ".join(f"{k} {v:g}" for k, v in b["phase_medians"].items())
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(b["statuses"].items()))
        lines.append(f"| {b['scope']} | {b['phase']} | {b['n']} | {b['wall_s']:.1f} | {b['per_gpu_min']} | "
                     f"{b['device_s']['median']:.2f} · {b['device_s']['p90']:.2f} | {alone(b)} | {phases} | {statuses} |")
    scopes = list(dict.fromkeys(b["scope"] for b in results["blocks"]))
    if len(scopes) >= 2:
        for phase in dict.fromkeys(b["phase"] for b in results["blocks"]):
            blocks = {b["scope"]: b for b in results["blocks"] if b["phase"] == phase}
            if scopes[0] in blocks and scopes[1] in blocks:
                lines += ["", *comparison(blocks[scopes[0]], blocks[scopes[1]], phase)]
    return "\n".join(lines)


def inside(v: dict, other: dict) -> bool | None:
    if v["speedup"] is None or not other["ci95"]:
        return None
    return other["ci95"][0] <= v["speedup"] <= other["ci95"][1]


def comparison(a: dict, b: dict, phase: str) -> list[str]:
    """Per candidate: status and speedup [ci95] in each scope, and whether each speedup lies in the other's CI."""
    sa, sb = a["scope"], b["scope"]
    lines = [f"{phase}: {sa} vs {sb}", "",
             f"| item | {sa} | {sb} | {sa} speedup | {sb} speedup | {sa} in {sb} CI | {sb} in {sa} CI |",
             "|---|---|---|--:|--:|---|---|"]
    other = {v["item"]: v for v in b["verdicts"]}
    same = checked = held = 0
    for va in a["verdicts"]:
        vb = other.get(va["item"])
        if vb is None:
            continue
        same += va["status"] == vb["status"]
        checks = [inside(va, vb), inside(vb, va)]
        checked += sum(c is not None for c in checks)
        held += sum(bool(c) for c in checks)
        lines.append(f"| {va['item']} | {va['status']} | {vb['status']} | {fmt_speedup(va)} | {fmt_speedup(vb)} | "
                     + " | ".join("-" if c is None else "yes" if c else "no" for c in checks) + " |")
    lines += ["", f"same status {same}/{len(other)}; speedups inside the other's interval {held}/{checked}"]
    return lines


def fmt_speedup(v: dict) -> str:
    if v["speedup"] is None:
        return "-"
    ci = f" [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}]" if v["ci95"] else ""
    return f"{v['speedup']:.2f}{ci}"


# -- command line ----------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="sample a corpus of CUDA-L1 candidates into a pack file")
    p.add_argument("--datasets", default=os.environ.get("KERNELCRAFT_DATASETS", "datasets"))
    p.add_argument("--gpu-file", default="h100", help="cuda_l1/<GPU-FILE>.jsonl")
    p.add_argument("--n", type=int, default=24, help="candidates to sample (baselines come on top)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baselines", default="inductor", help="comma list of torch.compile baselines, or none")
    p.add_argument("--out", required=True)
    r = sub.add_parser("run", help="judge a pack through the pool, per lock scope and cache phase")
    r.add_argument("--pack", required=True)
    r.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if available")
    r.add_argument("--gpus", type=int, default=1)
    r.add_argument("--per-gpu", type=int, default=None, help="timing slots per GPU (default: the pool's)")
    r.add_argument("--scopes", default="timing,device")
    r.add_argument("--phases", default="cold,warm")
    r.add_argument("--time-budget", type=float, default=None, help="seconds of paired timing per candidate")
    r.add_argument("--out", default="corpus_throughput.json")
    r.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    if args.command == "pack" and args.n < 1 or args.command == "run" and min(args.gpus, args.per_gpu or 1) < 1:
        ap.error("--n, --gpus and --per-gpu must be at least 1")
    if args.command == "run" and args.time_budget is not None and not 0 < args.time_budget <= 600:
        ap.error("--time-budget takes seconds in (0, 600]")
    return pack(args) if args.command == "pack" else run(args)


if __name__ == "__main__":
    sys.exit(main())
