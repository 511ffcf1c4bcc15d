"""Bench metrics and the bench summary: what the numbers of `kernelcraft bench` mean.

Over the scored items (all but input errors): `fast_p` and the geomean/median speedups count every failure
(as not fast, and as 1.0); `*_correct` variants are over correct items only; `*_vs_compile` divide by the
task's best correct `torch.compile` baseline. An optimize run's fallback is a correct item at its speedup
(`bench.fallback`). Intervals come from the per-task CIs. `summarise` builds the summary record (the `--json`
contract's keys first).
Rationale: docs/design/bench.md#metrics
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from kernelcraft.bench import baselines as bl
from kernelcraft.bench import roofline as rl
from kernelcraft.bench.options import BenchOptions
from kernelcraft.bench.sources import Item, Source
from kernelcraft.bench.timeuse import time_use
from kernelcraft.verdict import UNVERIFIABLE

Z95 = 1.959963984540054  # two-sided 95% of a normal
P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
P_KEYS = tuple(f"{p:g}" for p in P_VALUES)  # "0", "0.5", "0.8", "1", "1.5", "2"


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _interval(r: dict, key: str) -> tuple[float, float]:
    """A correct row's 95% interval of `key` (its point estimate when it has none), scaled like the key."""
    ci = r.get("ci95")
    x = r[key]
    if not ci or len(ci) != 2 or not all(isinstance(v, (int, float)) and v > 0 for v in ci) or not r.get("speedup"):
        return x, x
    scale = x / r["speedup"]  # 1 vs eager; 1 / best compile speedup vs compile
    return ci[0] * scale, ci[1] * scale


def geomean_ci(rows: list[dict], ok: list[dict], key: str) -> list[float] | None:
    """exp(mean ± 1.96 · sqrt(Σσ²) / n) of log speedups, σ from each correct task's 95% CI (failures: 1.0, σ = 0)."""
    if not rows:
        return None
    logs, var = [], 0.0
    for r in rows:
        if r not in ok or not r[key] or r[key] <= 0:
            logs.append(0.0)
            continue
        lo, hi = _interval(r, key)
        logs.append(math.log(r[key]))
        var += ((math.log(hi) - math.log(lo)) / (2 * Z95)) ** 2 if lo > 0 and hi > 0 else 0.0
    mean, half = sum(logs) / len(logs), Z95 * math.sqrt(var) / len(logs)
    return [math.exp(mean - half), math.exp(mean + half)]


FAILED_STATUSES = ("compile_error", "runtime_error", "timeout")
# what a scored item came to, in the order a headline counts them (`outcome`)
OUTCOMES = ("faster", "not_faster", "incorrect", "rejected", "failed", "no_candidate")
OUTCOME_WORDS = {"faster": "faster", "not_faster": "correct, not faster", "incorrect": "incorrect",
                 "rejected": "rejected", "failed": "failed", "no_candidate": "without a candidate"}
OUTCOME_MEANING = {
    "faster": "correct, and the speedup's 95% CI lies above 1x",
    "not_faster": "correct, but the speedup's 95% CI reaches 1x or below; or, with optimize, no candidate was "
                  "verified faster and the task is scored, as correct, at its fallback's speedup: the reference "
                  "itself (1.0x), or a candidate or baseline judged afresh no slower than it with confidence; in "
                  "strict mode, where the reference is no answer, a run with correct candidates and no fallback "
                  "counts here as a failure at 1.0x",
    "incorrect": "outputs outside tolerance (with optimize in strict mode, without a fallback: no correct "
                 "candidate, some of them incorrect)",
    "rejected": "a guard rejected it (a shortcut such as a cached output or a patched timer, or a speedup that did "
                "not reproduce; its reason names which): a failure",
    "failed": "build error, runtime error or timeout (with optimize in strict mode, without a fallback: no "
              "candidate got as far as a wrong output)",
    "no_candidate": "no candidate file for this task",
}


FALLBACK_KINDS = ("reference", "fallback_candidate", "baseline")  # what a fallback record scored (`bench.fallback`)


def fallback_label(fb: dict | None) -> str | None:
    """A bench record's fallback in a word or two: `reference`, `candidate #N`, or the baseline's name."""
    if not fb:
        return None
    return {"reference": "reference", "fallback_candidate": f"candidate #{fb.get('candidate')}"}.get(
        fb["kind"], fb.get("baseline") or fb["kind"])


