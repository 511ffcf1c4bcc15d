"""Freezing a side: SIGSTOP to its process group, confirmed by waitpid; SIGCONT thaws it.

`freeze` returns only once waitpid reports the side itself stopped (a fact, not a request in flight) and raises
`SideGone` where it exited instead. `running_threads` reads back from /proc which threads of a process still run;
`holds_lock` whether any of some processes holds a file lock (a side frozen holding one stalls whoever waits on it).
Only the judge thaws: the sides' seccomp filter refuses SIGCONT whatever the target (`isolation`).

Rationale: docs/design/judge-process.md#freeze
"""
from __future__ import annotations

import os
import signal


class SideGone(Exception):
    """The side process exited or was killed (its wait status is in `.status`)."""

    def __init__(self, status: int):
        super().__init__(f"wait status {status}")
        self.status = status


def freeze(pid: int) -> None:
    """Stop the side's whole process group and wait until the side itself is stopped."""
    try:
        os.killpg(pid, signal.SIGSTOP)
    except ProcessLookupError:  # not (yet) a group leader: stop the process itself, or waitpid never returns
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    while True:
        try:
            got, status = os.waitpid(pid, os.WUNTRACED)
        except ChildProcessError:
            raise SideGone(-1) from None
        if got == 0:
            continue
        if os.WIFSTOPPED(status):
            return
        raise SideGone(status)


def running_threads(pid: int) -> list[str]:
    """Threads of `pid` not stopped (state other than T/t, zombie or dead), from /proc."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("T", "t", "Z", "X", "x"):
            out.append(f"{pid}/{tid}")
    return out


def thaw(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def holds_lock(pids: list[int]) -> bool:
    """Whether any of `pids` holds a file lock (flock or POSIX; an open-file-description lock names no pid) now, from
    /proc/locks; a process blocked waiting for one ("->") holds nothing yet."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    holders = set()
    for line in lines:
        fields = line.split()
        if len(fields) >= 5 and fields[1] != "->" and fields[4].isdigit():
            holders.add(int(fields[4]))
    return not holders.isdisjoint(pids)
