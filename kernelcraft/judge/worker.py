"""The worker: one fresh process per evaluation, where candidate code runs. Never imported by callers.

Design decisions
- One evaluation per process, in its own process group: forked by the `zygote` (torch and this module
  imported, nothing else run, no CUDA yet) or, where that is off, spawned as `python -m kernelcraft.judge.worker`.
  Either way a fresh CUDA context. A candidate can poison its process (patched modules, a faulted CUDA
  context, leaked threads), so nothing outlives it.
- Order matters. Clocks and the torch functions the harness relies on are bound (by importing
  `timing`) and process state is snapshot before the reference or candidate is imported.
- The job comes on stdin, which is closed before candidate code runs; results go back as JSON lines on
  a private pipe, each carrying the job's nonce, so text a candidate prints (or writes to stdout)
  is never mistaken for a result. Each phase is announced first, so when the process dies the caller
  knows where (build → compile_error, later → runtime_error).
- The device lock (a flock per GPU) covers timing by default. With `lock_scope="device"` the worker takes
  it (phase `wait_device`) before importing the candidate, or after it when the import compiles an
  extension (nvcc stays off the lock), and holds it until it exits: construction, checks (and any
  compile or autotuning they trigger) and timing never run beside another evaluation's GPU work, while
  the next worker's start-up overlaps this one. Exiting frees the flock, whatever happened.
- Inputs and constructor args come from the reference module only. Both models are constructed after
  seeding the same seed (identical weights); each side gets its own copy of every input.
- In strict mode on a GPU, the kernel tracer (which shows whose kernels ran: CUPTI through `kerneltrace`,
  else torch.profiler) is started right after CUDA init, before the lock (phase `warmup`). No other GPU
  work happens off the lock: it perturbs the timing of the worker holding it.
- One module, past the ~400-line guideline on purpose: everything that runs beside candidate code is in
  the harness snapshot (`guards._harness_surface`) and in the functions `main` binds before the candidate
  exists; splitting it would spread that surface over more modules to keep in step.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback

faulthandler.enable()

from kernelcraft.judge import timing  # noqa: E402  (binds clocks before anything else)

import contextlib  # noqa: E402
import copy  # noqa: E402
import fcntl  # noqa: E402
import importlib.util  # noqa: E402
import inspect  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from kernelcraft.judge import guards, tripwires  # noqa: E402
from kernelcraft.builder.cache import BuildCache  # noqa: E402
from kernelcraft.devices import arch_for  # noqa: E402
from kernelcraft.judge.compare import compare_outputs  # noqa: E402
from kernelcraft.judge.guards import Reject  # noqa: E402

_MAX_MSG = 4000


class Channel:
    def __init__(self, fd: int, nonce: str):
        self._f = os.fdopen(fd, "w", buffering=1)
        self._nonce = nonce

    def send(self, kind: str, **data) -> None:
        self._f.write(json.dumps({"nonce": self._nonce, "type": kind, **data}, default=str) + "\n")
        self._f.flush()


def _import_file(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _preload(modules) -> None:
    """Import trusted libraries the candidate names (triton: ~0.5 s) before the device lock is taken."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed or broken: the candidate's own import will say so
            pass


def _to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(o, device) for o in obj)
    return obj


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o) for o in obj)
    return copy.deepcopy(obj)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _copy_into(dst, src) -> None:
    for d, s in zip(dst, src):
        if isinstance(d, torch.Tensor):
            d.copy_(s)


