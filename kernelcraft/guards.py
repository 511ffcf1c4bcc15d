"""Runtime guards: process state a candidate must not change, and memory it must not read back.

Design decisions
- `ProcessState.capture()` runs after the reference is imported and before the candidate is: it records
  the numeric-precision switches, thread count, default dtype, grad mode, the identity of every clock
  and timing function, and the identity of every public torch / torch.nn.functional / Tensor callable
  and every torch.nn module's `forward`. `verify()` compares after every correctness trial and after
  timing; a difference is a rejection with the reason code of what changed. Comparing identities
  catches monkey-patching whatever the patch does, at import or inside forward.
- Precision switches (TF32, reduced-precision reductions, matmul precision, default dtype) and the
  thread count are rejected, not restored: they change what the candidate computes or how fast the
  reference runs. `cudnn.benchmark` is a legitimate candidate-side choice: the reference always runs
  with the value from the snapshot (`reference_context`).
- Memory poisoning: after the side that runs first, every free block of the CUDA caching allocator is
  filled with NaN, so a candidate that returns `torch.empty(...)` hoping to find the reference's freed
  result finds NaN instead. Trials alternate which side runs first.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time

import torch
import torch.nn.functional as F


class Reject(Exception):
    """A verdict reached inside the worker: (status, reasons, message)."""

    def __init__(self, status: str, reasons: list[str], message: str):
        super().__init__(message)
        self.status, self.reasons, self.message = status, reasons, message


def _precision_flags() -> dict:
    b = torch.backends
    flags = {
        "cuda.matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": torch.get_default_dtype(),
        "num_threads": torch.get_num_threads(),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn.enabled": b.cudnn.enabled,
    }
    return flags


_TIMERS = [
    (time, "perf_counter"), (time, "perf_counter_ns"), (time, "time"), (time, "time_ns"),
    (time, "monotonic"), (time, "monotonic_ns"), (time, "process_time"), (time, "sleep"),
    (torch.cuda, "synchronize"), (torch.cuda, "Event"), (torch.cuda.Event, "record"),
    (torch.cuda.Event, "elapsed_time"), (torch.cuda.Event, "synchronize"), (torch.cuda.Event, "query"),
    (torch.cuda, "current_stream"), (torch.cuda, "default_stream"), (torch.cuda.Stream, "synchronize"),
    (torch, "manual_seed"), (torch, "equal"), (torch, "allclose"), (torch, "isfinite"),
]


def _callables(ns) -> dict[str, object]:
    out = {}
    for k in dir(ns):
        if k.startswith("__"):
            continue
        try:
            v = getattr(ns, k)
        except Exception:  # lazily-failing attributes are not functions anyone calls
            continue
        if callable(v):
            out[k] = v
    return out


def _class_attrs(cls) -> dict[str, object]:
    """Raw class dict entries (no bound-method objects, so identities are stable), dunders included."""
    return {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__doc__", "__weakref__")}


SURFACE_CLASSES = (("Tensor.", torch.Tensor), ("TensorBase.", torch._C.TensorBase), ("nn.Module.", torch.nn.Module))


def _surface() -> dict[str, object]:
    """Identity of every function the reference (and the harness) may call."""
    import kernelcraft.check
    import kernelcraft.timing

    ids: dict[str, object] = {}
    for prefix, ns in (("torch.", torch), ("F.", F), ("_C._nn.", torch._C._nn),
                       ("_C._VariableFunctions.", torch._C._VariableFunctions), ("torch.linalg.", torch.linalg),
                       ("torch.fft.", torch.fft), ("torch.special.", torch.special),
                       ("kernelcraft.timing.", kernelcraft.timing), ("kernelcraft.check.", kernelcraft.check)):
        ids.update({prefix + k: v for k, v in _callables(ns).items()})
    for prefix, cls in SURFACE_CLASSES:
        ids.update({prefix + k: v for k, v in _class_attrs(cls).items()})
    for name in dir(torch.nn):
        cls = getattr(torch.nn, name)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls is not torch.nn.Module:
            for meth in ("forward", "__call__", "_call_impl", "__init__", "_conv_forward"):
                if meth in vars(cls):
                    ids[f"nn.{name}.{meth}"] = vars(cls)[meth]
    return ids


_TORCH_DIR = os.path.dirname(torch.__file__)


def _same_function(now, orig) -> bool:
    """Identical, or torch's own wrapper around the original (torch._dynamo wraps e.g. manual_seed
    with `functools.wraps` when it is first imported, which a torch.compile candidate triggers)."""
    if now is orig:
        return True
    code = getattr(now, "__code__", None)
    try:
        return (code is not None and code.co_filename.startswith(_TORCH_DIR)
                and inspect.unwrap(now) is orig)
    except ValueError:
        return False


class ProcessState:
    def __init__(self):
        self.flags = _precision_flags()
        self.timers = {f"{getattr(o, '__name__', o)}.{n}": getattr(o, n) for o, n in _TIMERS}
        self.surface = _surface()
        self.cudnn_benchmark = torch.backends.cudnn.benchmark
        self.threads = {t.ident for t in threading.enumerate()}

    @classmethod
    def capture(cls) -> "ProcessState":
        return cls()

    def verify(self, result: dict | None = None) -> None:
        if result is not None and "process_state" not in result["guards"]:
            result["guards"].append("process_state")
        now = {f"{getattr(o, '__name__', o)}.{n}": getattr(o, n, None) for o, n in _TIMERS}
        changed = [k for k, v in self.timers.items() if not _same_function(now.get(k), v)]
        if changed:
            raise Reject("rejected", ["timer_tampering"],
                         f"the candidate replaced timing functions: {', '.join(changed[:5])}")
        flags = _precision_flags()
        diff = [f"{k}: {v!r} -> {flags[k]!r}" for k, v in self.flags.items() if flags[k] != v]
        if diff:
            raise Reject("rejected", ["global_state_tampering"],
                         "the candidate changed process-wide settings: " + "; ".join(diff[:5]))
        surface = _surface()
        patched = [k for k, v in self.surface.items() if not _same_function(surface.get(k), v)]
        # a class gaining an attribute is a patch too (modules may gain lazily imported submodules)
        patched += [k for k in surface if k not in self.surface and k.startswith(tuple(p for p, _ in SURFACE_CLASSES))]
        if patched:
            raise Reject("rejected", ["global_state_tampering"],
                         f"the candidate patched torch functions: {', '.join(sorted(patched)[:5])}")

    @contextlib.contextmanager
    def reference_context(self):
        """Run the reference with the snapshot's cudnn.benchmark, whatever the candidate chose."""
        cand = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        try:
            yield
        finally:
            torch.backends.cudnn.benchmark = cand


