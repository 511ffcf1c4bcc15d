"""Isolation between the judge's processes: who may touch whom, freezing a side, and audits.

Design decisions
- The judge process and the reference process make themselves non-dumpable (`PR_SET_DUMPABLE 0`): a
  process of the same user can then neither ptrace them nor open their /proc/PID/mem or /proc/PID/fd,
  whatever the host's Yama setting. The judge is a child subreaper, so anything the candidate detaches
  (double fork) is re-parented to it, where an audit sees it.
- The candidate process installs a seccomp filter on itself before any candidate code exists
  (`candidate_filter`): `setsid` (leaving the session that `killpg` freezes), `ptrace` and
  `process_vm_readv/writev` fail with EPERM, and so does every pid-taking syscall aimed at the judge or the
  reference (signals, pidfds, scheduler affinity/policy/priority, rlimits, I/O priority, page migration).
  Threads inherit it. Where seccomp is unavailable (another architecture, a kernel without it) the
  filter is skipped and `describe()` says so; the audits below still run.
- Freezing is SIGSTOP to the side's process group, then `waitpid(WUNTRACED)` on the side (a direct child
  of the judge), so "frozen" is a fact, not a request in flight; thawing is SIGCONT. `setpgid` stays
  allowed (ninja puts each compile job in its own group), so a descendant could leave the group: the
  audits catch it.
- Audits (`Audit`) run at random moments of the timing loop (the candidate cannot know when) and at its
  end: a process in the candidate's tree outside its process group, an orphan adopted by the judge, or a
  change in the reference's threads' CPU affinity, nice value or scheduling policy. Any of them is a
  rejection, never a number.
"""
from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct

from kernelcraft.judge.process.procs import children, descendants

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1

# syscall numbers: (always denied), {name: index of the pid argument}, {name: index of the signal argument}:
# SIGCONT is refused whatever the target (a stopped process runs again only on SIGCONT: the judge's alone to send)
_ARCH = {
    "x86_64": (0xC000003E, {"setsid": 112, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311},
               {"kill": (62, 0), "tkill": (200, 0), "tgkill": (234, 0), "pidfd_open": (434, 0),
                "pidfd_send_signal": (424, 0), "sched_setaffinity": (203, 0), "sched_setscheduler": (144, 0),
                "sched_setparam": (142, 0), "sched_setattr": (314, 0), "setpriority": (141, 1),
                "prlimit64": (302, 0), "ioprio_set": (251, 1), "migrate_pages": (256, 0), "move_pages": (279, 0),
                "perf_event_open": (298, 1)},
               {"kill": (62, 1), "tkill": (200, 1), "tgkill": (234, 2), "rt_sigqueueinfo": (129, 1),
                "rt_tgsigqueueinfo": (297, 2), "pidfd_send_signal": (424, 1)}),
    "aarch64": (0xC00000B7, {"setsid": 157, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271},
                {"kill": (129, 0), "tkill": (130, 0), "tgkill": (131, 0), "pidfd_open": (434, 0),
                 "pidfd_send_signal": (424, 0), "sched_setaffinity": (122, 0), "sched_setscheduler": (119, 0),
                 "sched_setparam": (118, 0), "sched_setattr": (274, 0), "setpriority": (140, 1),
                 "prlimit64": (261, 0), "ioprio_set": (30, 1), "migrate_pages": (238, 0), "move_pages": (239, 0),
                 "perf_event_open": (241, 1)},
                {"kill": (129, 1), "tkill": (130, 1), "tgkill": (131, 2), "rt_sigqueueinfo": (138, 1),
                 "rt_tgsigqueueinfo": (240, 2), "pidfd_send_signal": (424, 1)}),
}


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int = 0, arg3=0) -> bool:
    try:
        return _libc().prctl(option, arg, arg3, 0, 0) == 0
    except Exception:  # noqa: BLE001 - not Linux
        return False


def harden_judge() -> dict:
    """The judge process: non-dumpable, a child subreaper. Returns what took effect."""
    return {"non_dumpable": _prctl(_PR_SET_DUMPABLE, 0), "subreaper": _prctl(_PR_SET_CHILD_SUBREAPER, 1)}


def die_with_parent() -> bool:
    """SIGKILL this process when its parent dies (the forker with its judge)."""
    return _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def harden_side(role: str, protected: list[int]) -> dict:
    """In a freshly forked side: die with the judge; the reference goes non-dumpable. Both get the seccomp
    filter (`protected`: pids a side must not reach): the candidate because it must not reach the others, the
    reference so that both sides run their syscalls through the same filter (symmetric cost)."""
    out = {"pdeathsig": _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)}
    if role == "reference":
        out["non_dumpable"] = _prctl(_PR_SET_DUMPABLE, 0)
    out["seccomp"] = install_filter(protected)
    return out


