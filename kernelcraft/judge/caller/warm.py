"""Warm judges: judge processes kept between evaluations of the same task, with their reference side.

A judge whose job ended cleanly is kept idle under a key of everything that shapes its reference (task text,
device, resolved protocol, cache root, environment); the next candidate of that key reuses it, with a fresh
candidate side. Never kept after a timeout, a death, a forged channel or a `jobs.NOT_REUSABLE` reason. Bounded by
`MAX_IDLE` (raised to a pool's number of slots by `hold_at_least`), `MAX_IDLE_PER_KEY`, `IDLE_S` and
`IDLE_MEMORY_SHARE` of a GPU. `KERNELCRAFT_WARM=0` turns reuse off.

Rationale: docs/design/judge-caller.md#warm
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field

from kernelcraft.judge.process.procs import kill_tagged

ENV_SWITCH = "KERNELCRAFT_WARM"
MAX_IDLE = 4
MAX_IDLE_PER_KEY = 4
IDLE_S = 60.0
IDLE_MEMORY_SHARE = 0.25


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def key(*parts) -> str:
    """A warm key from the reference-shaping parts (strings, dicts: JSON with sorted keys)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(eq=False)
class WarmWorker:
    """An idle judge: the process, its result channel's read end, the tag it was started with (its own and
    its reference's processes carry it when spawned), the pids that must survive a job's clean-up."""
    proc: object
    r_fd: int
    tag: str
    pids: list[int]
    bwrapped: bool
    start: str
    idle_since: float = field(default_factory=time.monotonic)
    jobs: int = 1
    device: str | None = None  # the GPU it holds memory on (CUDA_VISIBLE_DEVICES), None on a CPU
    device_bytes: int = 0  # what it holds there while idle (its report; 0 when it made none)
    device_total: int = 0

    def alive(self) -> bool:
        try:
            return self.proc.poll() is None
        except Exception:  # noqa: BLE001
            return False

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in self.pids:  # its sides lead their own sessions
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        kill_tagged(self.tag)
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        try:
            os.close(self.r_fd)
        except OSError:
            pass


_IDLE: dict[str, list[WarmWorker]] = {}
_LOCK = threading.Lock()
_capacity = MAX_IDLE


def hold_at_least(n: int) -> int:
    """Keep up to `n` idle judges in all (never fewer than `MAX_IDLE`): a pool running n evaluations at once, so
    that each task's judges outlive the other tasks' rounds until its next round starts. Returns the bound."""
    global _capacity
    with _LOCK:
        _capacity = max(_capacity, int(n))
        return _capacity


def capacity() -> int:
    return _capacity


def take(k: str) -> WarmWorker | None:
    """An idle judge for this key (the most recently used: its caches are warmest), or None."""
    doomed = []
    with _LOCK:
        doomed += _expire_locked()
        got = None
        while _IDLE.get(k):
            w = _IDLE[k].pop()
            if w.alive():
                got = w
                break
            doomed.append(w)
        if k in _IDLE and not _IDLE[k]:
            del _IDLE[k]
    for w in doomed:
        w.kill()
    return got


def put(k: str, w: WarmWorker) -> None:
    w.idle_since = time.monotonic()
    doomed = []
    with _LOCK:
        _IDLE.setdefault(k, []).append(w)
        if len(_IDLE[k]) > MAX_IDLE_PER_KEY:
            doomed.append(_IDLE[k].pop(0))
        doomed += _expire_locked()
        everyone = sorted((x for v in _IDLE.values() for x in v), key=lambda x: x.idle_since)
        def drop(x: WarmWorker) -> None:
            doomed.append(x)
            _IDLE[next(kk for kk, v in _IDLE.items() if x in v)].remove(x)

        for x in everyone[:max(0, len(everyone) - _capacity)]:
            drop(x)
        if w.device is not None and w.device_total > 0:  # newest first: whoever would exceed the share goes
            held = 0
            for x in [x for x in reversed(everyone) if x.device == w.device and x not in doomed]:
                if held + x.device_bytes > IDLE_MEMORY_SHARE * w.device_total:
                    drop(x)
                else:
                    held += x.device_bytes
        for kk in [kk for kk, v in _IDLE.items() if not v]:
            del _IDLE[kk]
    for x in doomed:
        x.kill()


def _expire_locked() -> list[WarmWorker]:
    now, out = time.monotonic(), []
    for k in list(_IDLE):
        keep = [w for w in _IDLE[k] if now - w.idle_since <= IDLE_S]
        out += [w for w in _IDLE[k] if now - w.idle_since > IDLE_S]
        if keep:
            _IDLE[k] = keep
        else:
            del _IDLE[k]
    return out


def idle_count() -> int:
    with _LOCK:
        return sum(len(v) for v in _IDLE.values())


def discard_device(device: str | None) -> int:
    """Kill the idle judges holding memory on this GPU (a job ran out of memory beside them); how many."""
    if device is None:
        return 0
    with _LOCK:
        doomed = [w for v in _IDLE.values() for w in v if w.device == device]
        for k in list(_IDLE):
            _IDLE[k] = [w for w in _IDLE[k] if w.device != device]
            if not _IDLE[k]:
                del _IDLE[k]
    for w in doomed:
        w.kill()
    return len(doomed)


def discard_all() -> int:
    """Kill every idle judge (interpreter exit, an interrupted caller, a test's clean-up)."""
    with _LOCK:
        doomed = [w for v in _IDLE.values() for w in v]
        _IDLE.clear()
    for w in doomed:
        w.kill()
    return len(doomed)


atexit.register(discard_all)
