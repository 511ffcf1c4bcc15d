"""The weights trial's draw: new values for the reference's parameters and normalisation statistics, and how far
they moved an output.

`moves` says which state_dict entries get new values; `perturbed` draws them with the judge's RNG (every element
moved, each tensor's RMS and sign kept, a uniform tensor shifted as a whole, tied entries one value, non-finite
elements as they are). `excess` measures an output's change in units of the bound the trials accepted.

Rationale: docs/design/judge-correctness.md#weightdraw
"""
from __future__ import annotations

import math

import torch

from kernelcraft.judge.correctness.acceptance import Acceptance
from kernelcraft.judge.correctness.compare import as_tensor_list, chunks, resolve_tolerance, with_retries

_MOVE = (0.3, 0.5)  # k: each element scaled by e^(+-k), normalised to mean 1
_SHIFT = (0.15, 0.3)  # a uniform signed tensor (all zeros) also moved as a whole by +-this, times its scale
_ADD = 0.05  # elementwise noise, uniform with this standard deviation (bounded: +-0.087), times the scale


def moves(e: dict) -> bool:
    """Does the judge give this reference entry new values? A floating parameter or normalisation statistic with
    elements, not the second key of a tied one."""
    dtype = getattr(torch, str(e.get("dtype", "")), None)
    return (e.get("kind") in ("param", "stat") and isinstance(dtype, torch.dtype) and dtype.is_floating_point
            and math.prod(e["shape"]) > 0 and "same_as" not in e)


def _module(key: str) -> str:
    return key.rsplit(".", 1)[0] if "." in key else ""


def module_scales(values: list[torch.Tensor], entries: list[dict]) -> dict[str, float]:
    """Per module (a key's prefix), the RMS of its moving tensors that are not all zero: the scale at which one of
    its all-zero tensors is moved (PyTorch's default initialisation gives a Linear's or a convolution's bias its
    weight's RMS, a norm layer's bias its weight's 1)."""
    acc: dict[str, list[float]] = {}
    for t, e in zip(values, entries):
        if not moves(e):
            continue
        x = t.detach().double()
        x = x[torch.isfinite(x)]
        ss = float(x.square().sum())
        if ss > 0:
            a = acc.setdefault(_module(e["key"]), [0.0, 0])
            a[0] += ss
            a[1] += x.numel()
    return {m: math.sqrt(ss / n) for m, (ss, n) in acc.items()}


def _signed(like: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Elementwise +-k, k uniform within `bounds` (random signs): a move bounded away from zero."""
    k = bounds[0] + (bounds[1] - bounds[0]) * torch.rand_like(like)
    return torch.where(torch.rand_like(like) < 0.5, k, -k)


def _perturb(t: torch.Tensor, hint: float) -> torch.Tensor:
    """New values for one tensor (docs/design/judge-correctness.md#weightdraw): every element scaled by a factor
    e^(+-k) / E[cosh k] (mean 1, each at least ~20% from 1) plus bounded noise; a non-uniform tensor keeps its RMS,
    a uniform signed one (all zeros, a zero gate) also moves as a whole by +-k times its scale; a non-negative one
    stays non-negative."""
    x = t.double() if t.dtype == torch.float64 else t.float()
    finite = torch.isfinite(x)
    vals = x[finite]
    if not vals.numel():
        return t
    rms = float(vals.square().mean().sqrt())
    scale = rms or hint
    nonneg = rms > 0 and bool((vals >= 0).all())
    uniform = bool(vals.max() == vals.min())
    a, b = _MOVE
    mean_factor = (math.sinh(b) - math.sinh(a)) / (b - a)  # E[cosh k]: the factors average to 1
    noise = _ADD * math.sqrt(3) * (2 * torch.rand_like(x) - 1)  # uniform, standard deviation _ADD, bounded
    new = x * torch.exp(_signed(x, _MOVE)) / mean_factor + scale * noise
    if nonneg:
        new = new.abs()  # a variance stays a variance
    if rms > 0 and vals.numel() > 1:
        now = float(new[finite].square().mean().sqrt())
        new = new * (rms / now) if now > 0 else new  # the gain kept: deep networks neither blow up nor vanish
    if uniform and not nonneg:
        new = new + scale * float(_signed(torch.zeros(()), _SHIFT))  # off a constant guess (a zero bias, a zero gate)
    return torch.where(finite, new, x).to(t.dtype)


def perturbed(values: list[torch.Tensor], entries: list[dict]) -> tuple[list[torch.Tensor], int]:
    """New values for parameters and normalisation statistics (the judge's RNG;
    docs/design/judge-correctness.md#weightdraw); other entries unchanged, a tied entry the value of the one it is
    tied to. (values, how many were given new values)."""
    hints = module_scales(values, entries)
    out, n = [], 0
    for i, (t, e) in enumerate(zip(values, entries)):
        j = e.get("same_as")
        if isinstance(j, int) and 0 <= j < i and out[j].shape == t.shape and out[j].dtype == t.dtype:
            out.append(out[j])
        elif moves(e) and t.is_floating_point() and t.numel():
            out.append(_perturb(t, hints.get(_module(e["key"]), 1.0)))
            n += 1
        else:
            out.append(t)
    return out, n


def excess(old, new, accepted: Acceptance, on: torch.device | None = None) -> float | None:
    """How far `new` is from `old` in units of the elementwise bound the trials accepted (`acceptance`: atol times
    `old`'s RMS, or max(1, RMS) under the fixed rule, plus rtol): the largest ratio over the finite elements of the
    floating outputs, None where none is floating. Above 1, a candidate that still returned `old` would fail the
    comparison by that factor."""
    worst = None
    for a, b, bound in zip(as_tensor_list(old) or [], as_tensor_list(new) or [], accepted.bounds):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point()
                and a.shape == b.shape and a.numel()):
            continue
        at, rt = resolve_tolerance(a.dtype, bound.atol, bound.rtol)
        rel = bound.relative()
        x = with_retries(lambda chunk, dev, a=a, b=b: _excess_one(a, b, at, rt, chunk, dev, rel), on or a.device)
        worst = x if worst is None else max(worst, x)
    return worst


def _excess_one(a: torch.Tensor, b: torch.Tensor, at: float, rt: float, chunk: int, dev: torch.device,
                relative=None) -> float:
    sq = torch.zeros((), dtype=torch.float64, device=dev)
    n = torch.zeros((), dtype=torch.int64, device=dev)
    for (x,) in chunks([a], chunk, dev):
        f = torch.isfinite(x)
        sq += torch.where(f, x, 0.0).square().sum()
        n += f.sum()
    rms = math.sqrt(float(sq) / int(n)) if int(n) else 0.0
    scale = max(1.0, rms) if relative is None else max(rms, relative.floor, 1e-30)
    worst = torch.zeros((), dtype=torch.float64, device=dev)
    for x, y in chunks([a, b], chunk, dev):
        both = torch.isfinite(x) & torch.isfinite(y)
        ratio = (y - x).abs_().div_((x.abs() * rt + at * scale).clamp_min_(1e-300))
        worst = torch.maximum(worst, torch.where(both, ratio, 0.0).max())
    return min(float(worst), 1e12)
