"""Precision judged against ground truth: the calibrated rule, the judge's end.

Per floating output, pooled over the trials with float64 truth t: RMS(c - t) <= F * RMS(r - t) + floor and
max(|c - t| - 256u|t|) <= 2F * max|r - t| + floor (F = `Protocol.precision_factor`; arithmetic in `bounds`).
Missing both this and the fixed tolerance fails a trial as `value_mismatch`; missing this alone, pooled, is
`precision_downgrade`. Where truth cannot be had the fixed rule judges and `rule_note` says why. Outputs judged
without truth are held to the `acceptance.Acceptance` made here (`Rule.acceptance`).

Rationale: docs/design/judge-correctness.md#precision
"""
from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass, field

import torch

from kernelcraft.judge.correctness.acceptance import MARGIN, SCALE_FLOOR, Acceptance, Bound
from kernelcraft.judge.process.arena import Arena, TensorSpec
from kernelcraft.judge.correctness.compare import (Comparison, as_tensor_list, chunks, compare_outputs, default_tolerance,
                                       is_oom, with_retries)
from kernelcraft.judge.correctness.bounds import (CAP, ENVELOPE_EXPLAINS, FLOOR_ULPS, MAX_FACTOR, MEANINGFUL,  # noqa: F401
                                      SEPARATION, SMALL_N, TOWARDS_BF16_TEXT, UNVERIFIABLE, Output, unit_roundoff)
from kernelcraft.judge.correctness.fp64 import picked

TF32_FIXED = 4 * 2.0 ** -10  # the fixed bound (atol and rtol) of a TF32 reference judged without truth: 4 TF32 ulps
TRUTH_TRIALS = 2  # fresh trials that always get the float64 truth (docs/design/judge-correctness.md#precision) ...
TRUTH_ELEMENTS = 1 << 22  # ... and more until each calibrated output pooled this many elements
# elements of an output pooled per trial at most: a strided sample beyond (docs/design/judge-correctness.md#precision)
TRUTH_SAMPLE = 1 << 25
TRUTH_SAMPLE_VAR = "KERNELCRAFT_JUDGE_TRUTH_SAMPLE"  # overrides it (tests sample small outputs)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def truth_sample() -> int:
    return max(1, int(os.environ.get(TRUTH_SAMPLE_VAR) or TRUTH_SAMPLE))


