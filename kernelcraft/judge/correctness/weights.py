"""Weights are inputs: a candidate computes from its parameters and buffers as they are at call time.

Where the reference has weights the judge moves, the candidate must be a drop-in (a strict `load_state_dict` of the
reference's state_dict) or it is `incorrect` / `weights_mismatch`; a trial with new weights (`weightdraw`) in both
models must pass (`weights_ignored` otherwise), in every candidate process. The judge's own draw never charges the
candidate (a reference made non-finite: skipped). The module mode is recorded here (`record_mode`); the sides apply
and verify it (`modelstate`).

Rationale: docs/design/judge-correctness.md#weights
"""
from __future__ import annotations

import torch

from kernelcraft.judge.process.arena import Arena, TensorSpec
from kernelcraft.judge.correctness.acceptance import Acceptance
from kernelcraft.judge.correctness.weightdraw import excess, moves, perturbed
from kernelcraft.judge.reject import Reject

MAX_LISTED = 8  # mismatching keys in the record
MAX_NAMED = 4  # ... and in the message
CLEAR_MARGIN = 10.0  # the new weights should move the reference's output by this many times the trial's tolerance


# -- the judge ------------------------------------------------------------------------------------------------------
def record_mode(ev, replies: dict[str, dict]) -> None:
    """The module mode in the judge's record, with what each side's construction left (before it was set)."""
    ev.result["module_mode"] = {"mode": ev.p.module_mode,
                                "reference_init": replies["reference"].get("init_mode"),
                                "candidate_init": replies["candidate"].get("init_mode")}
    ev.result["guards"].append("module_mode")


def _entries(reply: dict) -> list[dict] | None:
    got = reply.get("entries")
    if not isinstance(got, list):
        return None
    out = []
    for e in got:
        if not (isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("shape"), list)
                and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in e["shape"])):
            return None
        out.append(e)
    return out


def match(ref: list[dict], cand: list[dict] | None, problem: str = "") -> list[str]:
    """What keeps the candidate's state from taking the reference's (strict): missing, unexpected and reshaped
    keys."""
    if cand is None:
        return ["the candidate's state_dict could not be read" + (f" ({problem})" if problem else "")]
    want = {e["key"]: tuple(e["shape"]) for e in ref}
    have = {e["key"]: tuple(e["shape"]) for e in cand}
    out = [f"missing {k}" for k in want if k not in have]
    out += [f"unexpected {k}" for k in have if k not in want]
    out += [f"{k}: shape {list(have[k])}, the reference's {list(want[k])}" for k in want
            if k in have and have[k] != want[k]]
    return out


def _contiguous(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))


# -- the check ----------------------------------------------------------------------------------------------------
def _record(ev) -> dict:
    rec = ev.result.get("weights")
    if rec is None:
        rec = ev.result["weights"] = {"checked": False, "matched": None, "tensors": 0, "perturbed": 0,
                                      "changed_output": None, "output_change": None, "processes": 0,
                                      "mismatch": [], "note": ""}
    return rec


def _reference_state(ev, rec: dict, phase: str) -> list[dict] | None:
    """The reference's state_dict entries (listed once per evaluation), or None, noted, where it has none."""
    if not hasattr(ev, "weight_entries"):
        got = ev.ref.request({"cmd": "state"}, phase=phase)
        ref = _entries(got)
        ev.weight_entries = ref or None
        if not ref:
            rec["note"] = got.get("problem") or ("the reference has no parameters or buffers" if ref == [] else
                                                 "the reference's state_dict could not be listed")
    if ev.weight_entries:
        rec["tensors"] = len(ev.weight_entries)
    return ev.weight_entries


_DROP_IN = ("a drop-in must load the reference's state_dict (ModelNew.load_state_dict(Model.state_dict(), "
            "strict=True)): the reference's parameter and buffer names and shapes, derived tensors kept out of it "
            "(plain attributes, or register_buffer(..., persistent=False))")


def _drop_in(ev, side, ref: list[dict], rec: dict, phase: str, who: str) -> bool:
    """True when `side`'s state_dict has the reference's keys and shapes. Else `weights_mismatch` where the
    reference has values to move; only recorded (`matched` False) where it has nothing but constant buffers."""
    got = side.request({"cmd": "state"}, phase=phase)
    mismatch = match(ref, _entries(got), str(got.get("problem") or ""))
    if not mismatch:
        return True
    rec.update(matched=False, mismatch=mismatch[:MAX_LISTED])
    if any(moves(e) for e in ref):
        named = ", ".join(mismatch[:MAX_NAMED]) + (f" (and {len(mismatch) - MAX_NAMED} more)"
                                                   if len(mismatch) > MAX_NAMED else "")
        raise Reject("incorrect", ["weights_mismatch"],
                     f"{who}ModelNew's state_dict cannot take the reference's: {named}; {_DROP_IN}")
    rec["note"] = (f"{len(mismatch)} difference(s) between the candidate's state_dict and the reference's, which "
                   "holds only constant buffers: not a drop-in for it, and no weights to check")
    return False


