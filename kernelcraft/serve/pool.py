"""The local scheduler: CPU build slots feed device timing slots; results stream in completion order.

Build slots prebuild inline extensions into the shared cache, timing slots run `evaluate`; each evaluation is
one fresh worker process. The slots of a device share it for construction, first calls and checks, and each has
it alone for its timed rounds (the device gate, `judge/speed/gate.py`). Every submission's `Future[Verdict]` is always resolved (a watchdog settles stuck evaluations and
replaces their slots); bad protocol knobs raise in `submit`. Slots come from a pluggable backend (`cluster`).
Rationale: docs/design/serve.md#pool
"""
from __future__ import annotations

import collections
import hashlib
import os
import sys
import threading
import time
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from kernelcraft.candidate import Candidate, load_candidate, needs_build, structure_problem
from kernelcraft.devices import arch_of, visible_devices
from kernelcraft.evaluate import _env, check_lock_scope, evaluate, prebuild
from kernelcraft.judge.caller import warm, zygote
from kernelcraft.judge.caller.runner import cache_root
from kernelcraft.judge.caller.screen import screen
from kernelcraft.protocol import Protocol
from kernelcraft.task import Task, load_task
from kernelcraft.verdict import Verdict

PER_SUBMISSION = ("best_known_speedup", "keep_workdir", "lock_scope")  # evaluate() options beside the protocol
MARGIN_S = 90.0  # beyond the runner's own limits (it may wait 30 s to reap a killed group)


