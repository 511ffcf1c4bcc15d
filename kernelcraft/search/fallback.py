"""The fallback: what `OUT/best.py` holds when no candidate was verified faster, so a run always ends with a
usable program.

`choose` picks among the correct drop-in candidates by their measured 95% CI (the confirmation's where the run
confirms) against the floor (`floor`); the reference itself, rendered standalone as `ModelNew(Model)`, is 1.0x
by definition and wins unless a candidate is at least as fast with confidence. A fallback's best.py opens with a
comment header that says what it is; a verified-faster best is written unchanged.
Rationale: docs/search.md#the-fallback
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kernelcraft.search.recipes.render import reference_parts
from kernelcraft.search.rundb import Row
from kernelcraft.search.techniques import techniques

KINDS = ("candidate", "fallback_candidate", "reference")  # what best.py holds (`Result.best_kind`)


def control_bias(control: dict | None) -> float | None:
    """The null control's speedup when the control is correct and its CI's lower end is above 1 (a timing bias the
    interval excludes: it raises the run's bar), else None."""
    ci = (control or {}).get("ci95") or [None, None]
    if control and control.get("status") == "correct" and control.get("speedup") and ci[0] is not None and ci[0] > 1.0:
        return float(control["speedup"])
    return None


def floor(control: dict | None) -> float:
    """The CI lower bound a fallback candidate needs: the null control's bias (`control_bias`), else 1.0."""
    bias = control_bias(control)
    return 1.0 if bias is None else bias


@dataclass
class Fallback:
    kind: str  # fallback_candidate | reference
    floor: float
    row: Row | None = None
    speedup: float = 1.0
    ci95: list | None = None
    confirmed: bool = False

    def to_json(self, path: Path) -> dict:
        return {"kind": self.kind, "path": str(path), "speedup": self.speedup, "ci95": self.ci95,
                "candidate": self.row.id if self.row else None, "confirmed": self.confirmed,
                "techniques": techniques(self.row.source, self.row.meta) if self.row else [], "floor": self.floor}


def _qualifies(m: dict | None, floor_: float) -> bool:
    return bool(m) and m["status"] == "correct" and bool(m["speedup"]) and m["ci_low"] is not None \
        and m["ci_low"] >= floor_


def choose(usable: list[Row], confirmations: dict, *, bar: float, floor_: float, confirm: int,
           confirm_one: Callable[[Row], dict]) -> Fallback:
    """The fallback among `usable` (correct candidates that load the reference's weights), or the reference.

    A candidate's measurement is its confirmation where the run confirms (`confirm` > 0; an unconfirmed candidate
    does not qualify), else its search measurement. It qualifies when correct with its CI's lower end at or above
    `floor_`; the one with the highest lower end wins (then the higher speedup, then the lower id). Where the run
    confirms, candidates whose search CI's lower end lies in [floor_, bar] (not leaders: those had their own
    confirmations) are confirmed, highest lower end first, until one confirmation qualifies or `confirm` of them
    have one, earlier invocations' counted (a re-run with nothing new to judge confirms nothing new)."""
    confs = dict(confirmations)
    if confirm:
        between = [r for r in usable if r.ci_low is not None and floor_ <= r.ci_low <= bar]
        todo = sorted((r for r in between if r.id not in confs), key=lambda r: (-r.ci_low, -r.speedup, r.id))
        for r in todo[:max(0, confirm - sum(x.id in confs for x in between))]:
            if any(_qualifies(confs.get(x.id), floor_) for x in usable):
                break
            confs[r.id] = confirm_one(r)
        measured = {r.id: confs[r.id] for r in usable if r.id in confs}
    else:
        measured = {r.id: {"status": r.status, "speedup": r.speedup, "ci_low": r.ci_low, "ci_high": r.ci_high}
                    for r in usable}
    ok = [(r, measured[r.id]) for r in usable if _qualifies(measured.get(r.id), floor_)]
    if not ok:
        return Fallback("reference", floor_)
    r, m = max(ok, key=lambda x: (x[1]["ci_low"], x[1]["speedup"], -x[0].id))
    return Fallback("fallback_candidate", floor_, r, m["speedup"], [m["ci_low"], m["ci_high"]], bool(confirm))


def reference_program(task_source: str) -> str:
    """The reference as a standalone drop-in candidate: the task's source without its input functions (inputs
    come from the task), and `class ModelNew(Model)`: the same parameters, so the reference's weights load."""
    try:
        ref, _ = reference_parts(task_source)
    except SyntaxError:
        ref = task_source.rstrip() + "\n"
    return (ref + "\n\nclass ModelNew(Model):\n"
            '    """The reference model itself, unchanged: kernelcraft optimize\'s fallback."""\n')


def program(fb: Fallback, task, *, status: str, bar: float, mode: str) -> str:
    """best.py for a fallback: a comment header saying what it is, then the program."""
    head = ["# kernelcraft optimize fallback: no candidate was verified faster than the reference.",
            f"# Task {task.name}; run status {status}; verified faster means a 95% CI lower end above {bar:.2f}x."]
    if fb.kind == "reference":
        head += ["# This file is the reference itself as a drop-in ModelNew (the task's Model unchanged, its input",
                 "# functions left out): speedup 1.00x by definition."]
        if mode == "strict":
            head.append("# Under --mode strict the judge does not accept it: it runs no kernel of its own.")
        body = reference_program(task.source)
    else:
        lo, hi = fb.ci95
        head += [f"# This file is candidate #{fb.row.id}, unchanged below this header: correct, {fb.speedup:.2f}x "
                 f"(95% CI {lo:.2f}-{hi:.2f}{', confirmed in a fresh worker' if fb.confirmed else ''}),",
                 f"# the highest CI lower end at or above {fb.floor:.2f}x: no slower than the reference with "
                 "confidence."]
        body = fb.row.source
    return "\n".join(head) + "\n\n" + body


RULE = ("the correct candidate that loads the reference's weights with the highest 95% CI lower end at or above "
        "the floor (1.00x, or the null control's speedup where the control's CI lies wholly above 1), measured by its "
        "confirmation where the run confirms; else the reference itself, 1.00x by definition")


def describe(fb: dict) -> str:
    """What a fallback best.py holds, in words (`Result.fallback`)."""
    if fb["kind"] == "reference":
        return "best.py is the reference itself as a drop-in ModelNew (1.00x by definition), not an optimisation"
    lo, hi = fb["ci95"]
    return (f"best.py is candidate #{fb['candidate']}, correct and no slower than the reference with confidence: "
            f"{fb['speedup']:.2f}x (95% CI {lo:.2f}–{hi:.2f}{', confirmed in a fresh worker' if fb['confirmed'] else ''}"
            f"; the lower end at or above {fb['floor']:.2f}x), not verified faster — "
            + (", ".join(fb.get("techniques") or []) or "no named technique"))


def write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