def require_drop_in(ev) -> None:
    """After the correctness trials, before timing, in the candidate's first process: its state_dict must take the
    reference's (`weights_mismatch` otherwise: a candidate that cannot load new weights is not timed)."""
    rec = _record(ev)
    ref = _reference_state(ev, rec, "check")
    if ref is not None:
        _drop_in(ev, ev.cand, ref, rec, "check", "")


def check(ev, accepted: Acceptance) -> None:
    """After timing, in the candidate's first process (`ev`: the judge's `worker.Evaluation`): the drop-in rule
    again, then the same new weights into both models and one more trial. Records `weights`; raises
    `weights_mismatch` or `weights_ignored`. The reference keeps the new weights (a warm one is reset)."""
    rec = _record(ev)
    ref = _reference_state(ev, rec, "check")
    if ref is None or not _drop_in(ev, ev.cand, ref, rec, "check", ""):
        return
    ev.fresh_state((ev.ref, ev.cand), "check")  # a stateful task: after timing the sides' states differ
    if _trial(ev, ev.cand, ref, rec, "check", "", accepted):
        ev.result["guards"].append("weights_as_inputs")


def check_process(ev, side, who: str, accepted: Acceptance) -> None:
    """Another candidate process (`siblings.start`), before it is timed: the same drop-in rule and trial as the
    first process's, then both models back on their construction weights (the reference is timed with every
    process, and the first process still has its own). Counted in `weights.processes`."""
    rec = _record(ev)
    ref = _reference_state(ev, rec, "time")
    if ref is None or not _drop_in(ev, side, ref, rec, "time", who):
        return
    ev.fresh_state((ev.ref, side), "time")
    trial: dict = {}  # the record is the first process's (after timing); a failure here is the verdict's
    try:
        if _trial(ev, side, ref, trial, "time", who, accepted, restore=True):
            rec["processes"] += 1
    except Reject:
        rec.update(trial)
        raise


