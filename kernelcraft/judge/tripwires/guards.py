"""Candidate-side tripwires on process state: what the candidate did to its own process (names, not proof).

`ProcessState.capture()` snapshots precision switches, thread count, default dtype, grad mode and the identities of
clocks, torch callables and harness modules before the candidate is imported; `verify()` compares at every audit.
Precision switches and the thread count are rejected, not restored. Run in the candidate's process, these are
trusted only as bad news. (The output snapshot and kernel evidence are in `calls`.)

Rationale: docs/design/judge-tripwires.md#guards
"""
from __future__ import annotations

import os
import sys
import threading
import time
import types

import torch
import torch.nn.functional as F

from kernelcraft.judge.correctness import compare
from kernelcraft.judge.speed import timing
from kernelcraft.judge.process.procs import WORKER_TAG_VAR, descendants, tagged_processes
from kernelcraft.judge.reject import Reject  # noqa: F401  (raised here; also importable as `guards.Reject`)


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
        "mkldnn.enabled": b.mkldnn.enabled,
        "opt_einsum.enabled": getattr(getattr(b, "opt_einsum", None), "enabled", None),
    }
    # scaled-dot-product-attention backends: disabling the fast ones slows the reference's attention
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled"):
        fn = getattr(b.cuda, name, None)
        if fn is not None:
            flags[f"cuda.{name}"] = fn()
    for name in ("preferred_linalg_library", "preferred_blas_library"):
        fn = getattr(b.cuda, name, None)
        if fn is not None:
            try:
                flags[f"cuda.{name}"] = str(fn())
            except Exception:  # noqa: BLE001 - not available on this build
                pass
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
    ids: dict[str, object] = {}
    for prefix, ns in (("torch.", torch), ("F.", F), ("_C._nn.", torch._C._nn),
                       ("_C._VariableFunctions.", torch._C._VariableFunctions), ("torch.linalg.", torch.linalg),
                       ("torch.fft.", torch.fft), ("torch.special.", torch.special),
                       ("kernelcraft.judge.speed.timing.", timing), ("kernelcraft.judge.correctness.compare.", compare)):
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


def _code_in_module(code, mod) -> bool:
    """Is `code` (by identity) the code of a function defined in `mod`, or nested in one?"""
    todo = []
    for v in vars(mod).values():
        for f in ([v] + (list(vars(v).values()) if isinstance(v, type) else [])):
            f = getattr(f, "__func__", f)
            if isinstance(f, types.FunctionType) and f.__module__ == mod.__name__:
                todo.append(f.__code__)
    while todo:
        c = todo.pop()
        if c is code:
            return True
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return False


def _same_function(now, orig) -> bool:
    """Identical, or torch's own wrapper around the original: torch._dynamo, imported by torch.compile or the
    profiler, wraps e.g. manual_seed and patches nn.Module.__init__. Accepted only if the wrapper's code object
    *is* one of a torch module's (a file name and __wrapped__ are forgeable: compile() takes any filename), its
    globals are that module's, and every callable it closes over is the original itself."""
    if now is orig:
        return True
    code, glb = getattr(now, "__code__", None), getattr(now, "__globals__", None)
    if code is None or glb is None:
        return False
    mod = sys.modules.get(glb.get("__name__", ""))
    if mod is None or vars(mod) is not glb or not mod.__name__.startswith("torch."):
        return False
    try:
        called = [c.cell_contents for c in (now.__closure__ or ()) if callable(c.cell_contents)]
    except ValueError:  # an empty cell
        return False
    return bool(called) and all(c is orig for c in called) and _code_in_module(code, mod)


# Modules whose every attribute is snapshot (`_harness_surface`): the harness code that runs beside the
# candidate in the worker, and json (the result channel's serialiser). Names, not imports: a module not
# loaded in a given worker is skipped, so tests/test_architecture.py imports every name here — a stale
# name after a move would otherwise silently shrink what this guard watches.
HARNESS_MODULES = ("kernelcraft.judge.speed.timing", "kernelcraft.judge.correctness.compare",
                   "kernelcraft.judge.tripwires.guards", "kernelcraft.judge.tripwires.calls",
                   "kernelcraft.judge.tripwires.kerneltrace", "kernelcraft.judge.process.procs",
                   "kernelcraft.judge.process.worker", "kernelcraft.judge.process.side",
                   "kernelcraft.judge.process.wire", "kernelcraft.judge.process.arena",
                   "kernelcraft.judge.process.isolation", "kernelcraft.judge.process.freeze",
                   "kernelcraft.judge.process.audit", "kernelcraft.judge.process.modelstate",
                   "kernelcraft.judge.process.sideproc", "kernelcraft.judge.correctness.weights",
                   "kernelcraft.judge.correctness.weightdraw", "kernelcraft.judge.correctness.precision",
                   "kernelcraft.judge.correctness.partial", "kernelcraft.judge.correctness.acceptance",
                   "kernelcraft.judge.correctness.trials", "kernelcraft.judge.process.jobs",
                   "kernelcraft.judge.process.forker", "kernelcraft.judge.speed.siblings",
                   "kernelcraft.judge.speed.rounds", "kernelcraft.judge.speed.treecpu", "kernelcraft.judge.reject",
                   "kernelcraft.builder.cache", "__main__", "json", "json.encoder")


