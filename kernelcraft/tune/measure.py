"""How the schedule game measures a configuration: on the GPU, from a recorded table, or from a model.

`TritonBackend` is the fast path, in the tuning process: each configuration is checked against the reference
with the judge's tolerance rule, then timed in paired rounds (`paired_time`); the score is the median
per-round speedup. It has no fresh worker, guards or trials: the judge does that for what `tuner` keeps.
`TableBackend` replays recorded measurements, `PredictedBackend` answers with a cost model; all three return
the same `Measurement`.

Rationale: docs/design/tune.md#measure
"""
from __future__ import annotations

import copy
import importlib.util
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from kernelcraft.search.recipes import tunable, tunetemplates

BIG = 1 << 30  # bytes: above this an input set is used alone and outputs are compared in slices


@dataclass
class Measurement:
    """One configuration's outcome. `speedup` (reference time / candidate time, paired) is the score;
    `reason` says why a failed one failed: invalid, compile_error, incorrect, runtime_error, unmeasured."""
    ok: bool
    ms: float | None = None
    ref_ms: float | None = None
    speedup: float | None = None
    reason: str = ""
    error: str = ""
    rounds: int = 0
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Measurement":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


class Backend(Protocol):
    kernel: tunable.Kernel
    shape: dict

    def measure(self, config: dict) -> Measurement: ...

    def features(self, config: dict) -> dict | None: ...


