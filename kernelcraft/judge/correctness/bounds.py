"""One output's pooled errors against float64 truth, and the bounds they set: the calibrated rule's arithmetic.

Trials are pooled as sums (`Output`: counts, sums of squares, maxima), so a bound is the same arithmetic however
many trials fed it. Which reference cannot calibrate, and why, is decided here (`Output.uncalibratable`).

Rationale: docs/design/judge-correctness.md#bounds
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from kernelcraft.judge.process.arena import TensorSpec
from kernelcraft.verdict import UNVERIFIABLE  # noqa: F401  (`precision` and the tests read it here)

FLOOR_ULPS = 256  # 2^-16 of the output scale in fp32: fast-math transcendentals (~2^-18) pass, fp16/TF32 (2^-11) do not
MAX_FACTOR = 2.0  # the max-error bound is MAX_FACTOR x F
SMALL_N = 64  # F widens by sqrt(SMALL_N / n) below this many informative elements (a relu's zeros inform nothing)
CAP = 1e-2  # the reference's own relative RMS error beyond which it needs a named reason to calibrate anything
ENVELOPE_EXPLAINS = 4.0  # ... such as the TF32 envelope erring at least 1/4 as much (cuDNN truncates, we round)
MEANINGFUL = 0.5  # a calibrated RMS bound at or above this share of the output's RMS checks nothing
SEPARATION = 2.0  # ... nor one where bf16's envelope (`fp64` coarse) errs less than this times TF32's
TOWARDS_BF16 = 2 / 3  # the RMS bound's cap: this far, on a log scale, from TF32's envelope (0) to bf16's (1)
TOWARDS_BF16_TEXT = str(Fraction(TOWARDS_BF16).limit_denominator(8))  # "2/3", as messages and notes say it


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


@dataclass
class Output:
    """One output's rule and pooled error sums."""
    spec: TensorSpec | None
    mode: str  # "calibrated", "fixed", "exact" or "value" (a non-tensor output)
    note: str = ""
    n: int = 0
    n_i: int = 0  # informative elements: the truth or either side's error not zero (`SMALL_N` counts these)
    sq_t: float = 0.0
    sq_r: float = 0.0
    sq_c: float = 0.0
    max_r: float = 0.0
    max_c: float = 0.0
    fixed_missed: int = 0
    dtype: torch.dtype = torch.float32
    n_e: int = 0  # the default-precision envelope (`fp64`: the reference with TF32 convolutions), pooled
    sq_e: float = 0.0
    max_e: float = 0.0
    n_b: int = 0  # the bf16 envelope (`fp64`'s `coarse`: only where the TF32 envelope errs by percents), pooled
    sq_b: float = 0.0
    random: int = 0  # random draws the reference's float64 calls made (`fp64`): nondeterministic
    tf32: bool = False  # judged by the fixed rule, its reference's convolutions in TF32: `precision.TF32_FIXED`
    unverifiable: bool = False  # ... because the reference itself errs too much (`uncalibratable`): `UNVERIFIABLE`

    @property
    def scale(self) -> float:
        return math.sqrt(self.sq_t / self.n) if self.n else 0.0

    def errors(self) -> dict:
        rms = lambda s: math.sqrt(s / self.n) if self.n else 0.0  # noqa: E731
        return dict(rms_r=rms(self.sq_r), rms_c=rms(self.sq_c), max_r=self.max_r, max_c=self.max_c,
                    rms_e=math.sqrt(self.sq_e / self.n_e) if self.n_e else 0.0, max_e=self.max_e,
                    rms_b=math.sqrt(self.sq_b / self.n_b) if self.n_b else 0.0)

    def noisy(self) -> bool:
        """The reference errs beyond `CAP` of the output's RMS (it needs a named reason to calibrate)."""
        return bool(self.n) and self.sq_r > (max(CAP, 64 * unit_roundoff(self.dtype)) ** 2) * self.sq_t

    def bounds(self, factor: float) -> tuple[float, float, float]:
        """(F used, RMS bound, max bound), absolute: F times the reference's own error, or the error its
        convolutions would have in TF32 where the platform's defaults allow that (the envelope), if larger. Where
        the side measured a bf16 envelope (the TF32 one errs by over `fp64.COARSE_ABOVE`), the RMS bound is at most
        `TOWARDS_BF16` of the way, on a log scale, from that error to bf16's (`below_bf16`): where TF32 alone errs by
        percents, 6x it reaches bf16."""
        f = factor * max(1.0, math.sqrt(SMALL_N / max(self.n_i or self.n, 1)))  # (n_i 0: none pooled apart)
        floor = FLOOR_ULPS * unit_roundoff(self.dtype) * max(self.scale, torch.finfo(self.dtype).tiny)
        e = self.errors()
        b_rms = f * max(e["rms_r"], e["rms_e"])
        cap = self.below_bf16()
        if cap is not None:
            b_rms = min(b_rms, cap)
        return f, b_rms + floor, MAX_FACTOR * f * max(e["max_r"], e["max_e"]) + floor

    def below_bf16(self) -> float | None:
        """The RMS bound's cap where the side measured a bf16 envelope at least `SEPARATION` times the reference's
        own error (or its TF32 envelope's, if larger): `TOWARDS_BF16` of the way from that error to bf16's, on a log
        scale. None where there is none (below `SEPARATION` no bound tells them apart: `uncalibratable`).
        - It holds for a reference within `CAP` too: cuDNN may run the reference's own convolutions in full fp32 on
          a draw, and 6x a TF32 envelope of percents reached bf16 (the GPU suite's deep train-mode CNN judged bf16
          autocast `correct` once).
        - Why 2/3 and not halfway: in a deep train-mode network each draw's errors scatter. On the CPU, emulating
          the GPU suite's 8-wide conv-BatchNorm CNN (40 draws each): a truncating TF32 algorithm erred up to 2.8x
          the round-to-nearest envelope (32 and 26 layers), bf16 autocast 0.8-2.3x its envelope (it also rounds
          the convolutions' outputs), bf16's envelope 2.6-3.6x TF32's at the least. Halfway rejected 0.2-2.5% of
          the honest TF32 runs, 2/3 none, and neither accepted bf16. On an H200, inductor's TF32 on the 40-layer
          network erred 2.3x its envelope, past halfway (bf16 there 4x TF32)."""
        e = self.errors()
        own = max(e["rms_r"], e["rms_e"])
        if not e["rms_b"] >= SEPARATION * own > 0:
            return None
        return own ** (1 - TOWARDS_BF16) * e["rms_b"] ** TOWARDS_BF16

    def usage(self, factor: float) -> float:
        """How much of the bound the candidate used (<= 1 passes)."""
        _, b_rms, b_max = self.bounds(factor)
        e = self.errors()
        ratio = lambda err, bound: err / bound if bound > 0 else (math.inf if err > 0 else 0.0)  # noqa: E731
        return max(ratio(e["rms_c"], b_rms), ratio(e["max_c"], b_max))

    def passes(self, factor: float) -> bool:
        return self.usage(factor) <= 1.0

    def uncalibratable(self, factor: float) -> str:
        """Why the reference cannot calibrate this output ("" when it can;
        docs/design/judge-correctness.md#precision)."""
        if not self.n:
            return ""
        e, s = self.errors(), max(self.scale, 1e-30)
        noisy = self.noisy()  # (random draws that change little, dropout with p=0 say, calibrate like any reference)
        if noisy and self.random:
            return (f"the reference differs from its float64 self by {e['rms_r'] / s:.2g} of the output's RMS and "
                    f"draws random numbers in its forward ({self.random} random ops): nondeterministic")
        if noisy and not (self.n_e and e["rms_r"] <= ENVELOPE_EXPLAINS * e["rms_e"]):
            return (f"the reference differs from its float64 self by {e['rms_r'] / s:.2g} of the output's RMS "
                    "(nondeterministic or ill-conditioned reference)")
        own, (_, b_rms, _) = max(e["rms_r"], e["rms_e"]), self.bounds(factor)  # (the bound between TF32 and bf16)
        # a bound that accepts half the output's RMS checks nothing, whatever the reference's own error: a reference
        # cuDNN ran in full fp32 under a TF32 envelope of 10% had a bound that all-zeros met. Nor does one where
        # bf16 (measured for any reference whose TF32 envelope errs by percents) is not `SEPARATION` x TF32: there
        # 6x accepted bf16 autocast in 20% of the evaluations of the GPU suite's 40-layer CNN with its reference in
        # full fp32 (as cuDNN ran it on an H200), emulated on the CPU
        if b_rms >= MEANINGFUL * s or ((noisy or self.n_b) and e["rms_b"] < SEPARATION * own):
            bf16 = f", with bf16 convolutions {e['rms_b'] / s:.2g}" if self.n_b else ""
            return (f"the reference differs from its float64 self by {e['rms_r'] / s:.2g} of the output's RMS, "
                    f"with TF32 convolutions {e['rms_e'] / s:.2g}{bf16} (ill-conditioned: no bound between its own "
                    "error and bf16's)")
        return ""

    def describe(self, factor: float, where: str) -> str:
        f, b_rms, b_max = self.bounds(factor)
        e, s = self.errors(), max(self.scale, 1e-30)
        between = (f", the RMS at most {TOWARDS_BF16_TEXT} of the way (log scale) to bf16's {e['rms_b'] / s:.3g}"
                   if self.below_bf16() is not None else "")
        env = (f" (with its convolutions in TF32, cuDNN's default: {e['rms_e'] / s:.3g} RMS, {e['max_e'] / s:.3g} max)"
               if self.n_e else "")
        return (f"{where}error vs the float64 reference {e['rms_c'] / s:.3g} RMS, {e['max_c'] / s:.3g} max beyond "
                f"{FLOOR_ULPS} ulps (relative "
                f"to the output's RMS {self.scale:.3g}); the reference's own fp32 error {e['rms_r'] / s:.3g} RMS, "
                f"{e['max_r'] / s:.3g} max{env}; allowed {b_rms / s:.3g} RMS, {b_max / s:.3g} max ({f:.3g}x the "
                f"reference's error{between} + a {FLOOR_ULPS}-ulp floor): less precise than the reference computes")
