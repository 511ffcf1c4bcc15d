"""Judges started while a task's candidates build, so the first verdicts after the builds do not wait for one.

Design decisions
- A judge's first job starts its processes, imports and constructs the reference and makes its arenas; every
  later candidate of the task reuses it (`judge.warm`). In a pool the first candidates of a task are built
  first (nvcc, ~10 s), and only then did their judges start, all at once: four cold judges per GPU, each with
  two CUDA contexts, were the three-process judge's whole deficit on the throughput benchmark's cold phase
  (first verdict 3-5 s later than the in-process judge's, BENCHMARKS.md). A real build (not a cache hit) is the
  window: the pool asks for a warm-up then (`Prewarmer.note`), and the judge is ready when the build is.
- Bounded: per task, protocol and device at most as many judges as the device has timing slots, and again only
  once those could have expired (`warm.IDLE_S`). The judges are ordinary idle judges: the same caps, the same
  expiry, killed with the others; a warm-up that fails costs nothing but its time (the evaluation starts cold
  and meets the same error itself).
- In threads of their own, off the pool's lock: a warm-up never holds up a submission or a slot. Backends without
  `prewarm` (a Ray cluster: its actors keep their own judges) are left alone.
"""
from __future__ import annotations

import threading
import time

from kernelcraft.judge import warm


class Prewarmer:
    def __init__(self, backend, per_device: int):
        self.backend, self.per_device = backend, per_device
        self._started: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def note(self, task, options: dict, devices: list[str]) -> None:
        """A candidate of `task` is being built for one of `devices`: start a judge on each device that has fewer
        than `per_device` recent warm-ups for this task and protocol."""
        if not hasattr(self.backend, "prewarm") or not warm.enabled():
            return
        now = time.monotonic()
        for device in devices:
            key = warm.key(task.sha256, options["protocol"].key(), options.get("lock_scope"), device)
            with self._lock:
                recent = [t for t in self._started.get(key, []) if now - t < warm.IDLE_S]
                if len(recent) >= self.per_device:
                    self._started[key] = recent
                    continue
                self._started[key] = recent + [now]
            threading.Thread(target=self._run, args=(task, device, options), daemon=True,
                             name=f"kc-prewarm-{device}").start()

    def _run(self, task, device: str, options: dict) -> None:
        try:
            self.backend.prewarm(task, device, options)
        except Exception:  # noqa: BLE001 - a warm-up is an optimisation: its evaluation starts cold instead
            pass
