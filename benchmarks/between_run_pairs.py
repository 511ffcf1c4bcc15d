"""Do the judge's reproducibility intervals hold on real tasks? Pairs of measurements of one program in separate
evaluations (a search's verdict and its confirmations in fresh workers), and the calibration of the between-run
model's per-side term from them.

Usage:
    python benchmarks/between_run_pairs.py extract BENCH_OUT|CORPUS_JSON [...] --out pairs.json.gz
    python benchmarks/between_run_pairs.py check pairs.json.gz [--beta B] [--target 0.9]

`extract` reads every `runs/*/run.db` of the bench out directories: each correct candidate measured more than once
(its search verdict and each confirmation) gives its timing records (the fields the interval is computed from).
A `corpus_throughput.py run` result gives each pack item's records over its blocks (scopes and phases).
`check` recomputes each record's reproducibility interval (`reproduce.reproducible` from its within-run interval,
medians, overhead and quartiles) and reports, over every ordered pair of one program's records, the share of the
second's speedup inside the first's interval: under the model as it stands, with `--beta` if given, and the
smallest beta on a grid whose share reaches `--target` on the tasks of even id (the calibration half), then that
beta on the odd ones (held out). The between-run model's rationale: docs/design/judge-speed.md#reproduce.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import sys
from dataclasses import replace
from pathlib import Path

from kernelcraft.judge.speed import reproduce
from kernelcraft.judge.speed.timing import TimingResult

FIELDS = reproduce.INPUT_FIELDS
GRID = [round(0.05 * i, 2) for i in range(0, 41)]  # beta from 0 to 2


def _usable(v: dict) -> dict | None:
    t = v.get("timing") or {}
    if v.get("status") == "correct" and t.get("within_ci95") and t.get("ref_ms") and t.get("cand_ms"):
        return {k: t.get(k) for k in FIELDS} | {"device": v.get("device")}
    return None


def from_corpus(path: Path) -> list[dict]:
    """A corpus result's programs: each item's usable records over the blocks."""
    measured: dict[str, list[dict]] = {}
    for block in json.loads(path.read_text()).get("blocks", []):
        for v in block.get("verdicts", []):
            if (rec := _usable(v)) is not None:
                measured.setdefault(v["item"], []).append(rec)
    return [{"source": path.name, "task": item, "candidate": None, "records": recs}
            for item, recs in measured.items() if len(recs) > 1]


def extract(outs: list[Path]) -> list[dict]:
    """[{source, task, candidate, records: [timing fields + device]}] for programs measured twice or more."""
    programs = []
    for out in outs:
        if out.is_file():
            programs += from_corpus(out)
            continue
        for db in sorted(out.glob("runs/*/run.db")):
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            measured: dict[int, list[dict]] = {}
            rows = con.execute("SELECT id, verdict FROM candidates WHERE verdict IS NOT NULL UNION ALL "
                               "SELECT candidate_id, verdict FROM confirmations")
            for cid, text in rows:
                if (rec := _usable(json.loads(text))) is not None:
                    measured.setdefault(cid, []).append(rec)
            con.close()
            programs += [{"source": out.name, "task": db.parent.name, "candidate": cid, "records": recs}
                         for cid, recs in measured.items() if len(recs) > 1]
    return programs


def interval(rec: dict, cal: reproduce.BetweenRun) -> tuple[float, float]:
    """The record's reproducibility interval recomputed under `cal`."""
    res = TimingResult(ref_ms=rec["ref_ms"], cand_ms=rec["cand_ms"], speedup=rec["speedup"],
                       ci95=tuple(rec["within_ci95"]), samples=0, converged=True, method="",
                       ref_spread_ms=tuple(rec["ref_spread_ms"]), cand_spread_ms=tuple(rec["cand_spread_ms"]),
                       host_ref_ms=0.0, host_cand_ms=0.0, spot_checks=0, overhead_ms=rec["overhead_ms"] or 0.0,
                       cand_overhead_ms=rec["cand_overhead_ms"])
    kind = "cuda" if str(rec.get("device") or "").startswith("cuda") else "cpu"
    return reproduce.reproducible(res, kind, calibration=cal).ci95


def coverage(programs: list[dict], cal: reproduce.BetweenRun) -> tuple[float, int]:
    """(share of ordered pairs whose second estimate falls inside the first's interval, pairs)."""
    hits = n = 0
    for p in programs:
        recs = p["records"]
        for i, a in enumerate(recs):
            lo, hi = interval(a, cal)
            for j, b in enumerate(recs):
                if i != j:
                    n += 1
                    hits += lo <= b["speedup"] <= hi
    return (hits / n if n else float("nan")), n


def _task_id(p: dict) -> int:
    head = p["task"].split("_")[0]
    return int(head) if head.isdigit() else 0


def check(args) -> int:
    programs = json.load(gzip.open(args.pairs) if args.pairs.suffix == ".gz" else args.pairs.open())
    if not programs:
        sys.exit(f"check: {args.pairs} holds no program measured twice")
    base = reproduce.BETWEEN_RUN["cuda"]
    rows = [("as calibrated", base)]
    if args.beta is not None:
        rows.append((f"beta {args.beta:g}", replace(base, beta=args.beta)))
    for name, cal in rows:
        share, n = coverage(programs, cal)
        print(f"{name} (kappa {cal.kappa:g}, rho {cal.rho:g}, beta {cal.beta:g}): {share:.1%} of {n} pairs inside")
    fit = [p for p in programs if _task_id(p) % 2 == 0]
    held = [p for p in programs if _task_id(p) % 2 == 1]
    if not fit or not held:
        print("no calibration: it needs programs of tasks with even ids and with odd ids")
        return 0
    beta = next((b for b in GRID if coverage(fit, replace(base, beta=b))[0] >= args.target), None)
    if beta is None:
        print(f"no beta up to {GRID[-1]} reaches {args.target:.0%} on the even-id tasks")
        return 1
    share_fit, n_fit = coverage(fit, replace(base, beta=beta))
    share_held, n_held = coverage(held, replace(base, beta=beta))
    print(f"smallest beta reaching {args.target:.0%} on even-id tasks: {beta:g} ({share_fit:.1%} of {n_fit} pairs); "
          f"odd-id tasks, held out: {share_held:.1%} of {n_held} pairs")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("outs", nargs="+", type=Path)
    e.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check")
    c.add_argument("pairs", type=Path)
    c.add_argument("--beta", type=float)
    c.add_argument("--target", type=float, default=0.9)
    args = ap.parse_args(argv)
    if args.cmd == "extract":
        missing = [str(o) for o in args.outs if not o.exists()]
        if missing:
            ap.error("no such bench out directory or corpus result: " + ", ".join(missing))
        programs = extract(args.outs)
        with (gzip.open(args.out, "wt") if args.out.suffix == ".gz" else args.out.open("w")) as f:
            json.dump(programs, f)
        print(f"{len(programs)} programs measured more than once, "
              f"{sum(len(p['records']) for p in programs)} records -> {args.out}")
        return 0
    if not args.pairs.exists():
        ap.error(f"{args.pairs}: no such file")
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
