"""Tripwires on the candidate's calls and outputs (the process-state guards are in `guards`).

Design decisions
- Judge v2: the reference runs in a process of its own, so the reference trap and call counting that
  guarded a shared process are gone; what is left is used by the judge (`SpotChecker`, `same_values`) and
  by the candidate's side (`profile_kernels`, strict mode's evidence).
- `SpotChecker`: every timed call's output is checked on a random sample whose seed comes from
  `os.urandom`, never from the job, so a candidate cannot predict which elements are looked at; it uses
  the same elementwise bound as the full comparison (`compare.within_tolerance`) and falls back to it.
- `same_values` (bitwise, NaN == NaN) tells a cached answer from a recomputed one; `profile_kernels`
  lists the GPU kernels a call launched (strict mode's own-kernel evidence), through `kerneltrace`.
"""
from __future__ import annotations

import os

import torch

from kernelcraft.judge import kerneltrace
from kernelcraft.judge.compare import as_tensor_list, is_plain_tensor, resolve_tolerance, rms_scale, within_tolerance


def same_values(a, b) -> bool:
    """Bitwise-equal outputs (NaN equal to NaN), for tensors and tuples/lists of them."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if torch.equal(a, b):  # the common case, at memcmp speed; NaN needs the slow path
            return True
        if a.is_floating_point() or a.is_complex():
            return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
        return bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b))
    return True


def profile_kernels(fn, device: torch.device) -> set[str] | None:
    """Names of the GPU kernels `fn` launched (None where no tracer can see kernels). CUPTI directly
    (`kerneltrace`, ~0.02 s to start) when its probe works, else torch.profiler (seconds to start)."""
    if device.type != "cuda":
        fn()
        return None
    tracer = kerneltrace.tracer(probe=lambda: torch.zeros(1, device=device).add_(1))
    if tracer.usable:  # None when CUPTI refused: the caller falls back to call counting
        return tracer.trace(fn) or None
    from torch.profiler import ProfilerActivity, profile  # only where CUPTI is refused: seconds to import

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA}
    except Exception:  # CUPTI unavailable: the caller falls back to call counting
        return None
    return names or None


def kernel_tracer_status() -> str:
    """How `profile_kernels` sees kernels in this process: for the verdict's record."""
    t = kerneltrace._TRACER
    return "cupti" if t is not None and t.usable else f"torch.profiler ({t.why if t else 'not started'})"


class SpotChecker:
    """Cheap per-round check of a timed call's output: exact structure, values on a random sample.

    A cached or stale answer is wrong almost everywhere, so 8Ki random elements per round catch it with
    certainty while costing microseconds; an answer computed for only a share f of its elements passes a
    round with probability f^8192. Any disagreement falls back to the full comparison.
    """

    def __init__(self, atol, rtol, seed: int = 0, sample: int = 1 << 13):
        self.atol, self.rtol, self.sample = atol, rtol, sample
        self.gen: dict[torch.device, torch.Generator] = {}
        # never the job's seed: a candidate that can predict the sampled indices computes only those
        self.seed = int.from_bytes(os.urandom(8), "little") >> 1

    def agrees(self, ref, cand) -> bool:
        rl, cl = as_tensor_list(ref), as_tensor_list(cand)
        if rl is None or cl is None or len(rl) != len(cl):
            return False
        for r, c in zip(rl, cl):
            if not isinstance(r, torch.Tensor):
                continue
            if (not is_plain_tensor(c) or c.shape != r.shape or c.dtype != r.dtype or c.device != r.device):
                return False
            rf, cf = r.reshape(-1), c.reshape(-1)
            if rf.numel() > self.sample:
                g = self.gen.get(r.device)
                if g is None:
                    g = self.gen[r.device] = torch.Generator(device=r.device)
                    g.manual_seed(self.seed)
                idx = torch.randint(0, rf.numel(), (self.sample,), device=r.device, generator=g)
                rf, cf = rf[idx], cf[idx]
            if not (rf.is_floating_point() or rf.is_complex()):
                if not torch.equal(rf, cf):
                    return False
                continue
            a, rt = resolve_tolerance(r.dtype, self.atol, self.rtol)
            wide = torch.float64 if r.dtype == torch.float64 else torch.float32  # fp32 resolves a 1e-4 bound
            rd, cd = rf.to(wide), cf.to(wide)
            scale = rms_scale(rd[torch.isfinite(rd)])  # of the sample: a disagreement falls back to the full check
            ok = within_tolerance(rd, cd, a, rt, scale) | ((cd == rd) | (torch.isnan(cd) & torch.isnan(rd)))
            if not bool(ok.all()):
                return False
        return True