def _filter_program(arch_id: int, denied: dict, targeted: dict, protected: list[int],
                    signalled: dict | None = None) -> list[tuple]:
    """A classic-BPF seccomp program: (code, jt, jf, k) tuples."""
    LD, JEQ, RET = 0x20, 0x15, 0x06
    # the protected pids, their process groups (-pid), and -1 (every process the user may signal)
    values = sorted({p & 0xFFFFFFFF for p in protected} | {(-p) & 0xFFFFFFFF for p in protected} | {0xFFFFFFFF})
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch_id), (RET, 0, 0, _RET_ALLOW), (LD, 0, 0, 0)]
    for nr in denied.values():
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, _RET_EPERM)]
    for nr, arg in targeted.values():
        # if nr matches: reload the pid argument's low word, compare with each protected value
        body = [(LD, 0, 0, 16 + 8 * arg)]
        for v in values:
            body += [(JEQ, 0, 1, v), (RET, 0, 0, _RET_EPERM)]
        body += [(LD, 0, 0, 0)]  # back to the syscall number for the next test
        prog += [(JEQ, 0, len(body), nr)] + body
    for nr, arg in (signalled or {}).values():
        # if nr matches: the signal argument's low word; SIGCONT is refused
        body = [(LD, 0, 0, 16 + 8 * arg), (JEQ, 0, 1, int(signal.SIGCONT)), (RET, 0, 0, _RET_EPERM), (LD, 0, 0, 0)]
        prog += [(JEQ, 0, len(body), nr)] + body
    prog.append((RET, 0, 0, _RET_ALLOW))
    return prog


SECCOMP_SWITCH = "KERNELCRAFT_SECCOMP"  # "0": no filter (diagnosis only; the verdict's env.isolation says so)


def install_filter(protected: list[int]) -> bool:
    """Install the candidate's seccomp filter on the calling thread (and so on every thread it starts)."""
    spec = _ARCH.get(platform.machine())
    if spec is None or os.environ.get(SECCOMP_SWITCH) == "0":
        return False
    arch_id, denied, targeted, signalled = spec
    prog = _filter_program(arch_id, denied, targeted, protected, signalled)
    if len(prog) > 4000:
        return False
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    if not _prctl(_PR_SET_NO_NEW_PRIVS, 1):
        return False
    try:
        return _libc().prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0
    except Exception:  # noqa: BLE001
        return False


# -- freezing ----------------------------------------------------------------------------------------------
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


# -- audits ------------------------------------------------------------------------------------------------
def _sched_state(pid: int) -> dict[str, tuple]:
    """Per thread of `pid`: (allowed CPUs, nice, policy), from /proc."""
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
            out[tid] = (cpus, fields[16], fields[38])  # nice (field 19), policy (field 41)
        except (OSError, IndexError):
            continue
    return out


class Audit:
    """What the candidate must not have done to the other processes, checked at random moments."""

    def __init__(self, judge_pid: int, sides: dict[str, int]):
        self.judge_pid, self.sides = judge_pid, sides
        # what every reference thread must still have: the judge's own state, which the sides inherited at
        # fork (taken from the judge, never from the reference, so a change made before this audit exists —
        # at the candidate's import, say — is still a change)
        self.expected = next(iter(_sched_state(judge_pid).values()), None)
        self.count = 0

    def candidates(self) -> list[int]:
        """The candidate's processes: `candidate`, and `candidate.N` while several are timed (`processes`)."""
        return [pid for role, pid in self.sides.items() if role.split(".")[0] == "candidate"]

    def problems(self) -> list[str]:
        """Every violation seen now (empty: clean)."""
        self.count += 1
        found = []
        for cand in self.candidates():
            for pid in descendants(cand):
                try:
                    if os.getpgid(pid) != cand:
                        found.append(f"process {pid} started by the candidate left its process group")
                except (ProcessLookupError, PermissionError):
                    continue
        adopted = [p for p in children(self.judge_pid) if p not in self.sides.values()]
        if adopted:
            found.append(f"processes detached from the candidate (double fork): {adopted[:5]}")
        if self.expected is not None:
            for tid, state in _sched_state(self.sides["reference"]).items():
                if state != self.expected:
                    found.append(f"the reference's thread {tid} was re-scheduled: affinity/nice/policy "
                                 f"{self.expected} -> {state}")
                    break
        return found

    def kill_strays(self) -> None:
        mine = [pid for cand in self.candidates() for pid in descendants(cand)]
        for pid in mine + [p for p in children(self.judge_pid) if p not in self.sides.values()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def describe() -> dict:
    """How the candidate's process is fenced off here (recorded in verdicts as `isolation`)."""
    return {"seccomp": platform.machine() in _ARCH and os.environ.get(SECCOMP_SWITCH) != "0",
            "arch": platform.machine()}
