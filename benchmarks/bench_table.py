"""Per-task table and geomeans of `kernelcraft bench` runs with `--policy recipes` and baselines, for BENCHMARKS.md.

Usage: PYTHONPATH=$PWD python3 benchmarks/bench_table.py SOURCE [SOURCE ...] [--markdown] [--json]

SOURCE: a bench out directory (`verdicts.jsonl`, `baselines.jsonl`) or a `.json.gz` export of one
({"baselines": {task: {name: {status, speedup}}}, "tasks": [{task, status, speedup, ci95, fallback, optimize}]}).
A task in a later SOURCE replaces the same task in an earlier one (a re-run). Speedups are the judge's, against
the eager reference. Columns: inductor and CUDA graph (their baselines; "—" when not correct), the recipes
verdict with its 95% interval, what won, and the verdict over each of two references:
- `vs best baseline`: the best of eager (1.0), inductor and CUDA graph, what a user could have had without us;
- `vs inductor`: `kernelcraft bench`'s `speedup_vs_compile` (the best correct torch.compile baseline, eager when
  none is correct), which counts a win over a slower-than-eager inductor in full.
Both are ratios of speedups from different evaluations, each against its own eager reference process. Where that
reference's time moves between evaluations (launch-bound networks: `eager spread`, the largest over the smallest
`ref_ms` among the task's verdicts), so do they. `vs best, by time` compares the programs' own times instead: the
best baseline's `cand_ms` (eager: the median `ref_ms`) over the verdict's (bench out directories only); the
summary gives inductor's the same way.
Geomeans count a task with no correct verdict as 1.0x against eager, as the bench does.
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from kernelcraft.bench.metrics import geomean, own_times
from kernelcraft.search.techniques import TOKEN_TECHNIQUES

KEPT = "reference kept (nothing verified faster)"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def load(source: Path) -> dict[str, dict]:
    """{task: {speedup, ci95, won, inductor, cudagraph}} from one SOURCE."""
    if source.is_dir():
        base: dict[str, dict] = {}
        for b in _jsonl(source / "baselines.jsonl"):
            base.setdefault(b["task"], {})[b["baseline"]] = b
        tasks = [{**r, "ci95": (r.get("timing") or {}).get("ci95"), "times": _times(r, base.get(r["task"], {}))}
                 for r in _jsonl(source / "verdicts.jsonl")]
    else:
        data = json.load(gzip.open(source) if source.suffix == ".gz" else source.open())
        base, tasks = data["baselines"], data["tasks"]
    out = {}
    for r in tasks:
        correct = r.get("status") == "correct" and r.get("speedup")
        fb = r.get("fallback") or {}
        won = (KEPT if fb.get("kind") == "reference" else f"fallback: {fb.get('kind')}" if fb
               else ", ".join(TOKEN_TECHNIQUES.get(t, t) for t in (r.get("optimize") or {}).get("best_techniques") or [])
               or "—")  # a token a run printed before it had a name for people gets its name
        bl = {n: (v.get("speedup") if v.get("status") == "correct" else None)
              for n, v in base.get(r["task"], {}).items()}
        out[r["task"]] = {"speedup": r["speedup"] if correct else None, "status": r.get("status"),
                          "ci95": r.get("ci95") if correct and not fb else None, "won": won if correct else
                          r.get("status"), "inductor": bl.get("inductor"), "cudagraph": bl.get("cudagraph"),
                          **(r.get("times") or {"vs_best_time": None, "vs_inductor_time": None, "eager_spread": None})}
    return out


def _times(verdict: dict, baselines: dict[str, dict]) -> dict:
    """The verdict against the best baseline (eager among them) and inductor (eager where it failed) by the
    programs' own times (`metrics.own_times`), and the eager reference's spread over the task's verdicts (`ref_ms`,
    max over min)."""
    t = own_times(verdict, baselines)
    best = min([x for x in [t.eager_ms, *t.baselines_ms.values()] if x], default=None)
    inductor = t.baselines_ms.get("inductor") or t.eager_ms
    ours, refs = t.ours_ms, t.reference_ms
    return {"vs_best_time": best / ours if best and ours else None,
            "vs_inductor_time": inductor / ours if inductor and ours else None,
            "eager_spread": refs[-1] / refs[0] if len(refs) > 1 else None}


def with_ratios(rows: dict[str, dict]) -> dict[str, dict]:
    for r in rows.values():
        s = r["speedup"] or 1.0
        r["vs_best"] = s / max([1.0] + [v for v in (r["inductor"], r["cudagraph"]) if v])
        r["vs_inductor"] = s / (r["inductor"] or 1.0)
    return rows


def summary(rows: dict[str, dict]) -> dict:
    rs = list(rows.values())
    return {"tasks": len(rs), "correct": sum(r["speedup"] is not None for r in rs),
            "geomean_vs_eager": geomean(r["speedup"] or 1.0 for r in rs),
            "geomean_vs_best_baseline": geomean(r["vs_best"] for r in rs),
            "geomean_vs_inductor": geomean(r["vs_inductor"] for r in rs),
            "geomean_vs_best_by_time": geomean(r["vs_best_time"] for r in rs if r.get("vs_best_time")),
            "geomean_vs_inductor_by_time": geomean(r["vs_inductor_time"] for r in rs if r.get("vs_inductor_time")),
            "by_time_tasks": sum(bool(r.get("vs_best_time")) for r in rs),
            "inductor_vs_eager": geomean(r["inductor"] for r in rs if r["inductor"]),
            "improved_over_best": sum(r["vs_best"] > 1.05 for r in rs),
            "below_best": sum(r["vs_best"] < 0.95 for r in rs)}


def markdown(rows: dict[str, dict]) -> str:
    f = lambda v: "—" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["| task | inductor | CUDA graph | recipes | recipes 95% | what won | vs best baseline | vs inductor "
             "| vs best, by time | eager spread |", "|---|--:|--:|--:|---|---|--:|--:|--:|--:|"]
    for name in sorted(rows, key=lambda n: (int(n.split("_")[0]) if n.split("_")[0].isdigit() else 0, n)):
        r = rows[name]
        ci = f"[{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}]" if r["ci95"] else ""
        lines.append(f"| {name} | {f(r['inductor'])} | {f(r['cudagraph'])} | {f(r['speedup'])} | {ci} | {r['won']} "
                     f"| {r['vs_best']:.2f} | {r['vs_inductor']:.2f} | {f(r.get('vs_best_time'))} "
                     f"| {f(r.get('eager_spread'))} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="+", type=Path)
    ap.add_argument("--markdown", action="store_true", help="print the per-task table")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    rows: dict[str, dict] = {}
    for src in args.sources:
        if not src.exists():
            ap.error(f"{src}: no such bench out directory or export")
        rows.update(load(src))
    if not rows:
        ap.error("no verdicts in " + ", ".join(map(str, args.sources)))
    with_ratios(rows)
    if args.markdown:
        print(markdown(rows) + "\n")
    s = summary(rows)
    g = {k: "—" if v is None else f"{v:.2f}" for k, v in s.items() if k.startswith(("geomean", "inductor"))}
    print(json.dumps(s) if args.json else
          f"{s['tasks']} tasks, {s['correct']} correct: geomean {g['geomean_vs_eager']} vs eager, "
          f"{g['geomean_vs_best_baseline']} vs the best baseline, {g['geomean_vs_inductor']} vs inductor "
          f"(inductor {g['inductor_vs_eager']} vs eager); above the best baseline by 5%+ on "
          f"{s['improved_over_best']}, below by 5%+ on {s['below_best']}; by the programs' own times "
          f"{g['geomean_vs_best_by_time']} vs the best baseline, {g['geomean_vs_inductor_by_time']} vs inductor "
          f"({s['by_time_tasks']} tasks)")


if __name__ == "__main__":
    main()
