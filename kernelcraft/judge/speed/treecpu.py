"""The kernel's own accounting of a side's process tree: CPU time the judge reads, never one a side reports.

`tree_cpu_ns(pid)` is the CPU time the tree under `pid` has used (live processes' CPU clocks plus reaped children);
two readings while it is frozen bracket what it used in between. `Ledger` bills the candidate's untimed CPU time
beyond the reference's (over an allowance) to its timed samples.

Rationale: docs/design/judge-speed.md#treecpu
"""
from __future__ import annotations

import os
import time

from kernelcraft.judge.process.procs import descendants

_TICK_NS = 1e9 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
ALLOWANCE = 0.1  # the candidate's untimed windows may use this share more CPU than the reference's (noise) ...
ALLOWANCE_NS = 20_000  # ... plus this much per window, before anything is billed


def _process_clock(pid: int) -> int:
    """The CPU-time clock id of process `pid` (Linux: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED))."""
    return ((~pid) << 3) | 2


def process_cpu_ns(pid: int) -> int:
    """CPU time of one process, all its threads (exited ones too); 0 once it is gone."""
    try:
        return time.clock_gettime_ns(_process_clock(pid))
    except OSError:
        return 0


def reaped_children_ns(pid: int) -> int:
    """CPU time of the children `pid` has reaped (clock ticks, from /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int((int(fields[13]) + int(fields[14])) * _TICK_NS)  # cutime, cstime (stat fields 16, 17)
    except (OSError, IndexError, ValueError):
        return 0


def tree_cpu_ns(pid: int) -> int:
    """CPU time of the process tree under `pid` (docs/design/judge-speed.md#treecpu)."""
    return sum(process_cpu_ns(p) + reaped_children_ns(p) for p in [pid, *descendants(pid)])


class Ledger:
    """Untimed CPU time per side during timing (docs/design/judge-speed.md#treecpu)."""

    def __init__(self):
        self.untimed_ns = {"reference": 0, "candidate": 0}
        self.windows = {"reference": 0, "candidate": 0}

    def window(self, role: str, pid: int, fn):
        """Run `fn()` (one request to the side `pid`, frozen before and after) and add the CPU time its tree used."""
        before = tree_cpu_ns(pid)
        out = fn()
        self.untimed_ns[role] += max(0, tree_cpu_ns(pid) - before)
        self.windows[role] += 1
        return out

    def excess_ns(self) -> float:
        """The candidate's untimed CPU beyond the reference's per window, over its allowance, in total."""
        wr, wc = self.windows["reference"], self.windows["candidate"]
        if not wc:
            return 0.0
        per_ref = self.untimed_ns["reference"] / wr if wr else 0.0
        allowed = wc * (per_ref * (1 + ALLOWANCE) + ALLOWANCE_NS)
        return max(0.0, self.untimed_ns["candidate"] - allowed)

    def billed_ms(self, rounds: int) -> float:
        """The excess spread over `rounds` timed rounds (ms added to every candidate sample)."""
        return self.excess_ns() / 1e6 / rounds if rounds > 0 else 0.0

    def record(self, rounds: int) -> dict:
        return {"untimed_cpu_ms": {k: round(v / 1e6, 3) for k, v in self.untimed_ns.items()},
                "untimed_windows": dict(self.windows), "billed_ms": round(self.billed_ms(rounds), 6)}
