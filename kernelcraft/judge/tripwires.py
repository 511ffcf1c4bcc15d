"""Tripwires on the candidate's calls and outputs (the process-state guards are in `guards`).

Design decisions
- `ReferenceTrap`: while the candidate runs its correctness calls, every function of the reference module
  has its code swapped for a stub that raises, so the reference is unusable however it was reached (a
  function object taken at import, a closure, a subclass); `watch_calls` also counts calls of the
  harness's `Model.forward`. Both are armed only around candidate calls, never around the reference's.
- `SpotChecker`: every timed call's output is checked on a random sample whose seed comes from
  `os.urandom`, never from the job, so a candidate cannot predict which elements are looked at; it uses
  the same elementwise bound as the full comparison (`compare.within_tolerance`) and falls back to it.
- `same_values` (bitwise, NaN == NaN) tells a cached answer from a recomputed one; `profile_kernels`
  lists the GPU kernels a call launched (strict mode's own-kernel evidence), through `kerneltrace`.
"""
from __future__ import annotations

import contextlib
import os
import types

import torch

from kernelcraft.judge import kerneltrace
from kernelcraft.judge.compare import as_tensor_list, is_plain_tensor, resolve_tolerance, rms_scale, within_tolerance


REFERENCE_CALLED = "kernelcraft: the candidate ran the reference's own code"


def _stub_code(freevars: tuple[str, ...]) -> types.CodeType:
    """A code object with the given free variables that only raises REFERENCE_CALLED."""
    body = "".join(f"    {v} = None\n" for v in freevars)
    use = f"        ({', '.join(freevars)},)\n" if freevars else ""
    src = (f"def _outer():\n{body}    def _stub(*args, **kwargs):\n{use}"
           f"        raise RuntimeError({REFERENCE_CALLED!r})\n    return _stub\n")
    ns: dict = {}
    exec(compile(src, "<kernelcraft reference trap>", "exec"), ns)
    return ns["_outer"]().__code__


class ReferenceTrap:
    """While armed (around the candidate's correctness calls), every function defined in the reference module
    has its __code__ swapped for a stub that raises: the reference is unusable however it is reached (a
    function object taken at import, the original out of a wrapper's closure, a subclass, an instance)."""

    def __init__(self, ref_mod):
        self.swaps = []
        seen = set()
        objs = list(vars(ref_mod).values())
        for v in list(objs):
            if isinstance(v, type) and v.__module__ == ref_mod.__name__:
                for a in vars(v).values():
                    objs.append(getattr(a, "__func__", getattr(a, "fget", a)))
        for fn in objs:
            if isinstance(fn, types.FunctionType) and fn.__module__ == ref_mod.__name__ and id(fn) not in seen:
                seen.add(id(fn))
                stub = _stub_code(fn.__code__.co_freevars)
                if stub.co_freevars == fn.__code__.co_freevars:
                    self.swaps.append((fn, fn.__code__, stub))

    @contextlib.contextmanager
    def armed(self):
        for fn, _, stub in self.swaps:
            fn.__code__ = stub
        try:
            yield
        finally:
            for fn, code, _ in self.swaps:
                fn.__code__ = code


@contextlib.contextmanager
def watch_calls(cls):
    """Count calls of `cls.forward` (the harness's reference) while the candidate runs: a candidate must
    never reach it. Installed only around candidate calls, so the reference's own timing is untouched."""
    counter = [0]
    orig = cls.__dict__.get("forward")
    base = cls.forward

    def forward(self, *args, **kwargs):
        counter[0] += 1
        return base(self, *args, **kwargs)

    cls.forward = forward
    try:
        yield counter
    finally:
        if orig is None:
            del cls.forward
        else:
            cls.forward = orig


def same_values(a, b) -> bool:
    """Bitwise-equal outputs (NaN equal to NaN), for tensors and tuples/lists of them."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
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

    A cached or stale answer is wrong almost everywhere, so 64Ki random elements per round catch it
    with certainty while costing microseconds; any disagreement falls back to the full comparison.
    """

    def __init__(self, atol, rtol, seed: int = 0, sample: int = 1 << 16):
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
            rd, cd = rf.double(), cf.double()
            scale = rms_scale(rd[torch.isfinite(rd)])  # of the sample: a disagreement falls back to the full check
            ok = within_tolerance(rd, cd, a, rt, scale) | ((cd == rd) | (torch.isnan(cd) & torch.isnan(rd)))
            if not bool(ok.all()):
                return False
        return True
