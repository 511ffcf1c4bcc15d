"""The reference's float64 evaluation: ground truth for the calibrated precision rule (`precision`).

Runs in the reference's side process only (`side.Side.cmd_fp64`). Truth must really be float64: an op that
computes below it, or any failure, reports float64 as unavailable (the fixed rule then judges); it never raises.
On request it also measures the TF32 envelope of the reference's convolutions (and bf16's where TF32's errs by
more than `COARSE_ABOVE`), and it counts random draws.

Rationale: docs/design/judge-correctness.md#fp64
"""
from __future__ import annotations

import contextlib
import copy
import math

import torch

from kernelcraft.judge.correctness.compare import DEVICE_CHUNK, as_tensor_list, chunks

_LOWER = (torch.float32, torch.float16, torch.bfloat16, torch.complex64)
_CONVOLUTIONS = (torch.ops.aten.convolution, torch.ops.aten._convolution, torch.ops.aten.convolution_overrideable)
_RANDOM = ("bernoulli", "dropout", "rand", "randn", "randint", "randperm", "normal", "uniform", "multinomial",
           "exponential", "geometric", "cauchy", "log_normal", "poisson")  # aten op names (`_watcher`)


TF32_BITS, BF16_BITS = 10, 7  # explicit mantissa bits
COARSE_ABOVE = 2.5e-3  # the TF32 envelope's RMS, relative to the truth's, above which the bf16 one is measured too


def tf32_round(x: torch.Tensor, bits: int = TF32_BITS) -> torch.Tensor:
    """A float64 tensor's values as TF32 holds them (fp32 with the low 13 mantissa bits rounded away, to nearest
    even), back in float64; `bits=BF16_BITS` as bf16 holds them."""
    drop = 23 - bits
    xi = x.to(torch.float32).contiguous().view(torch.int32)
    rounded = (xi + ((1 << (drop - 1)) - 1) + ((xi >> drop) & 1)) & ~((1 << drop) - 1)
    return rounded.view(torch.float32).to(torch.float64)


def _rounded_convolutions(bits: int = TF32_BITS):
    """A TorchDispatchMode that rounds every convolution's input and weight to `bits` mantissa bits (TF32 by
    default; None without the API)."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except Exception:  # noqa: BLE001
        return None

    class RoundedConvolutions(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in _CONVOLUTIONS and len(args) >= 2:
                args = (tf32_round(args[0], bits), tf32_round(args[1], bits), *args[2:])
            return func(*args, **(kwargs or {}))

    return RoundedConvolutions()


def _distance(a: torch.Tensor, t: torch.Tensor) -> dict:
    """{sq, max, n}: a's squared and largest distance from t over elements finite in both (`compare.chunks`;
    the sums stay on the device until the end)."""
    sq = torch.zeros((), dtype=torch.float64, device=a.device)
    mx = torch.zeros((), dtype=torch.float64, device=a.device)
    n = torch.zeros((), dtype=torch.int64, device=a.device)
    for x, y in chunks([a, t], DEVICE_CHUNK):
        ok = torch.isfinite(x) & torch.isfinite(y)
        d = torch.where(ok, x - y, 0.0)
        sq += d.pow(2).sum()
        mx = torch.maximum(mx, d.abs().max())
        n += ok.sum()
    return {"sq": float(sq), "max": float(mx), "n": int(n)}


def _is_random(name: str) -> bool:
    """An aten op that draws random numbers (`randn_like`, `bernoulli_`, `native_dropout`, ...)."""
    return name.lstrip("_").removesuffix("_").removesuffix("_like").removeprefix("native_") in _RANDOM


def _watcher():
    """A TorchDispatchMode that records the first op whose floating output is below float64 (None if the
    private API is missing: then nothing is watched)."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
    except Exception:  # noqa: BLE001
        return None

    class Float64Only(TorchDispatchMode):
        lower: str | None = None
        convolutions: int = 0
        random: int = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in _CONVOLUTIONS:
                self.convolutions += 1
            elif _is_random(func.overloadpacket.__name__):
                self.random += 1
            out = func(*args, **(kwargs or {}))
            if self.lower is None:
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.dtype in _LOWER:
                        self.lower = f"{func} yields {str(t.dtype).removeprefix('torch.')}"
                        break
            return out

    return Float64Only()


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _widen(x):
    if not isinstance(x, torch.Tensor):
        return x
    return x.detach().to(torch.float64) if (x.is_floating_point() and x.dtype != torch.float64) else x.detach().clone()


