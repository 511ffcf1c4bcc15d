"""Who else used the CPU while a test ran: a pytest plugin that makes timing flakes on the 2-core CI diagnosable.

Design decisions
- Timing tests on a 2-core machine fail when something else burns a core during them. The suite's own
  candidates are the usual suspects (a worker, server or thread a test left running), the host the other.
  For every test this records the CPU seconds of processes that were alive before the test began (the
  pytest process itself excluded: it is the test) and the machine's steal time, from /proc; nothing else.
- It reports, it never fails a test, and only on failed tests: the terminal summary lists the failed tests
  during which leftovers used more than `THRESHOLD_S` or the host stole more than that, with the busiest
  processes' command lines. A run where every test passed prints nothing. Processes a test rightly shares with earlier ones (the worker zygote, warm judges) count
  too: the list is a lead to read, not a verdict. A flaky timing failure in CI then says whether it was load, and whose.
- Linux only (/proc); elsewhere it does nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

THRESHOLD_S = 1.0
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PROC = Path("/proc")


def _cpu_by_pid() -> dict[int, float]:
    out = {}
    for d in PROC.iterdir() if PROC.is_dir() else ():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(d.name)] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    return out


def _steal() -> float:
    try:
        cpu = (PROC / "stat").read_text().splitlines()[0].split()
        return int(cpu[8]) / TICK if len(cpu) > 8 else 0.0
    except OSError:
        return 0.0


def _cmdline(pid: int) -> str:
    try:
        cmd = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return "?"
    return " ".join(cmd)[:120]


class CpuWatch:
    def __init__(self):
        self.me = os.getpid()
        self.before: dict[int, float] = {}
        self.steal0 = 0.0
        self.seen: list[tuple[str, float, float, list[tuple[float, int, str]]]] = []
        self.failed: set[str] = set()

    def pytest_runtest_setup(self, item):
        self.before, self.steal0 = _cpu_by_pid(), _steal()

    def pytest_runtest_teardown(self, item):
        after, steal = _cpu_by_pid(), _steal() - self.steal0
        busy = sorted(((after[p] - t, p, _cmdline(p)) for p, t in self.before.items()
                       if p != self.me and p in after and after[p] - t > 0.05), reverse=True)
        others = sum(b[0] for b in busy)
        if others > THRESHOLD_S or steal > THRESHOLD_S:
            self.seen.append((item.nodeid, others, steal, busy[:3]))

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter):
        rows = sorted((s for s in self.seen if s[0] in self.failed), key=lambda s: -s[1] - s[2])
        if not rows:
            return
        tr = terminalreporter
        tr.section("CPU used by processes older than the failed test (cpu_watch)")
        for nodeid, others, steal, busy in rows[:15]:
            tr.write_line(f"FAILED {nodeid}: older processes {others:.1f} s, host steal {steal:.1f} s")
            for sec, pid, cmd in busy:
                tr.write_line(f"    {sec:6.1f} s  pid {pid}  {cmd}")


def register(config) -> None:
    if PROC.is_dir():
        config.pluginmanager.register(CpuWatch(), "kc_cpu_watch")