def gpu_slots(gpus: int, cores: int | None = None, forked: bool | None = None) -> int:
    """Evaluations at once per GPU: enough that the GPU is rarely idle, as few as that takes (each holds three
    CUDA contexts, ~1.5 GB, and its start-up, compiles and checks take cores). On real candidates with the device
    gate, 4 and 8 slots gave the same throughput on one H200 with 16 cores (BENCHMARKS.md); the figures below
    are from evaluations holding the device from construction to the end of timing.
    Forked workers (`zygote`) start in ~0.7 s (CUDA context, kernel tracer) against ~1 s on the device: 4
    (H100, 16 cores, cache hits: 4 slots 31.6 candidates/min, first verdict 5 s; 10 slots 27.9/min, 16 s).
    Spawned ones (bwrap sandbox, `KERNELCRAFT_ZYGOTE=0`) take ~10 s to start: two thirds of the cores per
    GPU (5 slots gave 15 candidates/min, 10 gave 25). Both within 2..cap and by cores per GPU."""
    cores = cores or os.cpu_count() or 2
    cap = 4 if (zygote.will_fork() if forked is None else forked) else 12
    return max(2, min(cap, (2 * cores) // (3 * max(1, gpus))))


@dataclass(eq=False)
class _Item:
    task: Task
    cand: Candidate
    options: dict
    kind: str  # "cpu" | "cuda": which timing slots may take it
    device: str | None  # an exact slot device, or None for any slot of its kind
    future: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.monotonic)
    stage: str = "queued"
    deadline: float | None = None
    slot: "_Slot | None" = None
    settled: bool = False  # the static checks reject it: evaluate() answers without a worker


@dataclass(eq=False)
class _Slot:
    role: str  # "build" | "time"
    device: str  # "build" for build slots
    run: Callable  # build: (cand, arch, opts) -> Verdict|None; time: (task, cand, opts) -> Verdict
    retired: bool = False
    thread: threading.Thread | None = None


class LocalBackend:
    """Slots that call `evaluate`/`prebuild` in this process's threads (each spawns its own worker)."""

    def __init__(self, cache_dir=None):
        self.cache_dir = cache_dir

    def build_slot(self, index: int) -> Callable:
        def run(cand, arch, opts):
            return prebuild(cand, arch=arch, cache_dir=self.cache_dir, timeout_s=opts["protocol"].build_timeout_s)
        return run

    def timing_slot(self, device: str) -> Callable:
        return lambda task, cand, opts: evaluate(task, cand, device=device, cache_dir=self.cache_dir, **opts)

    def arch(self, device: str) -> str | None:
        return arch_of(device)

    def discard(self, run: Callable) -> None:
        """A stuck slot is being replaced (a local thread cannot be killed; it retires when it returns)."""

    def close(self) -> None:
        pass


class Pool:
    """Build slots + timing slots behind one queue. Thread-safe; use as a context manager.

    `devices`: "cpu", "cuda", a list like ["cuda:0", "cuda:1"], or None (all visible GPUs, else cpu).
    `per_device`: evaluations at once per device (default `gpu_slots` per GPU; on cpu, 2). `lock_scope`: "timing"
    (they share the device except while one times or tunes), "first_call" (an autotuning candidate's whole first
    call alone too) or "device" (each has it alone from construction to the end of its job; `evaluate`).
    `build_workers`: build slots (default: os.cpu_count()).
    `protocol` and knob keywords (e.g. trials=3, timing=False) are the protocol of every submission unless it
    overrides them.
    """

    def __init__(self, devices=None, *, per_device: int | None = None, build_workers: int | None = None,
                 cache_dir=None, backend=None, stall_s: float | None = None, protocol: Protocol | dict | None = None,
                 lock_scope: str = "timing", **knobs):
        self.protocol = Protocol.make(protocol, **knobs)  # every submission's base; ProtocolError if bad
        self.defaults: dict = {}
        self.backend = backend or LocalBackend(cache_dir)
        if backend is not None and hasattr(backend, "devices") and devices is None:
            devices = backend.devices()
        if devices is None:
            devices = visible_devices()
        elif isinstance(devices, str):
            devices = visible_devices() if devices == "cuda" else [devices]
        if not devices:
            raise ValueError("a pool needs at least one device")
        if not per_device:
            gpus = sum(1 for d in devices if d != "cpu")
            per_device = gpu_slots(gpus) if gpus else 2
        check_lock_scope(lock_scope)
        self.defaults["lock_scope"] = lock_scope
        self.devices = [d for d in devices for _ in range(per_device)]
        if isinstance(self.backend, LocalBackend):  # each slot's judge may wait idle for its task's next candidate
            warm.hold_at_least(len(self.devices))
        self.build_workers = max(1, build_workers or os.cpu_count() or 2)
        self.root = Path(getattr(self.backend, "cache_dir", None) or cache_dir or cache_root())
        self.stall_s = stall_s
        self._lock = threading.Condition()
        self._build_q: collections.deque[_Item] = collections.deque()
        self._ready: collections.deque[_Item] = collections.deque()
        self._active: set[_Item] = set()
        self._closing = False
        self._t0 = time.monotonic()
        self._done_times: collections.deque[float] = collections.deque(maxlen=10000)
        self._counts = collections.Counter()
        self._by_status = collections.Counter()
        self._slots: list[_Slot] = []
        for i in range(self.build_workers):
            self._start_slot(_Slot("build", "build", self.backend.build_slot(i)))
        for d in self.devices:
            self._start_slot(_Slot("time", d, self.backend.timing_slot(d)))
        self.arches = {d: self.backend.arch(d) for d in set(self.devices)}  # after the slots: Ray asks them
        self._watchdog = threading.Thread(target=self._watch, name="kc-pool-watchdog", daemon=True)
        self._watchdog.start()

    # -- submission --------------------------------------------------------------------------------
    def _options(self, protocol, options: dict) -> dict:
        """One submission's evaluate() options: the pool's protocol with this submission's overrides (validated
        here, so a bad knob raises in `submit`, not later in a slot), plus per-submission extras."""
        extras = {k: options.pop(k) for k in PER_SUBMISSION if k in options}
        proto = Protocol.make(protocol if protocol is not None else self.protocol, **options)
        return {**self.defaults, **extras, "protocol": proto}

    def _route(self, device: str | None) -> tuple[str, str | None]:
        kinds = {d.split(":")[0] for d in self.devices}
        if device is None:
            return ("cuda" if "cuda" in kinds else "cpu"), None
        if device == "cpu" or device == "cuda":
            if device not in kinds:
                raise ValueError(f"device {device!r} requested but this pool has only {sorted(set(self.devices))}")
            return device, None
        if device.startswith("cuda:"):
            if device in self.devices:
                return "cuda", device
            if "cuda" in self.devices:  # a cluster pool: GPUs are assigned by the cluster, any will do
                return "cuda", None
            raise ValueError(f"device {device!r} is not one of this pool's devices {sorted(set(self.devices))}")
        raise ValueError(f"unknown device {device!r}: use cpu, cuda or cuda:N")

    def submit(self, task, candidate, *, device: str | None = None, protocol: Protocol | dict | None = None,
               **options) -> "Future[Verdict]":
        """Queue one evaluation; the Future always resolves to a Verdict. `protocol` replaces the pool's,
        knob keywords (`trials=3`) override it; `best_known_speedup`/`keep_workdir` go to evaluate. Bad
        options raise here (`ProtocolError`, a ValueError)."""
        opts = self._options(protocol, options)
        kind, exact = self._route(device)
        item = _Item(load_task(task), load_candidate(candidate), opts, kind, exact)
        item.settled = self._screened_out(item)
        with self._lock:
            if self._closing:
                raise RuntimeError("the pool is closed")
            self._counts["submitted"] += 1
            if item.settled or needs_build(item.cand.source):
                self._build_q.append(item)  # build slots also settle what the screen rejects: no worker
            else:
                item.stage = "ready"
                self._ready.append(item)
            self._lock.notify_all()
        return item.future

    def stream(self, pairs: Iterable, **options) -> Iterator[tuple[int, Verdict]]:
        """(index, verdict) for each (task, candidate) pair, in completion order."""
        futures = {self.submit(t, c, **options): i for i, (t, c) in enumerate(pairs)}
        for f in as_completed(futures):
            yield futures[f], f.result()

    def map(self, pairs: Iterable, **options) -> list[Verdict]:
        """Verdicts in input order."""
        futures = [self.submit(t, c, **options) for t, c in pairs]
        return [f.result() for f in futures]

    def _screened_out(self, item: _Item) -> bool:
        """The static screen settles it (evaluate will reject it without running anything): no build."""
        src = item.cand.source
        if structure_problem(src):
            return True
        proto = item.options["protocol"]
        return proto.screen and bool(screen(src, proto.mode).findings)

    # -- slots -------------------------------------------------------------------------------------
    def _start_slot(self, slot: _Slot) -> None:
        slot.thread = threading.Thread(target=self._slot_loop, args=(slot,), daemon=True,
                                       name=f"kc-pool-{slot.role}-{slot.device}")
        self._slots.append(slot)
        slot.thread.start()

    def _take(self, slot: _Slot) -> _Item | None:
        with self._lock:
            while True:
                if slot.retired:
                    return None
                if slot.role == "build":
                    if self._build_q:
                        item = self._build_q.popleft()
                        break
                else:
                    item = next((it for it in self._ready if it.kind == slot.device.split(":")[0]
                                 and (it.device is None or it.device == slot.device)), None)
                    if item is not None:
                        self._ready.remove(item)
                        break
                if self._closing and (slot.role == "build" or not self._builds_pending()):
                    return None
                self._lock.wait()
            item.stage = "building" if slot.role == "build" else "timing"
            item.slot = slot
            item.deadline = time.monotonic() + self._stage_limit(item, slot.role)
            self._active.add(item)
            return item

    def _builds_pending(self) -> bool:
        return bool(self._build_q) or any(it.stage == "building" for it in self._active)

    def _stage_limit(self, item: _Item, role: str) -> float:
        if self.stall_s is not None:
            return self.stall_s
        proto = item.options["protocol"].resolved(item.kind)
        build, run = proto.build_timeout_s, proto.timeout_s
        return build + MARGIN_S if role == "build" else 2 * (build + run + MARGIN_S)  # 2: a remeasure

    def _slot_loop(self, slot: _Slot) -> None:
        while True:
            item = self._take(slot)
            if item is None:
                return
            try:
                if slot.role == "build":
                    verdict = self._build(slot, item)
                    if verdict is None:
                        with self._lock:
                            self._active.discard(item)
                            if not item.future.done():
                                item.stage, item.slot, item.deadline = "ready", None, None
                                self._ready.append(item)
                                self._lock.notify_all()
                        continue
                else:
                    verdict = slot.run(item.task, item.cand, item.options)
            except BaseException as e:  # noqa: BLE001 - a scheduler failure is a verdict too
                verdict = self._harness_verdict(item, "runtime_error", ["harness_error"],
                                                f"kernelcraft's scheduler failed on this evaluation "
                                                f"({slot.role} slot {slot.device}): {type(e).__name__}: {e}")
            self._finish(item, verdict)

    def _build(self, slot: _Slot, item: _Item) -> Verdict | None:
        if item.settled:
            return self._adopt(item, evaluate(item.task, item.cand, device="cpu", cache_dir=self.root, **item.options))
        arch = self._arch_for(item)
        marker = self.root / "prebuilt" / _marker_name(item.cand, arch)
        failed = marker.with_suffix(".json")
        if marker.exists():
            with self._lock:
                self._counts["build_hits"] += 1
            return None
        if failed.exists():
            with self._lock:
                self._counts["build_hits"] += 1
            return self._adopt(item, Verdict.model_validate_json(failed.read_text()))
        with self._lock:
            self._counts["builds"] += 1
        verdict = slot.run(item.cand, arch, item.options)
        marker.parent.mkdir(parents=True, exist_ok=True)
        if verdict is None:
            marker.touch()
            return None
        if verdict.status == "compile_error":
            tmp = failed.parent / f"{failed.name}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(verdict.model_dump_json())
            os.replace(tmp, failed)
        return self._adopt(item, verdict)

    def _arch_for(self, item: _Item) -> str | None:
        devs = [item.device] if item.device else [d for d in self.devices if d.split(":")[0] == item.kind]
        return self.arches.get(devs[0]) if devs else None

    def _adopt(self, item: _Item, v: Verdict) -> Verdict:
        """A build-stage verdict, relabelled as this submission's."""
        return v.model_copy(update=dict(task=item.task.name, mode=item.options["protocol"].mode,
                                        protocol=item.options["protocol"].resolved(item.kind), device=item.device or item.kind,
                                        wall_s=time.monotonic() - item.submitted))

    def _harness_verdict(self, item: _Item, status: str, reasons: list[str], message: str) -> Verdict:
        return Verdict(task=item.task.name, candidate_sha256=item.cand.sha256, device=item.device or item.kind,
                       status=status, reasons=reasons, message=message, mode=item.options["protocol"].mode,
                       protocol=item.options["protocol"].resolved(item.kind),
                       wall_s=time.monotonic() - item.submitted, env=_env(None))

    def _finish(self, item: _Item, verdict: Verdict) -> None:
        with self._lock:
            self._active.discard(item)
            if item.future.done():
                return  # the watchdog settled it already; a late answer is dropped
            item.stage = "done"
            self._counts["completed"] += 1
            self._by_status[verdict.status] += 1
            if "harness_error" in verdict.reasons:
                self._counts["harness_errors"] += 1
            self._done_times.append(time.monotonic())
            self._lock.notify_all()
        item.future.set_result(verdict)

    def _watch(self) -> None:
        while True:
            time.sleep(0.25 if self.stall_s is not None else 1.0)
            now = time.monotonic()
            with self._lock:
                if self._closing and not self._active and not self._ready and not self._build_q:
                    return
                overdue = [it for it in self._active if it.deadline is not None and now > it.deadline]
            for item in overdue:
                slot = item.slot
                self._finish(item, self._harness_verdict(
                    item, "timeout", ["timeout", "harness_error"],
                    f"kernelcraft's scheduler gave up on this evaluation: its {slot.role} slot ({slot.device}) "
                    f"did not return within {self._stage_limit(item, slot.role):g} s, beyond the worker's own "
                    "time limits; the slot was replaced"))
                with self._lock:
                    self._counts["stalled"] += 1
                    if slot.retired:
                        continue
                    slot.retired = True
                self.backend.discard(slot.run)
                fresh = self.backend.build_slot(0) if slot.role == "build" else self.backend.timing_slot(slot.device)
                self._start_slot(_Slot(slot.role, slot.device, fresh))

    # -- introspection and shutdown ------------------------------------------------------------------
    def stats(self) -> dict:
        now = time.monotonic()
        with self._lock:
            stages = collections.Counter(it.stage for it in self._active)
            window = min(300.0, max(now - self._t0, 1e-9))
            recent = sum(1 for t in self._done_times if now - t <= window)
            with_ext = self._counts["builds"] + self._counts["build_hits"]
            return {
                "queue_depth": len(self._build_q) + len(self._ready),
                "queued_build": len(self._build_q), "queued_timing": len(self._ready),
                "building": stages["building"], "timing": stages["timing"],
                "submitted": self._counts["submitted"], "completed": self._counts["completed"],
                "throughput_per_min": 60.0 * recent / window, "throughput_window_s": window,
                "by_status": dict(self._by_status),
                "build_cache": {"candidates_with_extensions": with_ext, "hits": self._counts["build_hits"],
                                "builds": self._counts["builds"],
                                "hit_rate": self._counts["build_hits"] / with_ext if with_ext else None},
                "stalled": self._counts["stalled"], "harness_errors": self._counts["harness_errors"],
                "build_slots": self.build_workers, "timing_slots": list(self.devices),
                "uptime_s": now - self._t0,
            }

    def close(self, *, cancel: bool = False, wait: bool = True) -> None:
        """Stop accepting work. Queued items are finished (or, with cancel=True, resolved as cancelled)."""
        with self._lock:
            self._closing = True
            dropped = list(self._build_q) + list(self._ready) if cancel else []
            if cancel:
                self._build_q.clear()
                self._ready.clear()
            self._lock.notify_all()
        for item in dropped:
            self._finish(item, self._harness_verdict(item, "runtime_error", ["harness_error"],
                                                     "the pool shut down before this candidate was evaluated"))
        if wait:
            for slot in list(self._slots):
                if not slot.retired and slot.thread is not threading.current_thread():
                    slot.thread.join()
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(cancel=exc[0] is not None)


def _marker_name(cand: Candidate, arch: str | None) -> str:
    import torch

    env = f"{arch or 'host'}-{torch.__version__}-{torch.version.cuda}-py{sys.version_info[0]}{sys.version_info[1]}"
    return f"{cand.sha256[:32]}-{hashlib.sha256(env.encode()).hexdigest()[:12]}"