def _trial(ev, side, ref: list[dict], rec: dict, phase: str, who: str, accepted: Acceptance,
           restore: bool = False) -> bool:
    """The trial with new weights for candidate process `side`; True when it ran and passed, False when the judge's
    own draw or the reference could not be used (noted; both models back on the old weights). Raises
    `weights_mismatch` (the candidate's load_state_dict failed) or `weights_ignored`."""
    keys = [e["key"] for e in ref]
    specs = [TensorSpec(tuple(e["shape"]), _contiguous(e["shape"]), str(e.get("dtype", "float32"))) for e in ref]
    arenas = {"reference": Arena(specs, ev.device), "candidate": Arena(specs, ev.device)}
    desc, fds = arenas["reference"].handle()
    ev.ref.request(dict(cmd="dump_state", arena=desc, keys=keys), fds, phase=phase)
    original = [t.clone() for t in arenas["reference"].tensors]
    new, rec["perturbed"] = perturbed(original, ref)

    # the reference's output with its own weights, on a fresh draw the candidate never runs on before the trial
    ev.redraw()
    ev._poison()
    r0 = ev._output("reference", ev.ref.request({"cmd": "run", "keep_state": True},  # not a paired call:
                                                phase=phase).get("values", []), copy=True)  # state kept
    failed, error = _load(ev, side, arenas, keys, new, phase)
    if failed == "candidate":
        rec["matched"] = False
        raise Reject("incorrect", ["weights_mismatch"], f"{who}ModelNew.load_state_dict(the reference's state_dict, "
                     f"strict=True) failed: {error[:300]}; {_DROP_IN}")
    if failed == "reference":  # its side kept the old weights; the candidate goes back to them too
        _restore(ev, side, arenas, keys, original, phase, who, reference=False)
        rec["note"] = "the reference's load_state_dict failed: " + error[:300]
        return False
    rec["matched"] = True
    ev._write_inputs(ev.current)  # the same draw again: a reference that works in place changed its copy
    ev._poison()
    order = [ev.ref, side] if ev.rng.random() < 0.5 else [side, ev.ref]
    replies = {}
    for s in order:
        replies[s.role] = s.request({"cmd": "run"}, phase=phase)  # (`sideproc.RUN`)
        if ev.device.type == "cuda":
            torch.cuda.synchronize()
    copy = not ev.in_place()  # a large output is read in its arena once the device is idle (judge/process/worker.py)
    r1 = ev._output("reference", replies["reference"].get("values", []), copy=copy)
    c1 = ev._output("candidate", list(replies["candidate"].get("values", [])), copy=copy)
    ev._check_mutation(f"{who}the weights trial")
    p = ev.p
    if _newly_nonfinite(r0, r1):
        rec["note"] = "the new weights made the reference's output non-finite; the old weights were restored"
        _restore(ev, side, arenas, keys, original, phase, who)
        return False
    rec["checked"] = True
    # the rule the trials accepted (`acceptance`: calibrated outputs relative to their scale, widened to the
    # reference's own error, e.g. cuDNN's TF32 convolutions), never the bare fixed bound, which on an H100 reads an
    # honest channels-last conv as `weights_ignored` (1.9e-4 > 1e-4 after new weights)
    rec["changed_output"] = not accepted.compare(r0, r1, on=ev.device).ok
    moved = excess(r0, r1, accepted, on=ev.device)
    rec["output_change"] = None if moved is None else float(f"{moved:.3g}")
    if not rec["changed_output"]:
        rec["note"] = ("the new weights did not change the reference's output beyond the trial's tolerance: this "
                       "trial cannot tell a candidate that ignores its weights")
    elif moved is not None and moved < CLEAR_MARGIN:
        rec["note"] = (f"the new weights moved the reference's output by only {moved:.3g}x the trial's tolerance "
                       f"(a clear margin is {CLEAR_MARGIN:g}x): a candidate that ignores its weights fails by no more")
    cmp = accepted.compare(r1, c1, on=ev.device)
    if not cmp.ok:
        if not rec["changed_output"]:  # the new weights changed nothing: this is a plain wrong answer
            raise Reject("incorrect", cmp.reasons, f"{who}trial {p.trials + 1} (after new weights): {cmp.message}")
        follows_old = accepted.compare(r0, c1, on=ev.device).ok
        why = ("its outputs are those of the weights it was constructed with (a copy taken at construction?)"
               if follows_old else "its outputs were right only for the weights it was constructed with")
        raise Reject("incorrect", ["weights_ignored"], f"{who}after both models loaded the same new weights "
                     f"(load_state_dict), {why}: {cmp.message}")
    if restore:
        _restore(ev, side, arenas, keys, original, phase, who)
    return True


def _newly_nonfinite(old, new) -> bool:
    pairs = [(old, new)] if isinstance(old, torch.Tensor) else list(zip(old, new))
    return any(isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == b.shape
               and bool((torch.isfinite(a) & ~torch.isfinite(b)).any()) for a, b in pairs)


def _load(ev, side, arenas: dict[str, Arena], keys: list[str], values: list[torch.Tensor], phase: str,
          reference: bool = True) -> tuple[str, str]:
    """Both models (the candidate's process `side` only, without `reference`) load `values`, the candidate first:
    ("", "") or the side that could not and its error (a side that fails keeps its previous weights)."""
    for role in ("candidate", "reference"):
        for buf, v in zip(arenas[role].tensors, values):
            buf.copy_(v)
    if ev.device.type == "cuda":
        torch.cuda.synchronize()
    desc, fds = arenas["candidate"].handle()
    got = side.request(dict(cmd="load_state", arena=desc, keys=keys), fds, phase=phase)
    if not got.get("loaded"):
        return "candidate", str(got.get("error", ""))
    if not reference:
        return "", ""
    got = ev.ref.request(dict(cmd="load_state", keys=keys), phase=phase)
    if not got.get("loaded"):
        return "reference", str(got.get("error", ""))
    return "", ""


def _restore(ev, side, arenas, keys, original, phase: str, who: str, reference: bool = True) -> None:
    """Both models (or the candidate's only) back on the weights they were constructed with; a candidate that
    cannot load them fails."""
    failed, error = _load(ev, side, arenas, keys, original, phase, reference)
    if failed == "candidate":
        raise Reject("incorrect", ["weights_mismatch"], f"{who}ModelNew.load_state_dict of the weights it was "
                     f"built with failed after it had loaded others: {error[:300]}; {_DROP_IN}")
    if failed == "reference":
        raise Reject("runtime_error", ["task_error"], "the reference's load_state_dict of its own construction "
                     f"weights failed: {error[:300]}")
