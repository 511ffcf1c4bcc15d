"""Ctrl-C (and SIGTERM) for the long-running commands: acknowledged the moment it arrives.

Design decisions
- Python's default handler raises KeyboardInterrupt in the main thread, but the evaluation that is running
  lives in a worker process group of its own (it never sees the terminal's SIGINT) and the thread waiting
  for it finishes it first: a Ctrl-C went unanswered for as long as the evaluation had left. Here the handler
  says at once what it is stopping, sets the run's cancel event (so a verdict that arrives from a killed
  worker is dropped, never recorded as the candidate's), kills the live workers, and only then raises
  KeyboardInterrupt; the command catches it, says what was kept and exits 130.
- Workers a thread starts just after the kill are caught by a few follow-up kills over the next seconds
  (the cancel event stops any new evaluation from starting).
- A second Ctrl-C is a plain KeyboardInterrupt: no more waiting on anything.
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