def outcome(rec: dict) -> str | None:
    """What a bench verdict record came to, one of `OUTCOMES`; None for what is not scored (input errors, tasks
    judged for their baselines only). `faster` needs the 95% CI's lower end above 1 (a correct verdict without an
    interval is `not_faster`); an optimize run's fallback (a record with `fallback`) is `not_faster`, whatever its
    interval. A `no_candidate` record of an optimize run says why through `optimize.status`: correct candidates
    none of which was verified faster (`not_faster`), or none correct (`incorrect` when one of them was,
    `rejected` when one was caught, else `failed`)."""
    status = rec.get("status")
    if status in ("input_error", "not_evaluated"):
        return None
    if status == "correct":
        if rec.get("fallback"):
            return "not_faster"
        ci = (rec.get("timing") or {}).get("ci95") or rec.get("ci95")
        return "faster" if ci and ci[0] is not None and ci[0] > 1.0 else "not_faster"
    if status in ("incorrect", "rejected"):
        return status
    if status == "no_candidate":
        opt = rec.get("optimize") or {}
        if opt.get("status") == "no_improvement" or opt.get("correct"):
            return "not_faster"
        if opt.get("status") == "no_correct":
            seen = opt.get("statuses") or {}
            return "incorrect" if seen.get("incorrect") else "rejected" if seen.get("rejected") else "failed"
        return "no_candidate"
    return "failed"


def metrics(rows: list[dict], *, vs_compile: bool = False) -> dict:
    """Metrics over rows {correct: bool, speedup: float|None[, speedup_vs_compile, ci95, outcome]}
    (docs/design/bench.md#metrics); `outcomes` counts the rows' `outcome` where they carry one (candidates, not baselines)."""
    n = len(rows)
    ok = [r for r in rows if r["correct"] and r.get("speedup") is not None]

    def block(key: str, suffix: str) -> dict:
        spans = [_interval(r, key) for r in ok]
        return {
            f"fast_p{suffix}": {k: (sum(r[key] > p for r in ok) / n if n else None) for k, p in zip(P_KEYS, P_VALUES)},
            f"fast_p{suffix}_range": {k: ([sum(lo > p for lo, _ in spans) / n, sum(hi > p for _, hi in spans) / n]
                                          if n else None) for k, p in zip(P_KEYS, P_VALUES)},
            f"geomean_speedup{suffix}_ci95": geomean_ci(rows, ok, key),
            f"geomean_speedup{suffix}": geomean([r[key] if r in ok else 1.0 for r in rows]),
            f"median_speedup{suffix}": median([r[key] if r in ok else 1.0 for r in rows]),
            f"geomean_speedup{suffix}_correct": geomean([r[key] for r in ok]),
            f"median_speedup{suffix}_correct": median([r[key] for r in ok]),
        }

    m = {"tasks": n, "correct": len(ok), "correct_rate": len(ok) / n if n else None,
         "unverifiable": sum(UNVERIFIABLE in (r.get("reasons") or []) for r in rows), **block("speedup", "")}
    if any("outcome" in r for r in rows):
        m["outcomes"] = {k: sum(r.get("outcome") == k for r in rows) for k in OUTCOMES}
    if vs_compile:
        m.update(block("speedup_vs_compile", "_vs_compile"))
        scored = [r.get("speedup_vs_compile_by_time") or 1.0 for r in rows  # a failure at 1.0; untimed left out
                  if r.get("speedup_vs_compile_by_time") or not (r["correct"] and r.get("speedup") is not None)]
        m["geomean_speedup_vs_compile_by_time"] = geomean(scored)
    return m


@dataclass(frozen=True)
class OwnTimes:
    """A task's programs by their own times: the eager reference's readings over the task's verdicts (`ref_ms`),
    their median (eager's time), the verdict's program (a kept reference's: eager's) and each correct baseline's
    (`cand_ms`). None where not measured."""
    reference_ms: list[float]
    eager_ms: float | None
    ours_ms: float | None
    baselines_ms: dict[str, float]


