"""Processes of a judge process, read from /proc: what it started, and what escaped its process group.

Found two ways, each missing some alone: the environment tag (`WORKER_TAG_VAR`) and the process tree (`children`,
per thread). Invariant: this module imports nothing of kernelcraft (it is the bottom of the judge).

Rationale: docs/design/judge-process.md#procs
"""
from __future__ import annotations

import os
import signal

WORKER_TAG_VAR = "KERNELCRAFT_WORKER_TAG"
CHANNEL_FD_VAR = "KERNELCRAFT_CHANNEL_FD"  # the judge process's result channel (spawned workers; forked ones get it passed)


def tagged_processes(tag: str) -> list[int]:
    """Pids whose initial environment carries this worker's tag (the worker and all it started)."""
    needle = f"{WORKER_TAG_VAR}={tag}".encode() + b"\0"
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def children(pid: int) -> list[int]:
    """The direct children of `pid`, whichever of its threads they hang from (/proc/PID/task/TID/children)."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")  # an orphan may be re-parented to any thread
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


_SIGNAL_WORDS = {"SIGSEGV": "a segmentation fault", "SIGABRT": "an abort", "SIGBUS": "a bus error",
                 "SIGFPE": "a floating-point exception", "SIGKILL": "SIGKILL (out of host memory?)",
                 "SIGILL": "an illegal instruction"}


def describe_signal(sig: int) -> str:
    """A signal that killed a process, in words ("a segmentation fault"), for death messages."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return _SIGNAL_WORDS.get(name, name)


def kill_tagged(tag: str, keep=()) -> None:
    """Kill every process carrying the tag, except `keep` (a warm judge and its reference, kept for reuse)."""
    for pid in tagged_processes(tag):
        if pid in keep:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
