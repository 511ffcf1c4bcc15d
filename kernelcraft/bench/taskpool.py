"""Optimize runs side by side in one bench (`--task-jobs`, several GPUs): the threads, the GPU lease, the policy.

Design decisions
- `run_tasks` runs one callable per key, `jobs` at a time, and hands every result to `finished` in the calling
  thread, in completion order (1 at a time is the plain in-order loop, in this thread). A failed task sets the
  shared stop event so the running ones stop at their next step; what finished meanwhile is still handed over,
  then the error propagates. Ctrl-C propagates at once: the caller kills the workers.
- `DeviceLease` gives each run the least busy GPU of the bench's list when it starts; the run's own evaluations
  stay on it (its `best.py` is judged afterwards through the shared pool, on any GPU).
- `OneAtATime` wraps a policy not marked `thread_safe`: concurrent runs share it, one `propose` at a time.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from kernelcraft.search.optimize import Cancelled


class DeviceLease:
    """Which device an optimize run uses: the least busy of the bench's devices when it starts."""

    def __init__(self, devs: list[str]):
        self.busy = dict.fromkeys(devs, 0)
        self._lock = threading.Lock()

    def run(self, fn: Callable[[str], dict]) -> dict:
        with self._lock:
            d = min(self.busy, key=self.busy.get)
            self.busy[d] += 1
        try:
            return fn(d)
        finally:
            with self._lock:
                self.busy[d] -= 1


class OneAtATime:
    """A policy not marked thread-safe, shared by concurrent optimize runs: one `propose` at a time."""

    def __init__(self, policy):
        self.policy, self.name, self._lock = policy, getattr(policy, "name", ""), threading.Lock()

    def propose(self, ctx):
        with self._lock:
            return self.policy.propose(ctx)


def run_tasks(keys: list[str], jobs: int, stop: threading.Event, run_one: Callable[[str], dict],
              finished: Callable[[str, dict], int], label: Callable[[str], str] = str) -> int:
    """`run_one(key)` for every key, `jobs` at a time; the sum of `finished(key, result)` (module docstring)."""
    if min(jobs, len(keys)) <= 1:  # in order, in this thread
        return sum(finished(key, run_one(key)) for key in keys)
    n, futures, done = 0, {}, set()
    ex = ThreadPoolExecutor(max_workers=min(jobs, len(keys)), thread_name_prefix="kc-bench-optimize")
    try:
        def guarded(key: str) -> dict:  # a task whose turn comes after a stop never starts
            if stop.is_set():
                raise Cancelled(f"optimize {label(key)}: cancelled before it started")
            return run_one(key)

        futures = {ex.submit(guarded, key): key for key in keys}
        for f in as_completed(futures):
            n += finished(futures[f], f.result())
            done.add(f)
    except BaseException as e:
        ex.shutdown(wait=False, cancel_futures=True)  # nothing more starts, then the running ones stop
        stop.set()
        if isinstance(e, KeyboardInterrupt):  # no waiting: the caller kills their workers
            raise
        ex.shutdown(wait=True)  # a failed task: the others stop at their next step; keep what finished meanwhile
        for f, key in futures.items():
            if f not in done and f.done() and not f.cancelled() and f.exception() is None:
                finished(key, f.result())
        raise
    ex.shutdown()
    return n