def _harness_surface(ref_mod) -> dict[str, object]:
    """The harness's own modules and the reference module: every attribute, and every class attribute of
    classes defined there. A candidate reaching them through sys.modules must not change anything."""
    out: dict[str, object] = {}
    mods = [(n, sys.modules.get(n)) for n in HARNESS_MODULES]
    mods.append(("reference", ref_mod))
    for name, mod in mods:
        if mod is None:
            continue
        for k, v in list(vars(mod).items()):
            if k.startswith("__") or isinstance(v, types.ModuleType):
                continue
            out[f"{name}.{k}"] = v
            if isinstance(v, type) and getattr(v, "__module__", None) == mod.__name__:
                for ck, cv in _class_attrs(v).items():
                    out[f"{name}.{k}.{ck}"] = cv
    tracer = getattr(sys.modules.get("kernelcraft.judge.tripwires.kerneltrace"), "_TRACER", None)
    if tracer is not None:  # strict mode's kernel tracer: its state too (a patched instance method, say)
        out.update({f"kerneltrace.tracer.{k}": v for k, v in vars(tracer).items() if k not in ("_names", "_buffers")})
    import torch.utils.cpp_extension as cpp_ext

    out["cpp_extension.load_inline"], out["cpp_extension.load"] = cpp_ext.load_inline, cpp_ext.load
    return out


# attributes torch itself adds to these classes on first use of torch.compile
TORCH_ADDED_ATTRS = {"nn.Module.___needs_generation_tag_patch"}


class ProcessState:
    def __init__(self):
        self.flags = _precision_flags()
        self.timers = {f"{getattr(o, '__name__', o)}.{n}": getattr(o, n) for o, n in _TIMERS}
        self.surface = _surface()
        self.cudnn_benchmark = torch.backends.cudnn.benchmark
        self.threads = {t.ident for t in threading.enumerate()}
        self.harness: dict[str, object] = {}
        self.ref_mod = None

    @classmethod
    def capture(cls) -> "ProcessState":
        return cls()

    def watch_harness(self, ref_mod) -> None:
        """Snapshot the harness modules and the reference module (after the worker's own patches, e.g. the
        build cache's load_inline), just before the candidate is imported."""
        self.ref_mod = ref_mod
        self.harness = _harness_surface(ref_mod)

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
        patched += [k for k in surface if k not in self.surface and k.startswith(tuple(p for p, _ in SURFACE_CLASSES))
                    and k not in TORCH_ADDED_ATTRS]
        if patched:
            raise Reject("rejected", ["global_state_tampering"],
                         f"the candidate patched torch functions: {', '.join(sorted(patched)[:5])}")
        if self.harness:
            now_h = _harness_surface(self.ref_mod)
            changed = sorted(k for k in set(self.harness) | set(now_h) if now_h.get(k) is not self.harness.get(k))
            if changed:
                code = "timer_tampering" if any(k.startswith("kernelcraft.judge.speed.timing.") for k in changed) \
                    else "global_state_tampering"
                raise Reject("rejected", [code], "the candidate patched the harness or the reference: "
                             + ", ".join(changed[:5]))


def check_hooks() -> None:
    """Interpreter hooks (sys.setprofile/settrace, sys.monitoring) let code run later, inside the harness,
    outside the timed region. None may be installed when a candidate call returns. Only C calls here:
    a profile hook that waits for the harness's next Python call never gets one."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        raise Reject("rejected", ["global_state_tampering"],
                     "the candidate installed an interpreter hook (sys.setprofile/settrace)")
    mon = getattr(sys, "monitoring", None)
    if mon is not None and any(mon.get_tool(i) is not None for i in range(6)):
        raise Reject("rejected", ["global_state_tampering"],
                     "the candidate registered a sys.monitoring tool")
    # a TorchFunctionMode / TorchDispatchMode left pushed runs candidate code in every later torch call
    # (the harness's snapshot and comparison included): a lazy output is filled in there
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        raise Reject("rejected", ["global_state_tampering"],
                     "the candidate left a torch function/dispatch mode pushed after forward returned")


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


def check_escaped_processes(exclude: frozenset[int] = frozenset()) -> None:
    """Processes started by the candidate that left the worker's session (setsid, daemonised): killpg
    cannot reach them, so they would outlive the evaluation. `exclude`: the judge's own processes (the judge
    and the other side carry the same tag when the judge was spawned, and live in sessions of their own)."""
    tag = os.environ.get(WORKER_TAG_VAR)
    if not tag:
        return
    sid = os.getsid(0)
    escaped = []
    # tagged: started through exec with our environment; descendants: forked without exec (a forked
    # worker is a child subreaper, so detached ones stay in its tree)
    for pid in sorted((set(tagged_processes(tag)) | set(descendants(os.getpid()))) - set(exclude)):
        try:
            if os.getsid(pid) != sid:
                escaped.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    if escaped:
        raise Reject("rejected", ["thread_injection"],
                     f"the candidate started processes that left the worker's session (pids {escaped[:5]})")