def own_times(rec: dict, baselines: dict[str, dict]) -> OwnTimes:
    """`OwnTimes` of one verdict record and its task's baseline records (by name)."""
    ms = lambda v, k: (v.get("timing") or {}).get(k) if v.get("status") == "correct" else None  # noqa: E731
    refs = sorted(t for v in [rec, *baselines.values()] if (t := ms(v, "ref_ms")))
    eager = refs[len(refs) // 2] if refs else None
    ours = eager if (rec.get("fallback") or {}).get("kind") == "reference" else ms(rec, "cand_ms")
    return OwnTimes(refs, eager, ours, {b: t for b, v in baselines.items() if (t := ms(v, "cand_ms"))})


def vs_compile_by_time(rec: dict, baselines: dict[str, dict], best: str) -> float | None:
    """The verdict against the best compile baseline by the two programs' own times (`own_times`: eager's where
    `best` is eager). Each paired speedup is against its own eager reference process, and a launch-bound
    reference's time moves between processes (docs/design/bench.md#metrics); the programs' own times do not
    move with it."""
    t = own_times(rec, baselines)
    theirs = t.baselines_ms.get(best) if best in baselines else t.eager_ms
    return theirs / t.ours_ms if theirs and t.ours_ms else None


def _by_level(rows: list[dict], vs_compile: bool) -> dict:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r["level"]) if r.get("level") is not None else "unknown", []).append(r)
    return {k: metrics(groups[k], vs_compile=vs_compile)
            for k in sorted(groups, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))}


SPEEDUP_DEFINITION = ("speedup = eager reference time / candidate time (paired, interleaved timing). geomean_speedup "
                      "and median_speedup are over all scored tasks with every failure counted as 1.0; *_correct "
                      "variants are over correct tasks only. fast_p = fraction of all scored tasks that are correct "
                      "with speedup > p. speedup_vs_compile = speedup / (best correct torch.compile baseline's speedup "
                      "vs eager; 1.0 when none is correct): a ratio of two paired measurements. "
                      "speedup_vs_compile_by_time = that baseline's own time / the candidate's own time.")


def first_line(msg: str | None, limit: int = 200) -> str:
    """A message's first line, whole up to `limit` characters; a longer one is cut after its last whole word
    within the limit and marked with '…' (a cut mid-word, `…: no bes`, read as the whole message)."""
    line = (msg or "").strip().splitlines()[0].rstrip() if (msg or "").strip() else ""
    if len(line) <= limit:
        return line
    cut = line[:limit - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut).rstrip(" ,;:") + "…"