def paired_time(run_ref: Callable, run_cand: Callable, inputs: list, check: Callable, *, rounds: int,
                device, seed: int = 0, warmup: int = 1) -> dict:
    """{ref_ms, cand_ms, speedup, ratio_range, rounds} over `rounds` paired rounds after `warmup` checked pairs:
    reference and candidate in random order on the same inputs; on a GPU, L2 flushed and the device synchronised
    before each call and CUDA events around it (a wall clock otherwise); medians, the speedup the median
    per-round ratio. `check(ref_out, cand_out)` raises when a timed candidate output is wrong."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
        flush = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

    def timed(fn, args):
        if not cuda:
            t0 = time.perf_counter_ns()
            out = fn(args)
            return (time.perf_counter_ns() - t0) / 1e6, out
        flush.zero_()
        torch.cuda.synchronize(device)
        ev[0].record()
        out = fn(args)
        ev[1].record()
        torch.cuda.synchronize(device)
        return ev[0].elapsed_time(ev[1]), out

    rng = random.Random(seed)
    for i in range(warmup):
        check(run_ref(inputs[i % len(inputs)]), run_cand(inputs[i % len(inputs)]))
    refs, cands, ratios = [], [], []
    for i in range(rounds):
        args = inputs[i % len(inputs)]
        if rng.random() < 0.5:
            (r, r_out), (c, c_out) = timed(run_ref, args), timed(run_cand, args)
        else:
            (c, c_out), (r, r_out) = timed(run_cand, args), timed(run_ref, args)
        check(r_out, c_out)
        del r_out, c_out
        refs.append(r), cands.append(c), ratios.append(r / max(c, 1e-6))
    return {"ref_ms": statistics.median(refs), "cand_ms": statistics.median(cands),
            "speedup": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)], "rounds": rounds}


def _import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class TritonBackend:
    """Measures configurations of one match on a CUDA device (module docstring)."""

    def __init__(self, task, match: tunable.Match, *, device: str = "cuda", seed: int = 42, rounds: int = 5,
                 atol: float | None = None, rtol: float | None = None, workdir: str | os.PathLike | None = None):
        import torch

        from kernelcraft.task import load_task

        self.task, self.match = load_task(task), match
        self.kernel, self.shape = match.kernel, dict(match.shape)
        self.dev = torch.device(device)
        self.interpreted = interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # CPU interpreter: plumbing tests
        if (self.dev.type != "cuda" and not interpreted) or (self.dev.type == "cuda" and not torch.cuda.is_available()):
            raise RuntimeError("TritonBackend measures Triton kernels on a CUDA device "
                               "(or on the CPU under TRITON_INTERPRET=1, for tests of the plumbing)")
        self.rounds, self.atol, self.rtol, self.seed = rounds, atol, rtol, seed
        self.work = Path(workdir or tempfile.mkdtemp(prefix="kc-tune-"))
        self.work.mkdir(parents=True, exist_ok=True)
        tag = re.sub(r"\W", "_", self.kernel.key())
        ref_path = self.work / f"kc_tune_ref_{tag}.py"
        ref_path.write_text(self.task.source)
        ref_mod = _import_file(ref_path, ref_path.stem)
        with torch.device(self.dev):  # weights and inputs made on the device: GPU-sized tasks start fast
            torch.manual_seed(seed)
            init = list(ref_mod.get_init_inputs())
            torch.manual_seed(seed)
            self.ref = ref_mod.Model(*init).eval()
            self.inputs = []
            for s in (seed + 1, seed + 2):
                torch.manual_seed(s)
                self.inputs.append(list(ref_mod.get_inputs()))
                if sum(x.numel() * x.element_size() for x in self.inputs[0] if isinstance(x, torch.Tensor)) > BIG:
                    break  # one input set when a set is large (device memory); the L2 flush still applies
        run_path = self.work / f"kc_tune_run_{tag}.py"  # kernel on the lines the compile pool used (Triton's cache key)
        run_path.write_text(tunetemplates.runner_source(self.task.source, match))
        self.runner = _import_file(run_path, run_path.stem)
        self.cand = copy.copy(self.ref)  # the same parameters; only forward differs
        self.cand.__class__ = type("ModelNew", (type(self.ref),), {"forward": self.runner._kc_forward})
        with torch.no_grad():
            self.ref_out = [self.ref(*x) for x in self.inputs]
        self._sync()
        self._module = None
        self.known: dict[str, dict] = {}  # config key -> compiled features (or {"ok": False, "error"})

    def _sync(self) -> None:
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def _compare(self, ref, out):
        """The judge's comparison; a large single output in slices along its first dimension (the judge
        compares in float64, which would need several times the output's size at once), each slice
        against its own RMS scale."""
        from kernelcraft.judge.correctness.compare import compare_outputs

        import torch

        if not (isinstance(ref, torch.Tensor) and isinstance(out, torch.Tensor) and ref.numel() * 8 > BIG
                and ref.shape == out.shape and ref.dim() > 0):
            return compare_outputs(ref, out, self.atol, self.rtol)
        step = max(1, ref.shape[0] * (BIG // 8) // ref.numel())
        for i in range(0, ref.shape[0], step):
            res = compare_outputs(ref[i:i + step], out[i:i + step], self.atol, self.rtol)
            if not res.ok:
                return res
        return res

    def features(self, config: dict) -> dict | None:
        """Compiled features (compiled here unless `known` has them: `tuner` compiles every configuration in
        a process pool first)."""
        from kernelcraft.tune import features

        key = tunable.config_key(config)
        if self.interpreted and key not in self.known:
            return None  # the interpreter compiles nothing: no compiled features to read
        if key not in self.known:
            if self._module is None:
                self._module = features.load_module(self.kernel, self.work)
            self.known[key] = features.config_features(self._module, self.kernel, self.shape, config,
                                                       on_gpu=self.dev.type == "cuda")
        f = self.known[key]
        return f if f.get("ok") else None

    def measure(self, config: dict) -> Measurement:
        import torch

        reason = tunable.why_invalid(self.kernel, self.shape, config)
        if reason:
            return Measurement(False, reason="invalid", error=reason)
        known = self.known.get(tunable.config_key(config))
        if known is not None and not known.get("ok"):
            return Measurement(False, reason="compile_error", error=known.get("error", ""))
        self.runner._KC_CONFIG = dict(config)
        try:
            with torch.no_grad():
                out = self.cand(*self.inputs[0])
            self._sync()
        except Exception as e:  # noqa: BLE001 - a configuration that fails is a result
            kind = "compile_error" if "triton" in type(e).__module__ or "OutOfResources" in type(e).__name__ \
                else "runtime_error"
            return Measurement(False, reason=kind, error=f"{type(e).__name__}: {str(e)[:300]}")
        cmp = self._compare(self.ref_out[0], out)
        del out
        if not cmp.ok:
            return Measurement(False, reason="incorrect", error=cmp.message[:300])

        def spot(r, c):
            res = self._compare(r, c)
            if not res.ok:
                raise AssertionError(res.message)
        try:
            with torch.no_grad():
                t = paired_time(lambda a: self.ref(*a), lambda a: self.cand(*a), self.inputs, spot,
                                rounds=self.rounds, device=self.dev, seed=self.seed)
        except AssertionError as e:
            return Measurement(False, reason="incorrect", error=str(e)[:300])
        return Measurement(True, ms=t["cand_ms"], ref_ms=t["ref_ms"], speedup=t["speedup"], rounds=t["rounds"],
                           extra={"ratio_range": t["ratio_range"]})

    def close(self) -> None:
        import torch

        self.ref = self.cand = self.inputs = self.ref_out = None
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()


class TableBackend:
    """Replays recorded measurements: `records` are {"config": {...}, **Measurement fields, "features": {...}}."""

    def __init__(self, kernel: tunable.Kernel, shape: dict, records: list[dict]):
        self.kernel, self.shape = kernel, dict(shape)
        self._m = {tunable.config_key(r["config"]): r for r in records}

    def measure(self, config: dict) -> Measurement:
        r = self._m.get(tunable.config_key(config))
        if r is None:
            return Measurement(False, reason="unmeasured", error="no recorded measurement")
        return Measurement.from_json(r)

    def features(self, config: dict) -> dict | None:
        r = self._m.get(tunable.config_key(config))
        return (r or {}).get("features")

    def best(self) -> tuple[dict, float]:
        """(configuration, speedup) of the fastest recorded configuration."""
        ok = [r for r in self._m.values() if r.get("ok") and r.get("speedup")]
        if not ok:
            raise ValueError("no successful measurement in the table")
        r = max(ok, key=lambda r: r["speedup"])
        return dict(r["config"]), float(r["speedup"])


class PredictedBackend:
    """A cost model as the measurement: `predict(configs) -> runtimes (ms)` (a simulator for agents).
    Speedups are against `ref_ms` (any constant: only ratios enter the reward)."""

    def __init__(self, kernel: tunable.Kernel, shape: dict, predict: Callable[[list[dict]], list[float]],
                 features: Callable[[dict], dict | None] | None = None, ref_ms: float = 1.0):
        self.kernel, self.shape = kernel, dict(shape)
        self._predict, self._features, self.ref_ms = predict, features, ref_ms
        self._cache: dict[str, float] = {}

    def prime(self, configs: list[dict]) -> None:
        """Predict many configurations in one call (the model is faster batched)."""
        todo = [c for c in configs if tunable.config_key(c) not in self._cache]
        for c, ms in zip(todo, self._predict(todo) if todo else []):
            self._cache[tunable.config_key(c)] = float(ms)

    def measure(self, config: dict) -> Measurement:
        reason = tunable.why_invalid(self.kernel, self.shape, config)
        if reason:
            return Measurement(False, reason="invalid", error=reason)
        self.prime([config])
        ms = self._cache[tunable.config_key(config)]
        if not (ms > 0 and math.isfinite(ms)):
            return Measurement(False, reason="runtime_error", error=f"predicted {ms}")
        return Measurement(True, ms=ms, ref_ms=self.ref_ms, speedup=self.ref_ms / ms)

    def features(self, config: dict) -> dict | None:
        return self._features(config) if self._features else None