def picked(t: torch.Tensor, pick) -> torch.Tensor:
    """The elements of `t` the judge pools (`precision.Rule`): all of them (`pick` None), or `pick`'s `size`
    elements from `start` every `stride` of the flattened tensor (a large output:
    docs/design/judge-correctness.md#fp64)."""
    if pick is None:
        return t
    start, stride, size = (int(pick[k]) for k in ("start", "stride", "size"))
    f = t.detach().reshape(-1)
    return f[start:start + stride * size:stride]


def evaluate(model, args: list, outs: list, device: torch.device, envelope: bool = False,
             picks: list | None = None) -> dict:
    """Run a float64 copy of `model` on `args`; copy its outputs into `outs` (float64 views, None where none is
    wanted), each output's `picks` entry only where one is given. Returns {"available": [bool per output], "note":
    str, "random": random draws the call made} and, with `envelope` when the call ran convolutions, "envelope":
    [{sq, max, n} or None per output] (docs/design/judge-correctness.md#fp64); never raises."""
    n = len(outs)
    picks = list(picks or []) + [None] * (n - len(picks or []))
    none = {"available": [False] * n}
    if not isinstance(model, torch.nn.Module):
        return {**none, "note": "the reference is not an nn.Module (cannot be cast to float64)"}
    args64 = items = None
    watch = _watcher()
    try:
        args64 = [_widen(a) for a in args]
        items = _call64(model, args64, device, watch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if watch is not None and watch.lower:
            return {**none, "note": f"the reference computes below float64 when cast ({watch.lower})"}
        if items is None or len(items) != n:
            return {**none, "note": "the float64 reference returned another structure"}
        available = []
        for buf, o, pick in zip(outs, items, picks):
            ok = buf is not None and isinstance(o, torch.Tensor) and o.dtype == torch.float64
            if ok:
                o = picked(o, pick)
                ok = tuple(o.shape) == tuple(buf.shape)
            if ok:
                buf.copy_(o)
            available.append(ok)
        if device.type == "cuda":
            torch.cuda.synchronize()
        got = {"available": available, "note": "", "random": watch.random if watch is not None else 0}
        if envelope and watch is not None and watch.convolutions:
            items = None  # the truth is in `outs`: free the first call's outputs before the second call
            got["envelope"] = env = _envelope(model, args64, outs, available, device, picks)
            if any(_relative_rms(e, buf) >= COARSE_ABOVE for e, buf in zip(env or [], outs)):
                got["coarse"] = _envelope(model, args64, outs, available, device, picks, BF16_BITS)
        return got
    except BaseException as e:  # noqa: BLE001 - never the task's failure: the judge falls back to the fixed rule
        return {**none, "note": f"the float64 reference failed: {type(e).__name__}: {str(e)[:300]}"}
    finally:
        del args64, items  # freed by reference counting (a gc.collect() here cost ~0.15 s a trial)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _call64(model, args64: list, device: torch.device, mode) -> list | None:
    """A fresh float64 copy of `model` called on `args64` under `mode` (a dispatch mode or None), with float64 as
    the default dtype and a forked RNG: its outputs as a list (None for another structure). The copy is freed on
    return."""
    model64 = copy.deepcopy(model).to(torch.float64)
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad(), _default_dtype(torch.float64), \
            (mode if mode is not None else contextlib.nullcontext()):
        out = model64(*args64)
    return as_tensor_list(out)


def _relative_rms(e: dict | None, truth: torch.Tensor | None) -> float:
    """An envelope entry's RMS distance relative to the truth's RMS (0 where there is none, or where it cannot be
    had: one reduction, no output-sized temporary, and never a reason to lose the truth already written)."""
    if not e or truth is None or not e["n"] or not truth.numel():
        return 0.0
    try:
        scale = float(torch.linalg.vector_norm(truth)) / truth.numel() ** 0.5
    except Exception:  # noqa: BLE001 - no bf16 envelope then: the rule keeps the fixed rule for a noisy reference
        return 0.0
    return (e["sq"] / e["n"]) ** 0.5 / scale if scale > 0 and math.isfinite(scale) else 0.0


def _envelope(model, args64: list, outs: list, available: list, device: torch.device,
              picks: list, bits: int = TF32_BITS) -> list | None:
    """The float64 call again with convolutions rounded to `bits` (TF32's by default): per output, its distance
    from the truth in `outs`."""
    mode = _rounded_convolutions(bits)
    if mode is None:
        return None
    try:
        items = _call64(model, args64, device, mode)
        if items is None or len(items) != len(outs):
            return None
        items = [picked(o, pick) if isinstance(o, torch.Tensor) else o for o, pick in zip(items, picks)]
        return [_distance(o, buf) if ok and isinstance(o, torch.Tensor) and o.shape == buf.shape else None
                for o, buf, ok in zip(items, outs, available)]
    except Exception:  # noqa: BLE001 - no envelope: the reference's own error alone calibrates
        return None
