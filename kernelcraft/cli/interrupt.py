"""Ctrl-C (and SIGTERM) for the long-running commands: acknowledged the moment it arrives.

The handler says what it stops, sets the run's cancel event (a verdict from a killed worker is dropped), kills
the live workers (and stragglers over the next seconds), then raises KeyboardInterrupt; the command exits 130.
A second Ctrl-C is a plain KeyboardInterrupt.
Rationale: docs/design/cli.md#interrupt
"""
from __future__ import annotations

import signal
import threading
import time
from typing import Callable

from kernelcraft.judge.caller.runner import kill_live_workers

EXIT_INTERRUPTED = 130


class Interrupts:
    """`with Interrupts(cancel, describe):` — on SIGINT/SIGTERM print `interrupted: <describe()>` on stderr,
    set `cancel`, kill the live workers, raise KeyboardInterrupt."""

    def __init__(self, cancel: threading.Event, describe: Callable[[], str], console):
        self.cancel, self.describe, self.console = cancel, describe, console
        self.fired = False
        self._previous = {}

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.fired:
            raise KeyboardInterrupt
        self.fired = True
        try:
            what = self.describe()
        except Exception:  # noqa: BLE001 - the acknowledgement must never fail
            what = "stopping the running evaluations"
        self.console.print(f"[yellow]interrupted[/yellow]: {what}…", highlight=False)
        self.cancel.set()
        kill_live_workers()
        threading.Thread(target=_kill_stragglers, daemon=True, name="kc-interrupt").start()
        raise KeyboardInterrupt


def _kill_stragglers(rounds: int = 15, every_s: float = 0.2) -> None:
    for _ in range(rounds):
        time.sleep(every_s)
        kill_live_workers()