@dataclass
class Rule:
    """The judge's end of the precision rule for one evaluation (docs/design/judge-correctness.md#precision)."""
    protocol: dict
    out_specs: list
    device: torch.device
    reference: object  # judge.sideproc.SideProc of the reference (request(msg, fds, phase=...))
    outputs: list[Output] = field(default_factory=list)
    arena: Arena | None = None
    notes: list[str] = field(default_factory=list)
    on_host: bool = False  # the float64 arena in host memory first (a large task: `worker.Evaluation._place_copies`)
    tf32_convolutions: bool = False  # the reference's convolutions may run in TF32 (`side.cmd_describe`)

    def __post_init__(self):
        self.picks: list = []  # this trial's sample of each output (`pick`), set by `truth`
        self.truth_trials = 0  # trials that asked for the float64 truth
        self.kind = self.protocol.get("precision", "calibrated")
        self.factor = float(self.protocol.get("precision_factor", 6.0))
        for spec in self.out_specs:
            if spec is None:
                self.outputs.append(Output(None, "value"))
                continue
            dt = spec.torch_dtype
            if not (dt.is_floating_point or dt.is_complex):
                mode = "exact"
            elif self.kind == "calibrated" and dt in _FLOATS:
                mode = "calibrated"
            else:
                mode = "fixed"
            self.outputs.append(Output(spec, mode, dtype=dt if dt in _FLOATS else torch.float32))
        if self.kind == "calibrated" and any(o.mode == "fixed" for o in self.outputs):
            self._note("float64/complex outputs: judged by the fixed rule (no higher precision to compare with)")

    # -- ground truth -----------------------------------------------------------------------------------------
    @property
    def calibrating(self) -> bool:
        return any(o.mode == "calibrated" for o in self.outputs)

    def note(self, text: str) -> None:
        """A remark for the verdict's `rule_note` (the judge's, e.g. a skipped partial trial)."""
        self._note(text)

    def _note(self, text: str) -> None:
        if text and text not in self.notes:
            self.notes.append(text)

    def _fallback(self, outs: list[Output], note: str) -> None:
        tf32 = False
        for o in outs:
            if o.mode == "calibrated":
                o.mode, o.note = "fixed", note
                o.tf32 = self._tf32_exposed(o)
                tf32 = tf32 or o.tf32
        self._note(note + ": judged by the fixed rule" + (
            f" (its convolutions may run in TF32, cuDNN's default: within {TF32_FIXED:g} where 1e-4 is missed)"
            if tf32 else ""))

    def _tf32_exposed(self, o: Output) -> bool:
        """An fp32 output of a reference whose convolutions may run in TF32 (`side.cmd_describe`)."""
        return self.tf32_convolutions and o.dtype == torch.float32

    def _tf32_tolerance(self, atol, rtol) -> tuple[float, float]:
        """The fixed bound widened to TF32's (`TF32_FIXED`), for a TF32 reference judged without truth."""
        return max(TF32_FIXED, atol if atol is not None else 0.0), max(TF32_FIXED, rtol if rtol is not None else 0.0)

    def wants_truth(self) -> bool:
        """Whether the next fresh trial needs the float64 truth: the first `TRUTH_TRIALS`, then until every
        calibrated output pooled `TRUTH_ELEMENTS` (docs/design/judge-correctness.md#precision)."""
        return self.calibrating and (self.truth_trials < TRUTH_TRIALS or any(
            o.n < TRUTH_ELEMENTS for o in self.outputs if o.mode == "calibrated"))

    def truth(self) -> list | None:
        """The reference's float64 outputs for the inputs now in the arenas (views of the judge's arena, None
        where there is none), or None when nothing is calibrated. Asked before either side runs the trial.
        An output without float64 this time is judged by the fixed rule from now on."""
        if not self.calibrating:
            return None
        self.truth_trials += 1
        self.picks = [pick(o.spec.numel) if o.mode == "calibrated" else None for o in self.outputs]
        envelope = not any(o.n_e for o in self.outputs if o.mode == "calibrated")  # one trial's is enough
        msg, fds = {"cmd": "fp64", "picks": self.picks, "envelope": envelope}, []
        if self.arena is None:
            specs = [None if o.mode != "calibrated" else
                     TensorSpec((p["size"],), (1,), "float64") if p is not None else
                     TensorSpec(o.spec.shape, _contiguous(o.spec.shape), "float64")
                     for o, p in zip(self.outputs, self.picks)]
            if any(p is not None for p in self.picks):
                n = truth_sample()
                self._note(f"outputs above {n} elements: the float64 truth pools a strided sample of {n} elements "
                           "per trial, from a secret start")
            places = [self.device, torch.device("cpu")] if self.device.type != "cpu" else [self.device]
            for dev in (places[::-1] if self.on_host else places):
                try:
                    self.arena = Arena(specs, dev)
                    break
                except Exception as e:  # noqa: BLE001 - the judge's memory, never the candidate's fault
                    if not (is_oom(e) or isinstance(e, OSError)):
                        raise
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
            if self.arena is None:
                self._fallback(self.outputs, "no memory for the float64 reference's outputs")
                return None
            desc, fds = self.arena.handle()
            msg["arena"] = desc
        self.arena.base.fill_(255)  # NaN: a float64 value never written is never taken for truth
        got = self.reference.request(msg, fds, phase="check")
        avail = got.get("available") or [False] * len(self.outputs)
        self._envelope(got.get("envelope"))
        self._envelope(got.get("coarse"), coarse=True)
        draws = got.get("random")
        if isinstance(draws, int) and not isinstance(draws, bool) and draws > 0:
            for o in self.outputs:
                o.random += draws
        lost = [o for o, ok in zip(self.outputs, avail) if o.mode == "calibrated" and not ok]
        if lost:
            self._fallback(lost, str(got.get("note") or "no float64 value for this output")[:300])
        return [t if (o.mode == "calibrated" and ok) else None
                for t, o, ok in zip(self.arena.tensors, self.outputs, avail)]

    def _envelope(self, env, coarse: bool = False) -> None:
        """Pool the reference side's default-precision envelope (`fp64`), numbers only, per calibrated output; the
        bf16 one's RMS with `coarse`."""
        if not isinstance(env, list):
            return
        for o, e in zip(self.outputs, env):
            if o.mode != "calibrated" or not isinstance(e, dict):
                continue
            try:
                sq, mx, n = float(e["sq"]), float(e["max"]), int(e["n"])
            except (KeyError, TypeError, ValueError):
                continue
            if not (n > 0 and math.isfinite(sq) and math.isfinite(mx) and sq >= 0 and mx >= 0):
                continue
            if coarse:
                o.sq_b, o.n_b = o.sq_b + sq, o.n_b + n
            else:
                o.sq_e, o.max_e, o.n_e = o.sq_e + sq, max(o.max_e, mx), o.n_e + n

    def release(self) -> None:
        """After the correctness trials: the reference's side and the judge drop the float64 arena."""
        if self.arena is not None:
            self.reference.request({"cmd": "fp64", "release": True}, phase="check")
            self.arena = None

    # -- judging ----------------------------------------------------------------------------------------------
    def trial(self, ref_out, cand_out, truth: list | None, cmp: Comparison, atol, rtol) -> Comparison:
        """The trial's verdict under the rule, given the fixed comparison `cmp` of the same outputs."""
        if self.kind == "fixed" or (not cmp.ok and cmp.reasons != ["value_mismatch"]):
            return cmp
        refs, cands = as_tensor_list(ref_out), as_tensor_list(cand_out)
        out = Comparison(max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err, atol=cmp.atol, rtol=cmp.rtol)
        for i, (o, r, c) in enumerate(zip(self.outputs, refs, cands)):
            where = f"output {i}: " if len(refs) > 1 else ""
            if o.mode == "value":
                if not cmp.ok and r != c:
                    return out.fail("value_mismatch", f"{where}expected {r!r}, got {c!r}")
                continue
            fixed = cmp if cmp.ok else compare_outputs(r, c, atol, rtol, on=self.device)
            have = truth is not None and truth[i] is not None
            if o.mode == "calibrated" and have:
                p = self.picks[i] if i < len(self.picks) else None
                self._pool(o, picked(r, p), picked(c, p), truth[i])
                why = o.uncalibratable(self.factor)
                if why:
                    self._fallback([o], where + why)
                    o.unverifiable = True
                elif o.noisy():
                    self._note(f"{where}the reference's own error (over {CAP:g} of the output's RMS) is its "
                               "convolutions' TF32 (cuDNN's default): calibrated by the TF32 envelope, the RMS bound "
                               f"at most {TOWARDS_BF16_TEXT} of the way to bf16's")
            if o.mode == "calibrated" and o.n and not have:  # held to what the trials with truth accepted
                o.fixed_missed += 0 if fixed.ok else 1
                b = self.bound(o, atol, rtol)
                wide = compare_outputs(r, c, b.atol, b.rtol, on=self.device, relative=b.relative())
                if wide.ok:
                    continue
                return out.fail(wide.reasons[0], where + wide.message + " (a trial without float64 truth: "
                                f"{ACCEPTED_TEXT})")
            if fixed.ok:
                continue
            if o.mode == "calibrated" and have:
                o.fixed_missed += 1
                if o.passes(self.factor):
                    continue  # beyond the fixed tolerance, within the reference's own precision
                return out.fail("value_mismatch", where + fixed.message + "; " + o.describe(self.factor, ""))
            if o.tf32:
                wide = compare_outputs(r, c, *self._tf32_tolerance(atol, rtol), on=self.device)
                if wide.ok:
                    continue  # another cuDNN algorithm (TF32 or not) than the reference's, judged without truth
                fixed = wide  # the message, and the record's atol/rtol, give the bound that judged
                out.atol, out.rtol = wide.atol, wide.rtol
            if not o.unverifiable:
                return out.fail(fixed.reasons[0], where + fixed.message)
            out.fail(fixed.reasons[0], f"{where}{fixed.message}; judged by the fixed rule because {o.note}")
            return out.fail(UNVERIFIABLE, "")
        return out

    def final(self) -> Comparison:
        """After every trial: the pooled calibrated bound of each output."""
        res = Comparison()
        for i, o in enumerate(self.outputs):
            if o.mode == "calibrated" and o.n and not o.passes(self.factor):
                where = f"output {i}: " if len(self.outputs) > 1 else ""
                return res.fail("value_mismatch" if o.fixed_missed else "precision_downgrade",
                                o.describe(self.factor, where))
        return res

    def _pool(self, o: Output, r: torch.Tensor, c: torch.Tensor, t: torch.Tensor) -> None:
        slack = FLOOR_ULPS * unit_roundoff(o.dtype)

        def run(chunk, dev):  # sums and maxima stay on the device until the pass ends: one sync, not one per chunk
            n = torch.zeros(2, dtype=torch.int64, device=dev)  # finite, informative
            sums = torch.zeros(3, dtype=torch.float64, device=dev)  # sq_t, sq_r, sq_c
            maxima = torch.zeros(2, dtype=torch.float64, device=dev)  # max_r, max_c
            for r64, c64, t64 in chunks([r, c, t], chunk, dev):
                ok = torch.isfinite(r64) & torch.isfinite(c64) & torch.isfinite(t64)
                t0 = torch.where(ok, t64, 0.0)
                er = torch.where(ok, r64 - t0, 0.0)
                ec = torch.where(ok, c64 - t0, 0.0)
                n += torch.stack([ok.sum(), (ok & ((t0 != 0) | (er != 0) | (ec != 0))).sum()])
                sums += torch.stack([t0.pow(2).sum(), er.pow(2).sum(), ec.pow(2).sum()])
                maxima = torch.maximum(maxima, torch.stack(
                    [er.abs().max(), (ec.abs() - slack * t0.abs()).clamp_min(0).max()]))
            sq_t, sq_r, sq_c = sums.tolist()
            max_r, max_c = maxima.tolist()
            return *(int(x) for x in n.tolist()), sq_t, sq_r, sq_c, max_r, max_c

        n, n_i, sq_t, sq_r, sq_c, max_r, max_c = with_retries(run, self.device)  # (host copies stream via the GPU)
        o.n, o.n_i = o.n + n, o.n_i + n_i
        o.sq_t, o.sq_r, o.sq_c = o.sq_t + sq_t, o.sq_r + sq_r, o.sq_c + sq_c
        o.max_r, o.max_c = max(o.max_r, max_r), max(o.max_c, max_c)

    # -- what the verdict records, and what timed rounds use ----------------------------------------------------
    def record(self) -> dict:
        cal = [o for o in self.outputs if o.mode == "calibrated" and o.n]
        floats = [o for o in self.outputs if o.mode in ("calibrated", "fixed")]
        rule = "calibrated" if cal else ("fixed" if floats else "exact")
        rec: dict = {"rule": rule, "rule_note": "; ".join(self.notes) or None}
        if cal:
            worst = max(cal, key=lambda o: o.usage(self.factor))
            e, s = worst.errors(), max(worst.scale, 1e-30)
            rec.update(precision_factor=self.factor, err_ratio=worst.usage(self.factor),
                       ref_err=e["rms_r"] / s, cand_err=e["rms_c"] / s,
                       ref_max_err=e["max_r"] / s, cand_max_err=e["max_c"] / s)
            if worst.n_e:
                rec["envelope_err"] = e["rms_e"] / s
            if worst.n_b:
                rec["bf16_envelope_err"] = e["rms_b"] / s
        return rec

    def bound(self, o: Output, atol, rtol) -> Bound:
        """What the trials accepted for output `o`, as `acceptance` applies it
        (docs/design/judge-correctness.md#acceptance)."""
        if o.mode in ("exact", "value"):
            return Bound("exact")
        fixed_a = atol if atol is not None else default_tolerance(o.dtype)
        fixed_r = rtol if rtol is not None else default_tolerance(o.dtype)
        exposed = o.tf32 or (o.mode == "calibrated" and o.n and not o.n_e and self._tf32_exposed(o))
        if exposed:  # TF32 convolutions with no truth or envelope to say how far they go
            fixed_a, fixed_r = self._tf32_tolerance(fixed_a, fixed_r)
        s = o.scale
        if o.mode != "calibrated" or not o.n or not s > 0:
            return Bound("fixed", fixed_a, fixed_r)
        e = o.errors()
        ulps = FLOOR_ULPS * unit_roundoff(o.dtype)
        worst_max = max(e["max_c"], e["max_e"]) + max(e["max_r"], e["max_e"])  # |c - r| <= |c - t| + |r - t|
        worst_rms = max(e["rms_c"], e["rms_e"]) + max(e["rms_r"], e["rms_e"])
        return Bound("relative", max(MARGIN * (worst_max / s + ulps), fixed_a), fixed_r,
                     rms=max(MARGIN * (worst_rms / s + ulps), fixed_a), floor=SCALE_FLOOR * s,
                     outlier_abs=MARGIN * worst_max)

    def acceptance(self, atol, rtol) -> Acceptance:
        """Every output's bound: the trials' hand-off to timing, the weights trial and a second process's trial."""
        return Acceptance(tuple(self.bound(o, atol, rtol) for o in self.outputs), note=f" ({ACCEPTED_TEXT})")


ACCEPTED_TEXT = (f"held to {MARGIN:g}x the worst distance from the reference the trials with float64 truth accepted, "
                 "relative to the output's RMS")


def pick(numel: int) -> dict | None:
    """Which elements of an output of `numel` the truth covers this trial: None (all), or `truth_sample()` of them,
    every `stride`-th from a start drawn by the judge (`fp64.picked`)."""
    size = truth_sample()
    if numel <= size:
        return None
    stride = numel // size
    return {"start": secrets.randbelow(stride), "stride": stride, "size": size}


def _contiguous(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(list(shape)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(stride))
