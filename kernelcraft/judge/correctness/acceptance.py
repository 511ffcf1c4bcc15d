"""What the correctness trials accepted, as the rule every output judged without float64 truth is held to.

`Acceptance` (made by `precision.Rule.acceptance`) holds one `Bound` per output: `exact`, `fixed` or `relative`.
The timed rounds, the trials without truth, a further candidate process's trial and the weights trial judge by it.
Invariant: a calibrated (`relative`) output is checked at its own scale, never against an absolute floor; only a
few isolated elements (`compare.OUTLIER_EVERY`) may instead be within MARGIN x the trials' worst absolute distance.
`Sample` copies a timed output at secret indices, fresh each round, the moment the candidate's call ends.

Rationale: docs/design/judge-correctness.md#acceptance
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kernelcraft.judge.correctness.compare import Comparison, Relative, as_tensor_list, compare_outputs

MARGIN = 4.0  # x the worst distance the trials accepted (docs/design/judge-correctness.md#acceptance)
FULL = 1 << 16  # outputs of at most this many elements are captured and checked whole in timed rounds
SAMPLE = 1 << 14  # elements captured per larger output per timed round (secret indices, fresh each round)
SCALE_FLOOR = 1e-3  # the relative scale never drops below this share of the trials' output scale


@dataclass(frozen=True)
class Bound:
    """One output's bound (docs/design/judge-correctness.md#acceptance). `kind`: exact, fixed or relative."""
    kind: str
    atol: float | None = None
    rtol: float | None = None
    rms: float = 0.0
    floor: float = 0.0  # relative: the least scale (SCALE_FLOOR x the trials' output RMS)
    outlier_abs: float = 0.0  # relative: how far from the reference an outlier may be (MARGIN x the trials' worst)

    def relative(self) -> Relative | None:
        return Relative(self.floor, self.rms, self.outlier_abs) if self.kind == "relative" else None


@dataclass(frozen=True)
class Acceptance:
    """Every output's bound, in the reference's output order."""
    bounds: tuple[Bound, ...]
    note: str = ""  # what the message of a failure adds (which rule judged)

    @classmethod
    def fixed(cls, n: int, atol, rtol) -> "Acceptance":
        """The fixed rule for every one of `n` outputs (what `precision.Rule.acceptance` gives an output without
        float64 truth; callers outside an evaluation use it to state that rule)."""
        return cls(tuple(Bound("fixed", atol, rtol) for _ in range(n)))

    def compare(self, ref, cand, on: torch.device | None = None) -> Comparison:
        """Structure (as `compare_outputs`), then every output under its bound."""
        refs, cands = as_tensor_list(ref), as_tensor_list(cand)
        if refs is None or cands is None or len(refs) != len(cands) or len(refs) != len(self.bounds) \
                or isinstance(ref, torch.Tensor) != isinstance(cand, torch.Tensor):
            return compare_outputs(ref, cand, on=on)  # names the structural difference
        out = Comparison()
        for i, (b, r, c) in enumerate(zip(self.bounds, refs, cands)):
            if not isinstance(r, torch.Tensor):
                if r != c:
                    return out.fail("value_mismatch", f"output {i}: expected {r!r}, got {c!r}")
                continue
            got = compare_outputs(r, c, b.atol, b.rtol, on=on, relative=b.relative())
            out.max_abs_err, out.max_rel_err = max(out.max_abs_err, got.max_abs_err), max(out.max_rel_err,
                                                                                          got.max_rel_err)
            out.atol, out.rtol = got.atol, got.rtol
            if not got.ok:
                where = f"output {i}: " if len(refs) > 1 else ""
                return out.fail(got.reasons[0], where + got.message + self.note)
        return out


class Sample:
    """Secret element indices per output for one timed round, and the copies taken at them
    (docs/design/judge-correctness.md#acceptance)."""

    def __init__(self, specs: list, device: torch.device):
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)  # never the job's seed
        self.numel = [None if s is None else int(s.numel) for s in specs]
        self.device = device
        self.idx: list = []

    def draw(self) -> None:
        """Fresh indices for the next round (drawn before the candidate's call, kept in the judge only)."""
        self.idx = [None if n is None or n <= FULL else
                    torch.randint(0, n, (SAMPLE,), device=self.device, generator=self.gen) for n in self.numel]

    def take(self, tensors: list, values: list) -> list:
        """The elements at this round's indices of `tensors` (an output arena's), copied into judge memory; a
        non-tensor output's value from `values`."""
        values = list(values) + [None] * len(tensors)
        out = []
        for t, v, idx in zip(tensors, values, self.idx or [None] * len(tensors)):
            if t is None:
                out.append(v)
                continue
            f = t.detach().reshape(-1)
            out.append(f.clone() if idx is None else f.index_select(0, idx))
        return out
