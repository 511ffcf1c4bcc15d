"""The device gate: one device shared by several evaluations' checks, exclusive for timed rounds.

Two flocks per device, each freed if its holder dies: the lock itself, held *shared* by every evaluation in a device
phase (construction, first calls, correctness trials, float64 truth, the weights trial) and *exclusively* by one
that times (or, under `lock_scope="device"`, by one evaluation from its construction to the end of its job); and
`<lock>.gate`, held exclusively by a timer from its wait to the end of its rounds, so no new sharer enters meanwhile
(writer preference), and shared for a moment by every sharer entering.

A sharer gives the device back whenever a timer waits (`wanted`): before each side request and while one runs
(`SideProc.request` polls; the running side is frozen first, so none of its code runs while the evaluation is out).
What a frozen side left queued still drains, so the timer waits for the device to answer at idle speed
(`RoundTripClock(floor_ms=...)`, against the lowest idle probe this device has shown, `idle_floor`) before its clock
calibrates. A `DeviceGate(None)` (no lock path) is a no-op.

Rationale: docs/design/judge-speed.md#gate
"""
from __future__ import annotations

import fcntl
import time
from pathlib import Path

SHARED, EXCLUSIVE = "shared", "exclusive"


class DeviceGate:
    """One evaluation's hold on its device: None → shared ⇄ exclusive → None."""

    def __init__(self, path: str | None):
        self.path = path
        self.mode: str | None = None
        self.stepped_aside = 0  # times this evaluation gave the device back to a timer
        self.out_s = 0.0  # seconds it was out
        self._lock = self._gate = self._probe = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._lock = open(path, "a")
            self._gate = open(path + ".gate", "a")
            self._probe = open(path + ".gate", "a")  # its own open file: a lock test that never meets ours

    # -- holding -------------------------------------------------------------------------------------------
    def share(self) -> None:
        """Enter a device phase beside other sharers; waits while a timer holds or waits for the device."""
        if self._lock is None or self.mode == SHARED:
            return
        if self.mode == EXCLUSIVE:
            fcntl.flock(self._lock, fcntl.LOCK_SH)  # a downgrade: no one waits on the lock while we hold the gate
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        else:
            fcntl.flock(self._gate, fcntl.LOCK_SH)
            fcntl.flock(self._lock, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.mode = SHARED

    def exclusive(self) -> None:
        """The device alone: new sharers are held at the gate, current ones step aside at their next poll."""
        if self._lock is None or self.mode == EXCLUSIVE:
            return
        if self.mode == SHARED:
            fcntl.flock(self._lock, fcntl.LOCK_UN)  # never an upgrade in place: two upgraders would deadlock
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.mode = EXCLUSIVE

    def release(self) -> None:
        if self._lock is None or self.mode is None:
            return
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        if self.mode == EXCLUSIVE:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.mode = None

    def close(self) -> None:
        self.release()
        for f in (self._lock, self._gate, self._probe):
            if f is not None:
                f.close()
        self._lock = self._gate = self._probe = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- stepping aside ------------------------------------------------------------------------------------
    def wanted(self) -> bool:
        """A sharer's question: does a timer hold or wait for the gate?"""
        if self._probe is None or self.mode != SHARED:
            return False
        try:
            fcntl.flock(self._probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._probe, fcntl.LOCK_UN)
        return False

    def step_aside(self) -> float:
        """Give the device back until the waiting timers are done, then share it again; seconds out. The caller
        has frozen its sides and finished its own device work first."""
        t0 = time.monotonic()
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self.mode = None
        self.share()
        out = time.monotonic() - t0
        self.stepped_aside += 1
        self.out_s += out
        return out

    # -- the device's idle speed ---------------------------------------------------------------------------
    def idle_floor(self) -> float | None:
        """The lowest idle-probe latency (ms) a timer has calibrated on this device, or None."""
        if not self.path:
            return None
        try:
            v = float(Path(self.path + ".idle").read_text().strip())
        except (OSError, ValueError):
            return None
        return v if v > 0 else None

    def record_idle(self, idle_ms: float) -> None:
        """Keep the lower of this calibration and the floor; only an exclusive holder writes."""
        if not self.path or self.mode != EXCLUSIVE or not idle_ms > 0:
            return
        floor = self.idle_floor()
        if floor is None or idle_ms < floor:
            Path(self.path + ".idle").write_text(f"{idle_ms:.6f}\n")
