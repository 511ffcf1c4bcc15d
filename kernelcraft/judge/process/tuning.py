"""The first call's tuning, alone on the device: hooks a candidate process puts on the trusted libraries'
benchmarkers (inductor's `Benchmarker` family, Triton's autotuner and `triton.testing`) for its first call only.

The call shares the device while it compiles (CPU work) and asks the judge for the device alone at its first
benchmark, to the end of the call (`SideProc.request(on_ask=...)`). Invariants: hooks exist only while a first
call runs (`FirstCallHold` as a context); the judge is asked at most once; where no benchmarker could be hooked the
call asks before it starts, so it runs alone throughout. The hooks live in the candidate's process: a candidate
that removes them, or asks early, costs only itself (picks made on a shared device, or a longer hold).

Rationale: docs/design/judge-speed.md#gate
"""
from __future__ import annotations

import importlib
import inspect
import sys
import threading
from typing import Callable

ASK = "alone"  # the frame type a side sends to ask for the device alone (`SideProc.request`)
GRANTED = {"cmd": "granted"}  # the judge's answer, once the device is this evaluation's alone

INDUCTOR_BENCHMARKING = "torch._inductor.runtime.benchmarking"


def _subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        if c not in out:
            out.append(c)
            todo.extend(c.__subclasses__())
    return out


def targets() -> list[tuple[object, str]]:
    """(owner, attribute) of every benchmark entry point of the trusted libraries loaded in this process: each
    `benchmark*` method of inductor's benchmarkers but the CPU ones (class-level, so every instance is covered; a
    hook too many only starts the hold sooner, one too few tunes beside others), Triton's
    `Autotuner._bench`, and `triton.testing.do_bench` / `do_bench_cudagraph`."""
    out: list[tuple[object, str]] = []
    if "torch._inductor" in sys.modules:  # a compiled candidate: its benchmarkers, imported now if not yet
        try:
            importlib.import_module(INDUCTOR_BENCHMARKING)
        except Exception:  # noqa: BLE001 - another torch: no hook, the whole call is alone
            pass
    bench = sys.modules.get(INDUCTOR_BENCHMARKING)
    base = getattr(bench, "Benchmarker", None)
    if isinstance(base, type):
        for cls in _subclasses(base):
            for name, fn in list(vars(cls).items()):
                if name.startswith("benchmark") and "cpu" not in name and inspect.isfunction(fn):
                    out.append((cls, name))
    autotuner = getattr(sys.modules.get("triton.runtime.autotuner"), "Autotuner", None)
    if isinstance(autotuner, type) and inspect.isfunction(vars(autotuner).get("_bench")):
        out.append((autotuner, "_bench"))
    testing = sys.modules.get("triton.testing")
    for name in ("do_bench", "do_bench_cudagraph"):
        if callable(getattr(testing, name, None)):
            out.append((testing, name))
    return out


class FirstCallHold:
    """Hooks for one first call: each hooked entry point asks (`ask`, which blocks until the judge grants the
    device) before it runs, once for the whole call; on exit every hook is undone."""

    def __init__(self, ask: Callable[[], None]):
        self._ask = ask
        self.asked = False
        self._lock = threading.Lock()
        self._undo: list[tuple[object, str, object]] = []

    def ask(self) -> None:
        with self._lock:
            if self.asked:
                return
            self.asked = True
            self._ask()

    def _hook(self, owner: object, name: str) -> None:
        original = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
        hold = self

        def hooked(*args, **kwargs):
            hold.ask()
            return original(*args, **kwargs)

        hooked.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(owner, name, hooked)
        self._undo.append((owner, name, original))

    def __enter__(self) -> "FirstCallHold":
        for owner, name in targets():
            self._hook(owner, name)
        if not self._undo:  # nothing to hook: the whole call alone
            self.ask()
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)