def poison_free_memory(device: torch.device) -> None:
    """Fill every free block of the CUDA caching allocator with NaN (no-op on CPU)."""
    if device.type != "cuda":
        return
    held = []
    try:
        for seg in torch.cuda.memory_snapshot():
            for blk in seg.get("blocks", []):
                if blk.get("state") == "inactive" and blk.get("size", 0) >= 512:
                    n = blk["size"] // 4
                    held.append(torch.full((n,), float("nan"), dtype=torch.float32, device=device))
    except RuntimeError:
        pass
    del held


def count_calls(cls) -> list[int]:
    """Count calls of `cls.forward` (the reference): a candidate must never reach the harness's copy."""
    counter = [0]
    orig = cls.forward

    def forward(self, *args, **kwargs):
        counter[0] += 1
        return orig(self, *args, **kwargs)

    cls.forward = forward
    return counter


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


def check_threads(state: "ProcessState", candidate_path: str) -> None:
    """Python threads started by candidate code and still alive after forward returned."""
    for t in threading.enumerate():
        if t.ident in state.threads or not t.is_alive():
            continue
        target = getattr(t, "_target", None)
        code = getattr(target, "__code__", None)
        run_code = getattr(type(t).run, "__code__", None)
        files = {getattr(code, "co_filename", None), getattr(run_code, "co_filename", None)}
        if candidate_path in files:
            raise Reject("rejected", ["thread_injection"],
                         f"a thread started by the candidate ({t.name}) is still running after forward returned")


def profile_kernels(fn, device: torch.device) -> set[str] | None:
    """Names of the GPU kernels `fn` launched (None where the profiler cannot see kernels)."""
    if device.type != "cuda":
        fn()
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA}
    except Exception:  # CUPTI unavailable: the caller falls back to call counting
        return None
    return names or None


class SpotChecker:
    """Cheap per-round check of a timed call's output: exact structure, values on a random sample.

    A cached or stale answer is wrong almost everywhere, so 64Ki random elements per round catch it
    with certainty while costing microseconds; any disagreement falls back to the full comparison.
    """

    def __init__(self, atol, rtol, seed: int = 0, sample: int = 1 << 16):
        self.atol, self.rtol, self.sample = atol, rtol, sample
        self.gen: dict[torch.device, torch.Generator] = {}
        self.seed = seed

    def agrees(self, ref, cand) -> bool:
        from kernelcraft.check import as_tensor_list, default_tolerance, is_plain_tensor

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
            tol = default_tolerance(r.dtype)
            a = tol if self.atol is None else self.atol
            rt = tol if self.rtol is None else self.rtol
            rd, cd = rf.double(), cf.double()
            scale = max(1.0, float(rd[torch.isfinite(rd)].pow(2).mean().sqrt())) if rd.numel() else 1.0
            ok = ((cd - rd).abs() <= a * scale + rt * rd.abs()) | ((cd == rd) | (torch.isnan(cd) & torch.isnan(rd)))
            if not bool(ok.all()):
                return False
        return True
