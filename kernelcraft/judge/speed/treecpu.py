"""The kernel's own accounting of a side's process tree: CPU time the judge reads, never one a side reports.

`tree_cpu_ns(pid)` is the CPU time the tree under `pid` has used (live processes' CPU clocks plus reaped children);
two readings while it is frozen bracket what it used in between. `Ledger` bills the candidate's untimed CPU time
beyond the reference's (over an allowance) to its timed samples, and names the processes that used it.

Rationale: docs/design/judge-speed.md#treecpu
"""
from __future__ import annotations

import os
import time

from kernelcraft.judge.process.procs import descendants

_TICK_NS = 1e9 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
ALLOWANCE = 0.1  # the candidate's untimed windows may use this share more CPU than the reference's (noise) ...
ALLOWANCE_NS = 20_000  # ... plus this much per window, before anything is billed
TOP = 4  # processes named in the record's `untimed_cpu_top`


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
    return sum(tree_cpu_by_process(pid).values())


def tree_cpu_by_process(pid: int) -> dict[int, int]:
    """CPU time of each process of the tree under `pid` (its own, plus the children it reaped)."""
    return {p: process_cpu_ns(p) + reaped_children_ns(p) for p in [pid, *descendants(pid)]}


def process_name(pid: int, root: int) -> str:
    """`comm` of `pid` from /proc, marked `(side)` for the side's own process; `?` once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        name = "?"
    return f"{name} (side)" if pid == root else name


class Ledger:
    """Untimed CPU time per side during timing (docs/design/judge-speed.md#treecpu)."""

    def __init__(self):
        self.untimed_ns = {"reference": 0, "candidate": 0}
        self.windows = {"reference": 0, "candidate": 0}
        self.by_name: dict[str, int] = {}  # the candidate's untimed CPU time per process name

    def window(self, role: str, pid: int, fn):
        """Run `fn()` (one request to the side `pid`, frozen before and after) and add the CPU time its tree used."""
        before = tree_cpu_by_process(pid)
        out = fn()
        after = tree_cpu_by_process(pid)
        self.untimed_ns[role] += max(0, sum(after.values()) - sum(before.values()))
        self.windows[role] += 1
        if role == "candidate":
            for p, ns in after.items():
                ns -= before.get(p, 0)
                if ns > 0:
                    name = process_name(p, pid)
                    self.by_name[name] = self.by_name.get(name, 0) + ns
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

    def top(self, n: int = TOP) -> dict[str, float]:
        """The candidate's processes (by name) that used the most untimed CPU time, in ms, largest first."""
        ranked = sorted(self.by_name.items(), key=lambda kv: -kv[1])[:n]
        return {name: round(ns / 1e6, 3) for name, ns in ranked}

    def record(self, rounds: int) -> dict:
        return {"untimed_cpu_ms": {k: round(v / 1e6, 3) for k, v in self.untimed_ns.items()},
                "untimed_windows": dict(self.windows), "billed_ms": round(self.billed_ms(rounds), 6),
                "untimed_cpu_top": self.top()}


def host_cpu_jiffies(stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU of the host since boot (`/proc/stat`'s first line: idle and iowait
    are not busy), or None where there is no such file."""
    try:
        with open(stat) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return total - fields[3] - fields[4], total


def host_busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The host's busy cores on average between two `host_cpu_jiffies` readings (every process's work, the timed
    sides' included), or None."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    cpus = os.cpu_count() or 1
    return round((after[0] - before[0]) / (after[1] - before[1]) * cpus, 2)
