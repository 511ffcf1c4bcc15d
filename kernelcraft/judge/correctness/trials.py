"""The correctness trials of one evaluation (`worker.Evaluation`): fresh draws, partial-change trials, the rule.

Each fresh trial draws fresh inputs, poisons the output arenas, takes the float64 truth where the rule wants it,
runs both sides in alternating order and judges the outputs: the fixed comparison, then the calibrated rule. A
repeated answer where the reference's moved is `stale_output`. `run_trials` returns the `Acceptance` every later
output is held to.

Rationale: docs/design/judge-correctness.md#trials
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from kernelcraft.judge.correctness import partial, precision
from kernelcraft.judge.tripwires import calls as tripwires
from kernelcraft.judge.correctness.acceptance import Acceptance
from kernelcraft.judge.process.arena import total_bytes
from kernelcraft.judge.correctness.compare import any_finite, compare_outputs, is_oom
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.sideproc import RUN

# the previous trial's candidate output is kept up to this size (docs/design/judge-process.md#worker)
STALE_KEEP_BYTES = 1 << 30


def run_trials(ev) -> Acceptance:
    """The trials of `ev` (a `worker.Evaluation`); raises `Reject` with the first failure. Returns what they
    accepted (`acceptance`): the rule every later output of this evaluation is held to."""
    p = ev.p
    trials = p.trials
    passed, max_abs, max_rel, atol, rtol = 0, 0.0, 0.0, None, None
    prev = getattr(ev, "first_out", None)  # the candidate's unjudged first answer (`Evaluation.first_call`)
    prev_ref = None  # the reference's answer to the inputs a partial trial changes (kept only before one)
    rule = precision.Rule(p.model_dump(), ev.out_specs, ev.device, ev.ref,  # calibrated or fixed
                          on_host=getattr(ev, "copy_device", None) is not None,
                          tf32_convolutions=getattr(ev, "tf32_convolutions", False))
    shares = [None] * trials + partial.shares(p.partial_trials)  # None: a fresh draw
    partials = {"partial_trials": 0, "partial_skipped": 0}
    for t, share in enumerate(shares):
        if share is None:
            ev.redraw()
            when = f"trial {t + 1} of {trials}"
        else:  # the previous inputs, a few elements changed, at the same addresses: partial-key caches
            try:
                mixed, changed = partial.mix(ev.current, ev._draw(), share, ev.rng.getrandbits(63))
            except Exception as e:  # noqa: BLE001 - no room for a second draw and a mix beside the judge's first
                if not (is_oom(e) or (isinstance(e, Reject) and "harness_error" in e.reasons)):
                    raise
                partials["partial_skipped"] += 1
                rule.note("a partial trial was skipped: no device memory for a second draw of the inputs")
                continue
            ev._write_inputs(mixed)
            when = f"partial trial {t + 1 - trials} (inputs equal to trial {t}'s but {changed} elements)"
        ev._poison()
        if ev.large_outputs:  # the reference's float64 call needs room more than the judge's cache does
            torch.cuda.empty_cache()
        truth = rule.truth() if share is None and rule.wants_truth() else None  # (precision: which trials)
        first, second = (ev.ref, ev.cand) if t % 2 == 0 or share is not None else (ev.cand, ev.ref)
        replies, stage = {}, ""
        try:
            for s in (first, second):
                stage = s.role
                replies[s.role] = s.request(RUN, phase="check")
                if ev.device.type == "cuda":
                    torch.cuda.synchronize()
            stage = "outputs"
            ref_out, cand_out, moved = ev._trial_outputs(replies)  # the candidate's copied before it runs again
            ev.audit_checked_call(ev.cand, "check", compared=False)
            ev._check_mutation(when)
            stage = "sane"
            _reference_sane(ref_out)
        except Reject:  # a mixed input the reference itself cannot take is skipped, never charged
            if share is None or stage not in ("reference", "sane"):
                raise
            partials["partial_skipped"] += 1
            continue
        if moved:  # the judge's copies went to host memory: so do the answers it keeps
            prev, prev_ref = _tensors(prev, torch.Tensor.cpu), _tensors(prev_ref, torch.Tensor.cpu)
        cmp = compare_outputs(ref_out, cand_out, p.atol, p.rtol, on=ev.device)
        cmp = rule.trial(ref_out, cand_out, truth, cmp, p.atol, p.rtol)
        if cmp.ok and share is not None and prev is not None and prev_ref is not None \
                and tripwires.same_values(prev, cand_out) and not compare_outputs(prev_ref, ref_out, on=ev.device).ok:
            raise Reject("incorrect", ["stale_output"], f"{when}: the candidate returned its previous answer bit for "
                         "bit while the reference's changed (a cache keyed on part of the input)")
        max_abs, max_rel = max(max_abs, cmp.max_abs_err), max(max_rel, cmp.max_rel_err)
        atol, rtol = cmp.atol if cmp.atol is not None else atol, cmp.rtol if cmp.rtol is not None else rtol
        ev.result["correctness"] = dict(trials=trials, passed=passed, max_abs_err=max_abs,
                                          max_rel_err=max_rel, atol=atol, rtol=rtol, **rule.record(), **partials)
        if not cmp.ok:
            if prev is not None and "value_mismatch" in cmp.reasons and tripwires.same_values(prev, cand_out):
                raise Reject("incorrect", ["stale_output"], f"{when}: the candidate returned the "
                             "previous trial's output for new inputs (a cached answer)")
            raise Reject("incorrect", cmp.reasons, f"{when}: {cmp.message}")
        ev.audit_checked_call(ev.cand, "check", compared=True)
        if ev.large_outputs:  # both sides' cached blocks back to the device before the next float64 call
            for s in (ev.ref, ev.cand):
                s.request({"cmd": "trim"}, phase="check")
        if share is None:
            passed += 1
        else:
            partials["partial_trials"] += 1
        ev.result["correctness"].update(passed=passed, **partials)
        # kept only as a copy: a large output read in place (`Evaluation.in_place`) is poisoned by the next trial
        prev = cand_out if keeps_answers(ev) else None
        before_partial = prev is not None and t + 1 < len(shares) and shares[t + 1] is not None
        prev_ref = _tensors(ref_out, torch.Tensor.clone) if before_partial else None  # (a view of its arena)
        ref_out = cand_out = None
    final = rule.final()
    ev.result["correctness"].update(rule.record())
    if not final.ok:
        raise Reject("incorrect", final.reasons, f"over {trials + partials['partial_trials']} trials: "
                     + final.message)
    rule.release()
    accepted = rule.acceptance(p.atol, p.rtol)
    if ev.guarded:
        ev.result["guards"] += ["process_state", "threads", "output_snapshot"]
    if p.mode == "strict":
        ev.result["guards"].append("own_kernel")
        ev.redraw()
        ev.cand.request(dict(cmd="own_kernel", kernel_names=ev.job.get("kernel_names") or []),
                          phase="check")
    return accepted


def _tensors(out, fn):
    """`out` (a tensor, a tuple/list of them, None) with `fn` applied to each tensor in it."""
    return tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, out)


def keeps_answers(ev) -> bool:
    """Whether the judge keeps a copy of the candidate's last answer, to name a repeat of it `stale_output`: up to
    `STALE_KEEP_BYTES`, never a large output read in place (poisoned by the next trial;
    docs/design/judge-process.md#worker)."""
    return not ev.large_outputs and total_bytes(ev.out_specs) <= STALE_KEEP_BYTES


def _reference_sane(ref_out) -> None:
    """An all-NaN/Inf reference output leaves nothing to compare: the task (or its inputs) is broken."""
    for r in ([ref_out] if isinstance(ref_out, torch.Tensor) else ref_out):
        if isinstance(r, torch.Tensor) and r.is_floating_point() and r.numel() and not any_finite(r):
            raise Reject("runtime_error", ["task_error"], "the reference's output is NaN/Inf everywhere: "
                         "there is nothing to compare a candidate against")
