"""Optimize runs side by side in one bench (`--task-jobs`, several GPUs): the threads, the GPU lease, the policy.

`run_tasks` hands every result to `finished` in the calling thread, in completion order; a failed task or
Ctrl-C sets the shared stop event. `DeviceLease` gives each run the least busy GPU; `OneAtATime` serialises a
policy not marked `thread_safe`.
Rationale: docs/design/bench.md#taskpool
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable

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
    """`run_one(key)` for every key, `jobs` at a time; the sum of `finished(key, result)` (docs/design/bench.md#taskpool).

    The runs are daemon threads reporting on a queue, not a `ThreadPoolExecutor`: an executor's threads are joined
    at interpreter exit, and a Ctrl-C that lands while `as_completed` holds its futures' locks can leave one of them
    waiting forever on a future's lock, so `kernelcraft bench` would print "re-run the same command to resume" and
    never exit (`test_task_jobs_ctrl_c_stops_the_running_optimizations` covers it)."""
    if min(jobs, len(keys)) <= 1:  # in order, in this thread
        return sum(finished(key, run_one(key)) for key in keys)
    todo, done = queue.SimpleQueue(), queue.SimpleQueue()
    for key in keys:
        todo.put(key)

    def work() -> None:
        while True:
            try:
                key = todo.get_nowait()
            except queue.Empty:
                return
            if stop.is_set():  # a task whose turn comes after a stop never starts
                done.put((key, None, Cancelled(f"optimize {label(key)}: cancelled before it started")))
                continue
            try:
                done.put((key, run_one(key), None))
            except BaseException as e:  # noqa: BLE001 - handed to the calling thread, which raises it
                done.put((key, None, e))

    threads = [threading.Thread(target=work, daemon=True, name="kc-bench-optimize")
               for _ in range(min(jobs, len(keys)))]
    for t in threads:
        t.start()
    n = 0
    try:
        for _ in keys:
            key, result, error = done.get()
            if error is not None:
                raise error
            n += finished(key, result)
    except BaseException as e:
        stop.set()  # nothing more starts, and the running ones stop at their next step
        if isinstance(e, KeyboardInterrupt):  # no waiting: the caller kills their workers
            raise
        for t in threads:  # a failed task: keep what the others finished meanwhile
            t.join()
        while True:
            try:
                key, result, error = done.get_nowait()
            except queue.Empty:
                break
            if error is None:
                finished(key, result)
        raise
    return n