def summarise(source: Source, items: list[Item], records: dict, base: dict, wanted: list[str], skipped: dict,
               stats: dict, out: Path, devname: str, opts: BenchOptions, protocol: dict, resumed: int,
               evaluated: int, wall: float, work: dict[str, dict] | None = None) -> dict:
    """The summary record (docs/bench.md#output); `work`: each task's minimal work by SHA-256 (`bench.roofline`),
    for the rows' `roofline` on a GPU with known peaks."""
    compile_names = [b for b in wanted if b in bl.COMPILE_BASELINES]
    peak, work, roof_missing = rl.peaks(devname), work or {}, {}
    rows, errors = [], []
    statuses: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for it in items:
        rec = records.get(it.key)
        if rec is None:  # not evaluated (baselines only)
            if it.task is None or it.error is not None:
                continue
            rec = {"status": "not_evaluated", "reasons": [], "speedup": None, "message": "baselines only"}
        if rec["status"] == "input_error":
            errors.append({"item": it.name, "origin": it.origin, "message": rec["message"]})
            continue
        statuses[rec["status"]] = statuses.get(rec["status"], 0) + 1
        for r in rec.get("reasons") or []:
            reasons[r] = reasons.get(r, 0) + 1
        sha = it.task.sha256
        bs = {b: (base.get((sha, b)) or {}) for b in wanted if b != "eager"}
        comp = {b: bs[b]["speedup"] for b in compile_names if bs[b].get("status") == "correct" and bs[b].get("speedup")}
        best_c = max(comp.items(), key=lambda kv: kv[1]) if comp else ("eager", 1.0)
        correct = rec["status"] == "correct" and rec.get("speedup") is not None
        by_time = vs_compile_by_time(rec, bs, best_c[0]) if correct and compile_names else None
        rows.append({"item": it.name, "level": it.level, "task_id": it.task_id, "status": rec["status"],
                     "reasons": rec.get("reasons") or [], "correct": correct,
                     "speedup": rec["speedup"] if correct else None,
                     "speedup_vs_compile": rec["speedup"] / best_c[1] if correct and compile_names else None,
                     "speedup_vs_compile_by_time": by_time,
                     "ci95": (rec.get("timing") or {}).get("ci95") if correct else None,
                     "ref_ms": (rec.get("timing") or {}).get("ref_ms"),
                     "cand_ms": (rec.get("timing") or {}).get("cand_ms"),
                     "best_compile": best_c[0] if compile_names else None,
                     "baselines": {b: {"status": bs[b].get("status"), "speedup": bs[b].get("speedup")} for b in bs},
                     "outcome": outcome(rec), "fallback": fallback_label(rec.get("fallback") if correct else None),
                     "message": first_line(rec.get("message")), "key": it.key})
        rows[-1]["roofline"] = None
        if peak is not None:
            rows[-1]["roofline"] = rl.task_roofline(work.get(sha), peak, **rl.times(
                rec, bs[best_c[0]] if best_c[0] in bs else None, bs.values(), correct))
            if rows[-1]["roofline"] is None:
                roof_missing[it.name] = rl.why_not(work.get(sha), peak)
    with_compile = bool(compile_names)
    scored = not opts.baselines_only
    m = metrics(rows, vs_compile=with_compile) if scored else {
        "tasks": len({it.task.sha256 for it in items if it.task is not None and it.error is None}), "correct": None,
        "fast_p": None, "geomean_speedup": None, "median_speedup": None, "outcomes": None}
    if scored and not rows:
        m["outcomes"] = {k: 0 for k in OUTCOMES}
    if scored:  # tasks scored at an optimize run's fallback, by what stood (`bench.fallback`)
        m["fallbacks"] = {k: sum((records.get(it.key) or {}).get("status") == "correct" and
                                 ((records.get(it.key) or {}).get("fallback") or {}).get("kind") == k for it in items)
                          for k in FALLBACK_KINDS}
    if scored and not with_compile:
        m.update({"fast_p_vs_compile": None, "geomean_speedup_vs_compile": None, "median_speedup_vs_compile": None,
                  "fast_p_vs_compile_range": None, "geomean_speedup_vs_compile_ci95": None})
    base_summary = {}
    shas = list(dict.fromkeys(it.task.sha256 for it in items if it.task is not None and it.error is None))
    levels = {it.task.sha256: it.level for it in items if it.task is not None}
    for b in wanted:
        if b == "eager":
            base_summary[b] = {"tasks": len(shas), "note": "the reference itself: 1.0x by definition"}
            continue
        brows = []
        for sha in shas:
            r = base.get((sha, b)) or {}
            brows.append({"level": levels.get(sha), "correct": r.get("status") == "correct" and r.get("speedup") is not None,
                          "speedup": r.get("speedup"), "reasons": r.get("reasons") or []})
        base_summary[b] = {**metrics(brows), "by_level": _by_level(brows, False)}
    return {
        "source": source.spec, "kind": source.kind, "out": str(out), "device": devname,
        "devices": opts.device.split(",") if opts.device else None,  # this invocation's GPUs (one product)
        **m,
        "by_level": _by_level(rows, with_compile) if scored else {},
        "speedup_definition": SPEEDUP_DEFINITION,
        "items_total": len(items), "input_errors": len(errors), "statuses": statuses, "reasons": reasons,
        "baselines": {"names": wanted, "skipped": skipped, "compile": compile_names, **stats,
                      "summary": base_summary},
        "candidates": "none" if opts.baselines_only else (
            "optimize" if not source.has_candidates and source.kind != "pairs" else "given"),
        "policy": opts.policy if not source.has_candidates and not opts.baselines_only else None,
        "budget": opts.budget if not source.has_candidates and not opts.baselines_only else None,
        "task_jobs": opts.task_jobs if not source.has_candidates else None,  # how it ran, not part of the protocol
        "baselines_only": opts.baselines_only, "protocol": protocol, "resumed": resumed,
        "evaluated": evaluated,
        "roofline": rl.summary(peak, devname, rows, roof_missing),
        "wall_s": round(wall, 2), "time_use": time_use(records.values(), base.values(), out / "runs", levels),
        "notes": source.notes, "errors": errors,
        "verdicts": str(out / "verdicts.jsonl"), "items": rows,
    }
