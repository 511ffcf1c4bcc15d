"""A side: the process that runs one model (the reference, or the candidate) for the judge, and nothing else.

Forked by the judge before it touches CUDA, a side serves commands from its wire (import, construct, map arenas,
run, report). It holds no clock, no other side's data and no verdict; the candidate's side never sees the
reference module or the input seeds. A run copies every output into the judge's arena and syncs the device inside
the timed call. The candidate's side runs the in-process tripwires, trusted only as bad news.

Rationale: docs/design/judge-process.md#side
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path

import torch

from kernelcraft.builder.cache import BuildCache
from kernelcraft.devices import arch_for
from kernelcraft.judge.process import arena, heap, isolation, modelstate, tuning
from kernelcraft.judge.tripwires import guards, calls as tripwires
from kernelcraft.judge.correctness.compare import has_real_storage, is_plain_tensor
from kernelcraft.judge.process.failures import classify
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.wire import SideEnd

# a "large" output (docs/design/judge-process.md#worker): one per side at a time, read in place
LARGE_OUTPUT_BYTES = 1 << 30
LARGE_OUTPUT_VAR = "KERNELCRAFT_JUDGE_LARGE_BYTES"  # overrides it (the GPU tests force the large-output paths with 0)


def large_bytes() -> int:
    return int(os.environ.get(LARGE_OUTPUT_VAR) or LARGE_OUTPUT_BYTES)


def import_file(path: str, name: str):
    """Import a module from a file under `name` (registered in sys.modules: dataclasses and pickling need it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _plain(value):
    """A non-tensor output as JSON carries it: plain scalars as they are, anything else as its repr."""
    return value if isinstance(value, (int, float, bool, str, type(None))) else repr(value)


class Side:
    def __init__(self, role: str):
        self.role = role
        self.phase = "start"
        self.model = None
        self.inputs: list = []
        self.values: list = []
        self.outs: list = []
        self._last_out = None  # the last forward's output (the audit's snapshot check reads it)
        self._null_outs: list | None = None  # the side's own buffers the null copies the output arena into
        self.out_kind = "tensor"
        self.large = False  # outputs above large_bytes() (set with the output arena, `cmd_outputs`)
        self.build: BuildCache | None = None
        self.state = None
        self.path = ""
        self.peers: frozenset[int] = frozenset()  # the judge and the other side: not the candidate's processes
        self.end: SideEnd | None = None  # the wire, for a first call's ask for the device alone (`_ask_alone`)

    # -- commands ---------------------------------------------------------------------------------------
    def cmd_prepare(self, msg: dict, fds) -> dict:
        """Everything of `import` but the candidate's own module: the device, strict mode's kernel tracer, the build
        cache and the trusted libraries it will import (`candidate.preloads`). No candidate code runs, so the judge
        asks for it before it takes the device lock (`torch.compile`'s inductor import takes ~2 s of construction,
        which would otherwise run under the lock)."""
        if getattr(self, "_prepared", False):
            return {"type": "ok"}
        self.phase = "import"
        steps, t = {}, time.perf_counter()

        def step(name: str) -> None:  # seconds of each part, for the verdict's `env.prepare_s`
            nonlocal t
            now = time.perf_counter()
            steps[name] = round(now - t, 4)
            t = now

        self.device = torch.device(msg["device"])
        self.path = msg["path"]
        self.guarded = msg.get("guarded", True)
        if msg.get("nice"):  # a prebuild: below the timed evaluations (its compilers inherit this)
            os.nice(int(msg["nice"]))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            torch.cuda.init()
            step("cuda")
            if self.role == "candidate" and msg.get("strict"):
                tripwires.profile_kernels(lambda: torch.zeros(1, device=self.device), self.device)
                step("kernel_tracer")
        cap = torch.cuda.get_device_capability(0) if self.device.type == "cuda" else None
        if self.role == "candidate":
            self.build = BuildCache(Path(msg["cache_dir"]) / "ext", msg.get("arch") or arch_for(cap))
            self.build.install(count_calls=bool(msg.get("strict")))
            step("build_cache")
            for name in msg.get("preload", ()):  # trusted libraries (triton, inductor) before the candidate
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - the candidate's own import will say so
                    pass
            step("preload")
            self.state = guards.ProcessState.capture()
            self.state.watch_harness(None)
            step("process_state")
        self._prepared = True
        return {"type": "ok", "steps_s": steps}

    def cmd_import(self, msg: dict, fds) -> dict:
        self.cmd_prepare(msg, fds)
        self.phase = "import"
        mod = import_file(self.path, "kernelcraft_" + self.role)
        cls_name = "ModelNew" if self.role == "candidate" else "Model"
        self.cls = getattr(mod, cls_name, None)
        if not isinstance(self.cls, type):
            if self.role == "candidate":
                raise Reject("compile_error", ["no_modelnew"], "the candidate defines no class ModelNew")
            raise Reject("runtime_error", ["task_error"], "the task defines no class Model")
        out = {"type": "ok"}
        if self.build is not None:
            out["build_cache"] = {"builds": self.build.builds, "hits": self.build.hits}
            out["build_s"] = self.build.build_s
        if self.role == "candidate" and self.device.type == "cuda" and msg.get("strict"):
            out["kernel_tracer"] = tripwires.kernel_tracer_status()
        return out

    def cmd_construct(self, msg: dict, fds) -> dict:
        self.phase = "init"
        init = msg["init"]
        if self.role == "candidate":
            try:
                inspect.signature(self.cls).bind(*init)
            except TypeError as e:
                raise Reject("rejected", ["signature_mismatch"],
                             f"ModelNew({', '.join(type(a).__name__ for a in init)}) does not fit its constructor: {e}")
            except ValueError:
                pass
        torch.manual_seed(msg["seed"])
        model = self.cls(*init)
        self.model = model.to(self.device) if isinstance(model, torch.nn.Module) else model
        mode = modelstate.apply_mode(self, msg)  # the protocol's module mode
        if self.role == "reference":
            self._initial = modelstate.Snapshot(self.model, self.device)  # after the mode: `reset` restores it too
        # what `restore` puts back (stateful tasks' timed rounds); restoring clones, so the reference shares its copy
        self._plain0 = self._initial.attrs if self.role == "reference" else modelstate.plain_state(self.model)
        return {"type": "ok", **mode}

    def cmd_restore(self, msg: dict, fds) -> dict:
        """A stateful task's timed rounds (see `describe`): the plain-attribute state back to the constructed one
        before each round, on both sides, so every timed call of either computes from the same state."""
        modelstate.set_plain_state(self.model, getattr(self, "_plain0", []))
        return {"type": "ok"}

    def cmd_reset(self, msg: dict, fds) -> dict:
        """A warm reference made ready for the next candidate: exactly as it was right after construction
        (weights, buffers, tensors in plain attributes, module modes, RNG states). Also run after `describe`:
        a stateful reference must not be a call ahead of the candidate in the first trial."""
        self.phase = "reset"
        self._initial.restore(self.model)
        return {"type": "ok"}

    def cmd_idle(self, msg: dict, fds) -> dict:
        """A warm reference between jobs: its last output and the allocator's free blocks go back to the device
        (another task's evaluation may need them); what stays (weights, arenas) is reported in bytes."""
        self._last_out = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()
            return {"type": "ok", "reserved": int(torch.cuda.memory_reserved())}
        return {"type": "ok", "reserved": 0}

    def cmd_memory(self, msg: dict, fds) -> dict:
        """The allocator's peak device bytes since the last ask (the judge's footprint of a job, `jobs`)."""
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            peak = int(torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
            return {"type": "ok", "peak": peak}
        return {"type": "ok", "peak": 0}

    def cmd_trim(self, msg: dict, fds) -> dict:
        """A large output's trial is over: the allocator's cached blocks go back to the device (the other
        processes' float64 call and copies need the room)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"type": "ok"}

    def cmd_settle(self, msg: dict, fds) -> dict:
        """After the first call: the compile-worker pools `torch.compile` started here (inductor's subprocess pool)
        are shut. Idle, they sit in the side's process group, wake at every thaw, and the CPU ledger would bill the
        candidate for the judge's own freezing. A later compile starts them again, at its own cost."""
        compiler = sys.modules.get("torch._inductor.async_compile")
        shut = getattr(compiler, "shutdown_compile_workers", None)
        pools = len(getattr(compiler, "_pool_set", ()) or ())
        if pools and callable(shut):
            shut()
        return {"type": "ok", "pools": pools}

    def cmd_inputs(self, msg: dict, fds) -> dict:
        self.inputs = arena.attach(msg["arena"], fds)
        self.values = msg["values"]
        if self.role == "candidate":
            fwd = self.model.forward if isinstance(self.model, torch.nn.Module) else self.model
            try:
                inspect.signature(fwd).bind(*self._args())
            except TypeError as e:
                raise Reject("rejected", ["signature_mismatch"],
                             f"ModelNew.forward does not take the reference's {len(self.inputs)} inputs: {e}") from None
            except ValueError:
                pass
        return {"type": "ok"}

    def cmd_outputs(self, msg: dict, fds) -> dict:
        self.outs = arena.attach(msg["arena"], fds)
        self.out_kind = msg["kind"]
        self.large = sum(b.numel() * b.element_size() for b in self.outs if b is not None) > large_bytes()
        # what the null copies into: allocated here, so no null pays for an allocation the others do not
        self._null_outs = None if self.large else [None if b is None else torch.empty_like(b) for b in self.outs]
        return {"type": "ok"}

    def _args(self) -> list:
        return [v if t is None else t for t, v in zip(self.inputs, self.values)]

    def _forward(self):
        with torch.no_grad():
            return self.model(*self._args())

    def cmd_describe(self, msg: dict, fds) -> dict:
        """The reference's output structure: what the judge allocates output arenas for. The call is not one of
        the trials: the reference goes back to its constructed state after it (`reset`), or a stateful reference
        (an RNN keeping `self.hidden`) would be one call ahead of the candidate in every trial (CUDA-L1's
        level3/task33 and 34 would read as false `value_mismatch` verdicts that way)."""
        self.phase = "describe"
        before = modelstate.plain_state(self.model)
        out = self._forward()
        stateful = modelstate.changed(before, modelstate.plain_state(self.model))
        if getattr(self, "_initial", None) is not None:  # only shapes and dtypes are read below
            # the RNG stays as the call left it: a reference drawing random numbers in forward cannot be matched
            # anyway (precision's nondeterministic fallback), and RNG streams in step would only move that mismatch
            # into the timed rounds of a second candidate process
            self._initial.restore(self.model, rng=False)
        if isinstance(out, torch.Tensor):
            items, kind = [out], "tensor"
        elif isinstance(out, (tuple, list)):
            items, kind = list(out), "seq"
        else:
            raise Reject("runtime_error", ["task_error"],
                         f"the reference returned {type(out).__name__}; kernelcraft compares tensors and "
                         "tuples/lists of tensors")
        specs = []
        for o in items:
            if isinstance(o, torch.Tensor):
                specs.append({"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch.")})
            else:
                specs.append({"value": _plain(o)})
        convolutions = isinstance(self.model, torch.nn.Module) and any(
            isinstance(m, torch.nn.modules.conv._ConvNd) for m in self.model.modules())
        tf32 = self.device.type == "cuda" and bool(torch.backends.cudnn.allow_tf32) and convolutions  # (precision)
        return {"type": "ok", "kind": kind, "items": specs, "stateful": bool(stateful), "tf32_convolutions": tf32}

    def cmd_run(self, msg: dict, fds) -> dict:
        """One forward on the inputs in the arena, its outputs copied into the judge's arena, the device synced.
        The same request and the same path for every call the judge makes (trials, timed rounds, the weights
        trial): nothing in this process tells a checked call from a timed one. `keep_state` (a stateful task's
        first call, never judged) puts the plain-attribute and RNG state back afterwards. `tuning` (a first call that
        may autotune, beside other evaluations): the trusted benchmarkers ask for the device alone (`tuning.py`)."""
        self.phase = "check"
        hold = tuning.FirstCallHold(self._ask_alone) if msg.get("tuning") else contextlib.nullcontext()
        with hold:
            if msg.get("keep_state"):
                plain, rng = modelstate.plain_state(self.model), modelstate.rng_state(self.device)
                out = self._forward()
                modelstate.set_plain_state(self.model, plain)
                modelstate.set_rng_state(rng)
            else:
                if self.large:  # a large output: never two at once (the judge's memory notes), both sides alike
                    self._last_out = None
                out = self._forward()
        self._last_out = out
        return self._deliver(out)

    def _ask_alone(self) -> None:
        """Mid-call: ask the judge for the device alone and wait until it is granted (this process is frozen while
        the judge waits for the device)."""
        self.end.send({"type": tuning.ASK})
        msg, _ = self.end.recv()
        if msg != tuning.GRANTED:
            raise RuntimeError(f"the judge answered a first call's ask with {msg!r}")

    def _deliver(self, out) -> dict:
        """Everything a call does after forward: the structure checks, the copy into the judge's arena, the
        device sync, the reply. Only type-level calls touch the candidate's objects (`_structure`)."""
        items = self._structure(out)
        for buf, o in zip(self.outs, items):
            if buf is not None:
                buf.copy_(o)  # on a GPU on the current stream, before any sync: the snapshot `cmd_audit` reads
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return {"type": "done", "values": [None if buf is not None else _plain(o) for buf, o in zip(self.outs, items)]}

    def _structure(self, out) -> list:
        """The output as a list matching the reference's structure, or the reason it does not. Type-level calls
        only (`type(o)`, `torch.Tensor.<descriptor>.__get__(o)`): an attribute a candidate set on its own tensor
        never runs here."""
        if self.out_kind == "tensor":
            if not _is_tensor(out):
                raise Reject("incorrect", ["non_tensor_output"], f"expected a tensor, got {type(out).__name__}")
            items = [out]
        else:
            if type(out) not in (tuple, list):
                raise Reject("incorrect", ["non_tensor_output"],
                             f"expected a sequence of {len(self.outs)} outputs, got {type(out).__name__}")
            items = list.__iter__(out) if type(out) is list else tuple.__iter__(out)
            items = list(items)
        if len(items) != len(self.outs):
            raise Reject("incorrect", ["shape_mismatch"], f"expected {len(self.outs)} outputs, got {len(items)}")
        for i, (buf, o) in enumerate(zip(self.outs, items)):
            where = f"output {i}: " if len(items) > 1 else ""
            if buf is None:
                continue
            if not _is_tensor(o):
                raise Reject("incorrect", ["non_tensor_output"], f"{where}expected a tensor, got {type(o).__name__}")
            if self.guarded and (  # both roles: the same harness path, the same cost, in timed calls
                    not is_plain_tensor(o) or _LAYOUT(o) != torch.strided or not has_real_storage(o)):
                raise Reject("incorrect", ["lazy_output"], f"{where}got a {type(o).__module__}.{type(o).__name__} "
                             "without real strided storage, not a plain torch.Tensor")
            shape, dtype, device = tuple(_SHAPE(o)), _DTYPE(o), _DEVICE(o)
            if shape != tuple(buf.shape):
                raise Reject("incorrect", ["shape_mismatch"], f"{where}expected shape {tuple(buf.shape)}, got {shape}")
            if dtype != buf.dtype:
                raise Reject("incorrect", ["dtype_mismatch"], f"{where}expected dtype {buf.dtype}, got {dtype}")
            if device.type != buf.device.type:
                raise Reject("incorrect", ["device_mismatch"], f"{where}expected device {buf.device}, got {device}")
        return items

    def _snapshot_holds(self) -> bool:
        """The arena copy made before the device sync equals the output now (GPU): no work on another stream
        was still writing the output when forward returned."""
        last = self._last_out
        if last is None or self.device.type != "cuda":
            return True
        items = [last] if _is_tensor(last) else list(last) if type(last) in (tuple, list) else []
        return all(tripwires.same_values(b, o) for b, o in zip(self.outs, items) if b is not None and _is_tensor(o))

    def cmd_audit(self, msg: dict, fds) -> dict:
        """The candidate's in-process tripwires. `snapshot`: right after a checked call of this process (the judge has
        its output by then), whose arena copy must equal the output now; the candidate's processes share one arena,
        so a later audit may find another process's output there."""
        if self.role == "candidate" and self.guarded and msg.get("snapshot") and not self._snapshot_holds():
            raise Reject("rejected", ["extra_stream"], "the output changed after forward returned "
                         "(work still running on another stream)")
        if self.role == "candidate" and self.guarded and self.state is not None:
            guards.check_hooks()
            self.state.verify()
            guards.check_threads(self.state, self.path)
            guards.check_escaped_processes(exclude=self.peers)
            modelstate.verify_mode(self, "after a call")
        return {"type": "ok"}

    def cmd_peers(self, msg: dict, fds) -> dict:
        """The candidate's other processes (`judge.siblings`): its own, not processes it detached."""
        self.peers = self.peers | frozenset(int(p) for p in msg.get("pids", []))
        return {"type": "ok"}

    # weights as inputs (judge/correctness/weights.py): list, dump and load the model's state_dict through the judge's arenas
    def cmd_state(self, msg: dict, fds) -> dict:
        return modelstate.state(self, msg, fds)

    def cmd_dump_state(self, msg: dict, fds) -> dict:
        return modelstate.dump_state(self, msg, fds)

    def cmd_load_state(self, msg: dict, fds) -> dict:
        return modelstate.load_state(self, msg, fds)

    def cmd_fp64(self, msg: dict, fds) -> dict:
        """Calibrated precision: the reference's float64 evaluation of the current inputs (`fp64`), written into
        the judge's float64 arena (mapped by the first call, dropped by `release`). Reference only; a failure is a
        note for the judge (it falls back to the fixed rule), never the task's error."""
        if self.role != "reference":
            raise Reject("runtime_error", ["harness_error"], "only the reference's side evaluates in float64")
        if "arena" in msg:
            self.truth = arena.attach(msg["arena"], fds)
        if msg.get("release"):
            self.truth = None
            return {"type": "ok"}
        from kernelcraft.judge.correctness import fp64  # the reference's side only: never loaded with candidate code

        envelope = (self.device.type == "cuda" and bool(torch.backends.cudnn.allow_tf32)  # PyTorch's default: on
                    and msg.get("envelope", True))  # the judge asks until it has one (`precision.Rule.truth`)
        if self.large:  # the previous trial's output, refreshed by this trial's run: not kept beside the float64
            self._last_out = None  # copy
        return {"type": "ok", **fp64.evaluate(self.model, self._args(), self.truth, self.device, envelope,
                                              msg.get("picks"))}

    def cmd_null(self, msg: dict, fds) -> dict:
        """The empty round trip the judge subtracts: a call without forward that touches nothing the candidate
        made. It moves as many bytes as a call's output copy (the arena read into a buffer of this side's own,
        the arena itself left as it is) and syncs the device, so output size and the switch to this process's
        CUDA context are in the overhead as they are in every real call."""
        if self.large or self._null_outs is None or not any(b is not None for b in self.outs):
            if self.device.type == "cuda":
                if getattr(self, "_null_buf", None) is None:
                    self._null_buf = torch.zeros(1, device=self.device)
                self._null_buf.add_(1)
                torch.cuda.synchronize()
            return {"type": "done", "values": []}
        for dst, buf in zip(self._null_outs, self.outs):
            if buf is not None:
                dst.copy_(buf)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return {"type": "done", "values": []}

    def cmd_own_kernel(self, msg: dict, fds) -> dict:
        """Strict mode: an own kernel (inline extension or Triton) must run on the measured path."""
        names = msg.get("kernel_names") or []
        counts = self.build.call_counts
        before = dict(counts)
        kernels = tripwires.profile_kernels(self._forward, self.device)
        ran_ext = any(counts.get(k, 0) > before.get(k, 0) for k in counts)
        if kernels is not None and self.device.type == "cuda":
            ok = any(any(n in k for n in names) for k in kernels)
            evidence = f"kernels that ran: {', '.join(sorted(kernels)[:6]) or 'none'}"
        else:
            ok = ran_ext
            evidence = "no call into an inline extension or Triton kernel was seen"
        if not ok:
            raise Reject("rejected", ["no_custom_kernel"],
                         f"strict mode: no kernel of the candidate's own ran in forward ({evidence})")
        return {"type": "ok"}


_SHAPE = torch.Tensor.shape.__get__  # type-level descriptors: never an attribute of the candidate's object
_DTYPE = torch.Tensor.dtype.__get__
_DEVICE = torch.Tensor.device.__get__
_LAYOUT = torch.Tensor.layout.__get__


def _is_tensor(o) -> bool:
    return issubclass(type(o), torch.Tensor)


def serve(role: str, sock, protected: list[int], namespace: dict | None = None) -> None:
    """The side's main loop (never returns: the process exits when the judge closes the wire). `namespace`: the
    candidate's PID namespace, as the forker made it (`isolation.harden_side`)."""
    hardening = isolation.harden_side(role, protected, namespace)
    hardening["fixed_heap"] = heap.fix()  # both roles' malloc thresholds, before any model exists (judge/process/heap.py)
    end = SideEnd(sock)
    side = Side(role)
    side.peers = frozenset(protected)
    side.end = end
    send = end.send
    while True:
        try:
            msg, fds = end.recv()
        except Exception:  # noqa: BLE001 - the judge is gone
            os._exit(0)
        cmd = msg.get("cmd")
        if cmd == "exit":
            os._exit(0)
        try:
            if cmd == "hello":
                reply = {"type": "ok", "hardening": hardening}
            else:
                reply = getattr(side, "cmd_" + cmd)(msg, fds)
        except BaseException as e:  # noqa: BLE001 - every failure is reported, the judge decides
            rej = classify(e, side.phase, side.path, side.build)
            reply = {"type": "reject", "status": rej.status, "reasons": rej.reasons, "message": rej.message,
                     "phase": side.phase}
            if side.build is not None:
                reply["build_s"] = side.build.build_s
        try:
            send(reply)
        except Exception:  # noqa: BLE001
            os._exit(0)
