"""What a bench scores for a task whose optimize run verified no candidate faster: its fallback, never a failure.

The options, each needing a verdict that is correct, loads the reference's weights and has its 95% CI's lower
end at or above the run's floor: the run's fallback candidate (at its confirmed number), and each of the task's
baselines whose text the run did not evaluate itself. Highest lower end first, each is judged afresh like a
best.py and stands when that verdict qualifies too; when none does, the reference itself stands: `correct`,
1.0x, not judged (`timing` null). Strict mode does not take the reference (it runs no kernel of its own).
Rationale: docs/bench.md#fallbacks
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from kernelcraft.bench import baselines as bl
from kernelcraft.bench.records import bench_verdict
from kernelcraft.bench.sources import Item
from kernelcraft.search.optimize import Result, drop_in


def _low(v: dict) -> float | None:
    ci = (v.get("timing") or {}).get("ci95") or [None, None]
    return ci[0]


def qualifies(v: dict, floor: float) -> bool:
    """Correct, a drop-in for the reference's weights, with its 95% CI's lower end at or above `floor`."""
    low = _low(v)
    return v.get("status") == "correct" and v.get("speedup") is not None and low is not None and low >= floor \
        and drop_in(v)


def record(it: Item, res: Result, run_shas: set[str], known: dict, judge: Callable[..., dict], why: str, *,
           dev: str, mode: str, env: dict) -> dict | None:
    """The task's bench record: the first option that holds when judged afresh, else the reference (None in
    strict mode: the caller records the task as `no_candidate`). `known`: the task's baseline verdicts by
    candidate sha256 (`records.measured_texts`); `run_shas`: the run's candidates' sha256; `judge(source,
    baseline=None)`: a fresh verdict."""
    fb = res.fallback or {}
    floor = fb.get("floor", 1.0)
    options = []  # (first lower end, speedup, kind, baseline name, source, path)
    if fb.get("kind") == "fallback_candidate":
        options.append((fb["ci95"][0], fb["speedup"], "fallback_candidate", None, Path(fb["path"]).read_text(),
                        fb["path"]))
    for sha, v in sorted(known.items()):
        if sha not in run_shas and v.get("baseline") in bl.RECIPES and qualifies(v, floor):
            options.append((_low(v), v["speedup"], "baseline", v["baseline"], bl.source(it.task.source, v["baseline"]),
                            None))
    tried = []
    for _, _, kind, name, source, path in sorted(options, key=lambda o: (-o[0], -o[1])):
        v = judge(source, name)
        info = {"kind": kind, "baseline": name, "candidate": fb.get("candidate") if kind != "baseline" else None,
                "floor": floor, "run": res.best_kind, "tried": tried}
        if qualifies(v, floor):
            what = f"the {name} baseline" if name else f"its fallback, candidate #{fb.get('candidate')} (best.py)"
            said = f"{why}: scored at {what}, judged afresh: correct and no slower than the reference with confidence"
            return {**v, "candidate_path": path, "fallback": info,
                    "message": said + (f"; {v['message']}" if v.get("message") else "")}
        tried.append({"kind": kind, "baseline": name, "status": v.get("status"), "speedup": v.get("speedup"),
                      "ci95": (v.get("timing") or {}).get("ci95")})
    if mode == "strict":
        return None
    rec = bench_verdict(it, "correct", f"{why}: scored at its fallback, the reference itself (best.py), 1.0x by "
                                       "definition, not judged", dev, mode, env)
    rec.update(reasons=[], speedup=1.0, candidate_path=fb.get("path"),
               fallback={"kind": "reference", "baseline": None, "candidate": None, "floor": floor,
                         "run": res.best_kind, "tried": tried})
    return rec
