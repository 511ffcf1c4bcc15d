"""Audits: what the candidate must not have done to the other processes, read from /proc between the judge's steps
and at random moments of timing.

`Audit.problems` finds a process of the candidate's tree (with a namespace, everything in it) outside its process
group, an orphan adopted by the judge or by the namespace's init, and `reference_tampering`: the reference's threads
re-scheduled, its session's autogroup reniced, signals pending for it. A finding is a rejection, never a number;
`reference_tampering` also keeps a touched reference from being kept warm (`jobs`).

Rationale: docs/design/judge-process.md#audit
"""
from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct

from kernelcraft.judge.process.procs import children, descendants

_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}


def _clamps(tid: int) -> tuple[int, int] | None:
    """A thread's utilisation clamps (min, max) from sched_getattr, or None where the call is unavailable."""
    nr = _SCHED_GETATTR.get(platform.machine())
    if nr is None:
        return None
    buf = ctypes.create_string_buffer(56)  # struct sched_attr, SCHED_ATTR_SIZE_VER1
    if ctypes.CDLL(None, use_errno=True).syscall(nr, tid, buf, 56, 0) != 0:
        return None
    return struct.unpack_from("II", buf, 48)


def _sched_state(pid: int) -> dict[str, tuple]:
    """Per thread of `pid`: (allowed CPUs, nice, policy, utilisation clamps), from /proc and sched_getattr."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                cpus = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("Cpus_allowed_list")), "")
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[tid] = (cpus, fields[16], fields[38], _clamps(int(tid)))  # nice (field 19), policy (field 41)
        except (OSError, IndexError, ValueError):
            continue
    return out


def pending_signals(pid: int) -> dict[int, set[int]]:
    """{signal: the thread ids it is pending for} of `pid` (each thread's own queue, SigPnd, and the process's,
    ShdPnd, under the leader's id), from /proc."""
    out: dict[int, set[int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                masks = {k: int(v, 16) for k, v in (ln.split(":", 1) for ln in f
                                                     if ln.startswith(("SigPnd", "ShdPnd")))}
        except (OSError, ValueError):
            continue
        for key, mask in masks.items():
            for bit in range(64):
                if mask >> bit & 1:
                    out.setdefault(bit + 1, set()).add(int(tid) if key == "SigPnd" else pid)
    return out


def _signal_name(sig: int) -> str:
    if signal.SIGRTMIN < sig <= signal.SIGRTMAX:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _autogroup(pid: int) -> tuple[str, int] | None:
    """(the autogroup, its nice value) of `pid`'s session, from /proc/PID/autogroup; None where there is none."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X", "x")
    except (OSError, IndexError):
        return False


def reference_tampering(judge_pid: int, ref: int, expected: tuple | None = None) -> list[str]:
    """What another process did to the reference that is still visible: its threads re-scheduled (against
    `expected`, by default the judge's own first thread's state, which the sides inherited at fork), its session's
    autogroup reniced, signals pending for it. Also asked before a reference is kept warm for the next candidate,
    which must not be blamed for what this one left."""
    found = []
    expected = expected if expected is not None else next(iter(_sched_state(judge_pid).values()), None)
    if expected is not None:
        for tid, state in _sched_state(ref).items():
            if state != expected:
                found.append(f"the reference's thread {tid} was re-scheduled: affinity/nice/policy/clamps "
                             f"{expected} -> {state}")
                break
    # a session's autogroup starts at nice 0; a judge in the boot session has none of its own (nothing to read)
    mine, theirs = _autogroup(judge_pid), _autogroup(ref)
    if theirs and (mine is None or theirs[0] != mine[0]) and theirs[1] != 0:
        found.append(f"the reference's session was re-scheduled: its autogroup's nice value is {theirs[1]}")
    pending = pending_signals(ref)
    if pending:
        what = ", ".join(f"{_signal_name(s)} (threads {sorted(t)[:3]})" for s, t in sorted(pending.items())[:4])
        found.append(f"signals were sent to the reference (pending: {what})")
    return found


class Audit:
    """What the candidate must not have done to the other processes, checked at random moments.

    `sides`: role -> pid (reference, candidate, candidate.N, forker); `inits`: candidate pid -> the pid 1 of its
    namespace, where it has one (`watch` adds both)."""

    def __init__(self, judge_pid: int, sides: dict[str, int], inits: dict[int, int] | None = None):
        self.judge_pid, self.sides = judge_pid, sides
        self.inits = dict(inits or {})
        # what every reference thread must still have: the judge's own state, which the sides inherited at
        # fork (taken from the judge, never from the reference, so a change made before this audit exists —
        # at the candidate's import, say — is still a change)
        self.expected = next(iter(_sched_state(judge_pid).values()), None)
        self.count = 0

    def watch(self, role: str, pid: int, init: int | None = None) -> None:
        """A candidate process joins (`candidate.N`, `siblings`), with its namespace's init if any."""
        self.sides[role] = pid
        if init:
            self.inits[pid] = init

    def forget(self, role: str) -> None:
        pid = self.sides.pop(role, None)
        self.inits.pop(pid, None)

    def candidates(self) -> list[int]:
        """The candidate's processes: `candidate`, and `candidate.N` while several are timed (`processes`)."""
        return [pid for role, pid in self.sides.items() if role.split(".")[0] == "candidate"]

    def _trees(self) -> dict[int, list[int]]:
        """Per candidate process: every process below it, and everything in its namespace (orphans re-parented to
        the namespace's init included)."""
        out = {}
        for cand in self.candidates():
            init = self.inits.get(cand)
            out[cand] = descendants(cand) + ([p for p in descendants(init) if p != cand] if init else [])
        return out

    def problems(self) -> list[str]:
        """Every violation seen now (empty: clean)."""
        self.count += 1
        found = []
        for cand, tree in self._trees().items():
            for pid in tree:
                try:
                    if os.getpgid(pid) != cand:
                        found.append(f"process {pid} started by the candidate left its process group")
                except (ProcessLookupError, PermissionError):
                    continue
            init = self.inits.get(cand)
            orphans = [p for p in children(init) if p != cand and _live(p)] if init else []
            if orphans:
                found.append(f"processes detached from the candidate (double fork): {orphans[:5]}")
        known = set(self.sides.values()) | set(self.inits.values())
        adopted = [p for p in children(self.judge_pid) if p not in known]
        if adopted:
            found.append(f"processes detached from the candidate (double fork): {adopted[:5]}")
        return found + reference_tampering(self.judge_pid, self.sides["reference"], self.expected)

    def kill_strays(self) -> None:
        mine = [pid for tree in self._trees().values() for pid in tree]
        known = set(self.sides.values()) | set(self.inits.values())
        for pid in mine + [p for p in children(self.judge_pid) if p not in known]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