def _trim(text: str) -> str:
    return text if len(text) <= _MAX_MSG else text[: _MAX_MSG // 2] + "\n...\n" + text[-_MAX_MSG // 2:]


def describe_exception(exc: BaseException, candidate_path: str | None = None) -> str:
    """The exception and the frames in the candidate's own file (where the model can act)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if candidate_path and f.filename == candidate_path]
    lines = [f"{type(exc).__name__}: {exc}"]
    for f in own[-4:]:
        lines.append(f"  candidate line {f.lineno}, in {f.name}: {(f.line or '').strip()}")
    return _trim("\n".join(lines))


def classify(exc: BaseException, phase: str, candidate_path: str, build: BuildCache) -> Reject:
    if isinstance(exc, Reject):
        return exc
    if build.failure is not None and phase == "import":
        return Reject("compile_error", ["build_failed"], _trim(build.failure.log))
    if isinstance(exc, SyntaxError) and phase == "import":
        return Reject("compile_error", ["parse_error"], f"SyntaxError: {exc.msg} (line {exc.lineno})")
    text = f"{type(exc).__name__}: {exc}"
    msg = describe_exception(exc, candidate_path)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text:
        return Reject("runtime_error", ["out_of_memory"], f"out of memory during {phase}: {msg}")
    if "CUDA error" in text or "cudaError" in text or type(exc).__name__ == "AcceleratorError":
        return Reject("runtime_error", ["cuda_error"], f"CUDA error during {phase}: {msg}")
    return Reject("runtime_error", ["exception"], f"exception during {phase}: {msg}")


class Evaluation:
    def __init__(self, job: dict, chan: Channel):
        self.job, self.chan = job, chan
        self.phase = "start"
        self.device_lock = None
        self.device = torch.device("cuda:0" if job["device"].startswith("cuda") else "cpu")
        cap = torch.cuda.get_device_capability(0) if self.device.type == "cuda" else None
        self.build = BuildCache(Path(job["cache_dir"]) / "ext", job.get("arch") or arch_for(cap))
        self.candidate_path = job["candidate_path"]
        self.p = job["protocol"]  # the resolved Protocol (kernelcraft.protocol): every knob set, no defaults here
        self.guarded = self.p["runtime_guards"]  # off only to measure the guards' own cost
        self.result: dict = {"guards": [], "env": {
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "gpu": torch.cuda.get_device_name(0) if self.device.type == "cuda" else None}}

    def enter(self, phase: str, **data) -> None:
        self.phase = phase
        self.chan.send("phase", phase=phase, build_s=self.build.build_s, **data)

    # -- phases ------------------------------------------------------------------------------------
    def run(self) -> dict:
        job = self.job
        if self.device.type == "cuda":  # phases of their own, so a verdict shows where start-up time goes
            self.enter("start")  # interpreter and imports done (`spawn`); the CUDA context next
            torch.cuda.set_device(self.device)
            torch.cuda.init()
            if self.p["mode"] == "strict":  # start the kernel tracer (and prove it on a probe kernel)
                self.enter("warmup")  # before the lock
                tripwires.profile_kernels(lambda: torch.zeros(1, device=self.device), self.device)
                self.result["env"]["kernel_tracer"] = tripwires.kernel_tracer_status()
            # Nothing else runs on the GPU before the lock: loading the harness's own kernels here (~0.2 s
            # on the lock otherwise) slowed other workers' timing (H100: time phase 0.43 -> 0.75 s, see
            # BENCHMARKS.md), so one-time costs of checks stay on the lock.
        self.enter("reference")
        try:
            self.ref_mod = _import_file(job["task_path"], "kernelcraft_reference")
        except Exception as e:
            raise Reject("runtime_error", ["task_error"], "the reference task failed to import: "
                         + describe_exception(e)) from None
        try:
            self.state = guards.ProcessState.capture()
        except Exception as e:
            raise Reject("runtime_error", ["harness_error"], "kernelcraft failed to snapshot process state: "
                         + describe_exception(e)) from None
        self.ref_trap = tripwires.ReferenceTrap(self.ref_mod)
        self.build.install(count_calls=self.p["mode"] == "strict")
        self.state.watch_harness(self.ref_mod)
        verify = guards.ProcessState.verify  # a local: out of reach of a candidate patching the harness
        # hold the device from construction to the end of timing; from before the import too when the
        # import compiles nothing, so code the candidate runs at import never overlaps another's timing
        device_scope = job.get("lock_scope") == "device"
        if device_scope and not job.get("needs_build", True):
            _preload(job.get("preload", ()))
            self._take_device()
        self.enter("import")
        cand_mod = _import_file(self.candidate_path, "kernelcraft_candidate")
        self.result["build_cache"] = {"builds": self.build.builds, "hits": self.build.hits}
        if not isinstance(getattr(cand_mod, "ModelNew", None), type):
            raise Reject("compile_error", ["no_modelnew"], "the candidate defines no class ModelNew")
        if device_scope and self.device_lock is None:  # nvcc at import ran off the lock
            self._take_device()
        self.enter("init")
        self.ref_model, self.cand_model = self._construct(self.ref_mod.Model, cand_mod.ModelNew)
        self.enter("check")
        self._check()
        if self.p["timing"]:
            self.enter("time")
            self._time()
        verify(self.state, self.result)  # once more, through the binding made before the candidate existed
        return self.result

    def _take_device(self) -> None:
        self.enter("wait_device")
        self.device_lock = _device_lock(self.job.get("lock_path")).__enter__()  # freed when the process exits

    def build_only(self) -> dict:
        """Import the candidate only, so its inline extensions land in the build cache (no GPU needed:
        the arch list comes with the job). Other import errors are left for the real evaluation."""
        self.build.install()
        self.enter("import")
        try:
            _import_file(self.candidate_path, "kernelcraft_candidate")
        except BaseException as e:  # noqa: BLE001
            if self.build.failure is not None:
                raise
            self.result["import_error"] = describe_exception(e, self.candidate_path)
        self.result["build_cache"] = {"builds": self.build.builds, "hits": self.build.hits}
        return self.result

    def probe(self) -> dict:
        """Is the task degenerate? Run only the reference: constant, near-zero, or input/weight-blind output."""
        self.enter("reference")
        self.ref_mod = _import_file(self.job["task_path"], "kernelcraft_reference")
        self.enter("probe")
        seed = self.p["seed"]

        def run(weight_seed, input_seed):
            torch.manual_seed(weight_seed)
            model = self.ref_mod.Model(*self.ref_mod.get_init_inputs()).to(self.device)
            with torch.no_grad():
                out = model(*self.make_inputs(input_seed))
            outs = [o.detach().double().cpu().flatten() for o in ([out] if isinstance(out, torch.Tensor) else out)
                    if isinstance(o, torch.Tensor)]
            return model, torch.cat(outs) if outs else torch.zeros(0)

        model, a = run(seed, seed + 1)
        _, b = run(seed, seed + 2)
        _, c = run(seed + 3, seed + 1)
        problems = []
        finite = a[torch.isfinite(a)]
        if a.numel() == 0:
            problems.append("the reference returns no tensor")
        elif finite.numel() < a.numel():
            problems.append(f"{a.numel() - finite.numel()} of {a.numel()} outputs are NaN/Inf")
        if finite.numel():
            scale = float(finite.abs().max())
            spread = float(finite.std()) if finite.numel() > 1 else 0.0
            if scale < 1e-6:
                problems.append(f"output is near zero (max |y| = {scale:.2g})")
            elif spread <= 1e-7 * scale:
                problems.append("output is constant")
            if a.shape == b.shape and torch.allclose(a, b, rtol=1e-6, atol=1e-9 * max(scale, 1.0), equal_nan=True):
                problems.append("output does not depend on the inputs")
            if any(p.numel() for p in model.parameters()) and a.shape == c.shape and torch.allclose(
                    a, c, rtol=1e-6, atol=1e-9 * max(scale, 1.0), equal_nan=True):
                problems.append("output does not depend on the weights")
        return {"problems": problems, "output_elements": int(a.numel()),
                "output_std": float(finite.std()) if finite.numel() > 1 else 0.0,
                "output_max_abs": float(finite.abs().max()) if finite.numel() else 0.0}

    def _construct(self, Model, ModelNew):
        seed = self.p["seed"]
        torch.manual_seed(seed)
        init = list(self.ref_mod.get_init_inputs())
        for cls, what in ((ModelNew, "ModelNew"),):
            try:
                inspect.signature(cls).bind(*init)
            except TypeError as e:
                raise Reject("rejected", ["signature_mismatch"],
                             f"{what}({', '.join(type(a).__name__ for a in init)}) does not fit its constructor: {e}")
            except ValueError:
                pass
        torch.manual_seed(seed)
        ref = Model(*_clone(init)).to(self.device)
        self.phase = "init"
        torch.manual_seed(seed)
        cand = ModelNew(*_clone(init))
        cand = cand.to(self.device) if isinstance(cand, torch.nn.Module) else cand
        return ref, cand

    def make_inputs(self, seed: int):
        """The reference's get_inputs(), seeded, created directly on the device (fast for big inputs)."""
        torch.manual_seed(seed)
        with torch.device(self.device):
            inputs = self.ref_mod.get_inputs()
        if not isinstance(inputs, (list, tuple)):
            raise Reject("runtime_error", ["task_error"], "the task's get_inputs() must return a list")
        return _to_device(list(inputs), self.device)

    def _call(self, model, args):
        with torch.no_grad():
            return model(*args)

    def run_ref(self, args):
        with self.state.reference_context():
            return self._call(self.ref_model, args)

    def _prepare_side(self, side: str) -> None:
        """Outside the timed region: the reference runs with the snapshot's cudnn.benchmark."""
        if side == "ref":
            self.state.enter_reference()
        else:
            self.state.leave_reference()

    def run_cand(self, args):
        out = self._call(self.cand_model, args)
        if self.guarded:
            guards.check_hooks()
        return out

    def _check(self) -> None:
        trials = self.p["trials"]
        passed, max_abs, max_rel, atol, rtol = 0, 0.0, 0.0, None, None
        prev_cand = None
        guarded = self.guarded
        self.result["guards"] += ["inputs_from_reference", "input_mutation"] + (
            ["output_snapshot", "poison", "threads", "spot_check"] if guarded else [])
        for t in range(trials):
            inputs = self.make_inputs(self.p["seed"] + 1 + t)
            ref_in, cand_in = _clone(inputs), _clone(inputs)
            if t == 0:
                self._check_forward_signature(cand_in)
            if t % 2 == 0:  # alternate who runs first: leftovers of one side never help the other
                ref_out = self.run_ref(ref_in)
                if guarded:
                    guards.poison_free_memory(self.device)
                cand_out, snap = self._run_cand_snapshot(cand_in)
            else:
                cand_out, snap = self._run_cand_snapshot(cand_in)
                ref_out = self.run_ref(ref_in)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            if guarded:
                self.state.verify(self.result)
                guards.check_threads(self.state, self.candidate_path)
                guards.check_escaped_processes()
            if not _same(cand_in, inputs) and _same(ref_in, inputs):
                raise Reject("incorrect", ["input_mutation"], f"trial {t + 1}: the candidate modified its inputs")
            if snap is not None and not tripwires.same_values(snap, cand_out):
                code = "extra_stream" if self.device.type == "cuda" else "thread_injection"
                raise Reject("rejected", [code], f"trial {t + 1}: the output changed after forward returned "
                             "(work still running on another stream or thread)")
            cmp = compare_outputs(ref_out, cand_out, self.p["atol"], self.p["rtol"])
            max_abs, max_rel = max(max_abs, cmp.max_abs_err), max(max_rel, cmp.max_rel_err)
            atol, rtol = cmp.atol if cmp.atol is not None else atol, cmp.rtol if cmp.rtol is not None else rtol
            self.result["correctness"] = dict(trials=trials, passed=passed, max_abs_err=max_abs,
                                              max_rel_err=max_rel, atol=atol, rtol=rtol)
            if not cmp.ok:
                if prev_cand is not None and "value_mismatch" in cmp.reasons and tripwires.same_values(prev_cand, cand_out):
                    raise Reject("incorrect", ["stale_output"], f"trial {t + 1}: the candidate returned the "
                                 "previous trial's output for new inputs (a cached answer)")
                raise Reject("incorrect", cmp.reasons, f"trial {t + 1} of {trials}: {cmp.message}")
            passed += 1
            self.result["correctness"]["passed"] = passed
            prev_cand = snap if snap is not None else _clone(cand_out)
            del ref_out, cand_out
        if self.p["mode"] == "strict":
            self._check_own_kernel(self.make_inputs(self.p["seed"] + 99))

    def _check_forward_signature(self, args) -> None:
        fwd = self.cand_model.forward if isinstance(self.cand_model, torch.nn.Module) else self.cand_model
        try:
            inspect.signature(fwd).bind(*args)
        except TypeError as e:
            raise Reject("rejected", ["signature_mismatch"],
                         f"ModelNew.forward does not take the reference's {len(args)} inputs: {e}") from None
        except ValueError:
            pass

    def _run_cand_snapshot(self, args):
        """Call the candidate and copy its outputs at once, on the current stream, without any sync:
        an output that is still being written elsewhere differs from the copy later."""
        try:
            with tripwires.watch_calls(self.ref_mod.Model) as ref_calls, self.ref_trap.armed():
                out = self.run_cand(args)
                snap = _clone(out) if self.guarded and isinstance(out, (torch.Tensor, list, tuple)) else None
        except RuntimeError as e:
            if tripwires.REFERENCE_CALLED in str(e):
                raise Reject("rejected", ["reference_call"], "the candidate ran the reference Model's code") from None
            raise
        if ref_calls[0]:
            raise Reject("rejected", ["reference_call"], "the candidate called the harness's reference Model")
        return out, snap

    def _check_own_kernel(self, args) -> None:
        """Strict mode: an own kernel (inline extension or Triton) must run on the measured path."""
        self.result["guards"].append("own_kernel")
        names = self.job.get("kernel_names") or []
        counts = self.build.call_counts
        before = dict(counts)
        kernels = tripwires.profile_kernels(lambda: self.run_cand(args), self.device)
        ran_ext = any(counts.get(k, 0) > before.get(k, 0) for k in counts)
        if kernels is not None and self.device.type == "cuda":
            own = [k for k in kernels if any(n in k for n in names)]
            ok = bool(own)
            evidence = f"kernels that ran: {', '.join(sorted(kernels)[:6]) or 'none'}"
        else:
            ok = ran_ext
            evidence = "no call into an inline extension or Triton kernel was seen"
        if not ok:
            raise Reject("rejected", ["no_custom_kernel"],
                         f"strict mode: no kernel of the candidate's own ran in forward ({evidence})")

    def _timing_inputs(self):
        """A pool of distinct input sets, copied each round into fixed-address buffers per side."""
        first = self.make_inputs(self.p["seed"] + 1000)
        nbytes = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
        limit = self.p["input_pool_bytes"]
        k = max(2, min(self.p["input_sets"], limit // max(nbytes, 1)))
        pool = [first] + [self.make_inputs(self.p["seed"] + 1001 + j) for j in range(k - 1)]
        ref_buf, cand_buf = _clone(first), _clone(first)
        rng = random.Random(self.p["seed"])
        last = [-1]

        def next_inputs(i: int):
            j = rng.randrange(len(pool) - 1)
            j = j + 1 if j >= last[0] >= 0 else j  # never the same set twice in a row
            last[0] = j
            # values never seen before: a random convex mix of two pool sets (ranges and signs preserved), so
            # a cache keyed on input values never hits; integer/bool inputs are copied as they are
            j2 = (j + 1 + rng.randrange(len(pool) - 1)) % len(pool)
            w = rng.uniform(0.05, 0.95)
            for d, x, y in zip(ref_buf, pool[j], pool[j2]):
                if isinstance(d, torch.Tensor):
                    if d.is_floating_point():
                        torch.lerp(x, y, w, out=d)
                    else:
                        d.copy_(x)
            _copy_into(cand_buf, ref_buf)
            return ref_buf, cand_buf

        return next_inputs, len(pool)

    def _time(self) -> None:
        job = self.job
        t_opts = dict(budget_s=self.p["time_budget_s"], target=self.p["target_ci"], min_rounds=self.p["min_rounds"])
        next_inputs, pool_size = self._timing_inputs()
        atol, rtol = self.p["atol"], self.p["rtol"]
        mismatches = []

        sampler = tripwires.SpotChecker(atol, rtol, seed=self.p["seed"])

        def spot_check(ref_out, cand_out):
            if not self.guarded:
                return
            if sampler.agrees(ref_out, cand_out):
                return
            cmp = compare_outputs(ref_out, cand_out, atol, rtol)
            if cmp.ok:
                return
            if not cmp.ok:
                mismatches.append(cmp)
                raise Reject("incorrect", ["stale_output"] if "value_mismatch" in cmp.reasons else cmp.reasons,
                             "an output of a timed call was wrong (the answer did not follow fresh inputs): "
                             + cmp.message)

        with contextlib.nullcontext() if self.device_lock else _device_lock(job.get("lock_path")):
            clock = timing.Clock(self.device)
            res = timing.measure(
                clock, lambda a: self._call(self.ref_model, a), self.run_cand, next_inputs, spot_check, seed=self.p["seed"],
                prepare=self._prepare_side, **t_opts)
        self.state.verify(self.result)
        rec = res.record()
        rec["pool_sets"] = pool_size
        self.result["timing"] = rec


class _device_lock:
    """Exclusive use of the device while timing, across processes (a flock: freed if we die)."""

    def __init__(self, path: str | None):
        self.path = path
        self.f = None

    def __enter__(self):
        if self.path:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self.f = open(self.path, "w")
            fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.f:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()


def main(chan_fd: int | None = None) -> None:
    """Read the job from stdin, evaluate, send the result on the channel (`chan_fd`, else the job's fd)."""
    # Bound before any candidate code runs: a candidate that patches this module (it is `__main__`) or
    # the guards through sys.modules cannot change how its outcome is classified or what is sent.
    classify_, send, verify, reject = classify, Channel.send, guards.ProcessState.verify, Reject
    job = json.loads(sys.stdin.readline())
    sys.stdin.close()
    os.close(0)
    nonce = job.pop("nonce")
    fd = job.pop("fd") if chan_fd is None else chan_fd
    # If the harness is found tampered with, nothing Python-level can be trusted to write the verdict
    # (the candidate may have patched the serialiser itself): that line is encoded now and written with a
    # raw os.write bound now, its message filtered to plain characters by C-level str methods.
    write, exit_ = os.write, os._exit
    head, mid, tail = (json.dumps({"nonce": nonce, "type": "result", "result": {
        "status": "rejected", "reasons": ["@@"], "guards": ["process_state"],
        "message": "@@"}}) + "\n").encode().split(b"@@")
    plain = str.maketrans("", "", "".join(chr(c) for c in range(128) if not (chr(c).isalnum() or chr(c) in " ._,:;()[]/=+-'")))
    chan = Channel(fd, nonce)
    del nonce
    ev = Evaluation(job, chan)
    t0 = time.perf_counter()
    try:
        result = ev.probe() if job.get("probe") else ev.build_only() if job.get("build_only") else ev.run()
        out = {"status": "correct", "reasons": [], "message": "", **result}
    except BaseException as e:  # noqa: BLE001 - every failure becomes a verdict
        rej = classify_(e, ev.phase, ev.candidate_path, ev.build)
        out = {"status": rej.status, "reasons": rej.reasons, "message": rej.message, **ev.result}
        if ev.device.type == "cuda" and "cuda_error" in rej.reasons:
            out["context_poisoned"] = True
    state = getattr(ev, "state", None)
    if state is not None and out["status"] != "correct":  # run() ends with this check; a failure skips it
        tampered = None
        try:
            verify(state)
        except reject as r:
            tampered = (r.reasons, r.message)
        except BaseException:  # noqa: BLE001 - a harness that cannot check itself was tampered with
            tampered = (["global_state_tampering"], "the harness's state check failed after the candidate ran")
        if tampered is not None:
            codes = '", "'.join(c.translate(plain) for c in tampered[0][:4]) or "global_state_tampering"
            write(fd, head + codes.encode("ascii", "replace") + mid
                  + tampered[1][:400].translate(plain).encode("ascii", "replace") + tail)
            exit_(0)
    out.update(build_s=ev.build.build_s, worker_s=time.perf_counter() - t0, phase=ev.phase)
    out.setdefault("build_cache", {"builds": ev.build.builds, "hits": ev.build.hits})
    send(chan, "result", result=out)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate threads/atexit hooks cannot change the outcome


if __name__ == "__main__":
    main()
