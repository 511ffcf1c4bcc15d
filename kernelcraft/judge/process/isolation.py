"""Isolation between the judge's processes: who may touch whom, freezing a side, and audits.

The candidate's side runs in a PID namespace of its own where the host allows one (`KERNELCRAFT_PIDNS`) and under a
seccomp filter (`install_filter`) refusing calls aimed at the judge, the reference and the forker; the judge and the
reference are non-dumpable, and the reference holds blocked the signals only another process sends. Freezing is
SIGSTOP confirmed by waitpid. Audits (`Audit`) at random moments find escaped processes and a tampered reference: a
rejection, never a number. A candidate run as root is outside this model.

Rationale: docs/design/judge-process.md#isolation
"""
from __future__ import annotations

import ctypes
import os
import platform
import secrets
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
_PRIO_USER = 2  # setpriority's `which`: every process of a user
_IOPRIO_WHO_USER = 3  # ioprio_set's `which`: likewise

# Per architecture: the audit architecture id; {name: nr} always refused; {name: (nr, pid argument indices)} refused
# when a pid argument names a protected process (or its group, or -1); {name: (nr, signal argument index)} refused
# for SIGCONT whatever the target (a stopped process runs again only on SIGCONT: the judge's alone to send);
# {name: (nr, argument index, value)} refused when that argument has that value.
_ARCH = {
    "x86_64": (0xC000003E,
               {"setsid": 112, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165,
                "umount2": 166, "pivot_root": 155, "setns": 308, "open_tree": 428, "move_mount": 429, "fsopen": 430,
                "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442},
               {"kill": (62, (0,)), "tkill": (200, (0,)), "tgkill": (234, (0,)), "pidfd_open": (434, (0,)),
                "rt_sigqueueinfo": (129, (0,)), "rt_tgsigqueueinfo": (297, (0,)),
                "sched_setaffinity": (203, (0,)), "sched_setscheduler": (144, (0,)), "sched_setparam": (142, (0,)),
                "sched_setattr": (314, (0,)), "setpriority": (141, (1,)), "prlimit64": (302, (0,)),
                "ioprio_set": (251, (1,)), "migrate_pages": (256, (0,)), "move_pages": (279, (0,)),
                "perf_event_open": (298, (1,)), "kcmp": (312, (0, 1))},
               {"kill": (62, 1), "tkill": (200, 1), "tgkill": (234, 2), "rt_sigqueueinfo": (129, 1),
                "rt_tgsigqueueinfo": (297, 2), "pidfd_send_signal": (424, 1)},
               {"setpriority": (141, 0, _PRIO_USER), "ioprio_set": (251, 0, _IOPRIO_WHO_USER)}),
    "aarch64": (0xC00000B7,
                {"setsid": 157, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40,
                 "umount2": 39, "pivot_root": 41, "setns": 268, "open_tree": 428, "move_mount": 429, "fsopen": 430,
                 "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442},
                {"kill": (129, (0,)), "tkill": (130, (0,)), "tgkill": (131, (0,)), "pidfd_open": (434, (0,)),
                 "rt_sigqueueinfo": (138, (0,)), "rt_tgsigqueueinfo": (240, (0,)),
                 "sched_setaffinity": (122, (0,)), "sched_setscheduler": (119, (0,)), "sched_setparam": (118, (0,)),
                 "sched_setattr": (274, (0,)), "setpriority": (140, (1,)), "prlimit64": (261, (0,)),
                 "ioprio_set": (30, (1,)), "migrate_pages": (238, (0,)), "move_pages": (239, (0,)),
                 "perf_event_open": (241, (1,)), "kcmp": (272, (0, 1))},
                {"kill": (129, 1), "tkill": (130, 1), "tgkill": (131, 2), "rt_sigqueueinfo": (138, 1),
                 "rt_tgsigqueueinfo": (240, 2), "pidfd_send_signal": (424, 1)},
                {"setpriority": (140, 0, _PRIO_USER), "ioprio_set": (30, 0, _IOPRIO_WHO_USER)}),
}
_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}


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


# signals the reference never blocks: the unblockable ones, SIGCONT (the judge's thaw) and those ignored by default
# (blocked, they would be queued and read as pending); faults the kernel raises are delivered whatever the mask
_UNHELD = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT, signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH,
           signal.SIGPIPE}


def held_signals() -> set[int]:
    """What the reference holds blocked: every signal only another process would send it."""
    return {int(s) for s in signal.valid_signals() if s not in _UNHELD}  # (glibc keeps its own two out)


def harden_side(role: str, protected: list[int], namespace: dict | None = None) -> dict:
    """In a freshly forked side: die with the judge; the reference goes non-dumpable and holds the signals only
    another process sends blocked (`held_signals`: pending, they are evidence for the audits rather than its end).
    Both get the seccomp filter (`protected`: pids a side must not reach): the candidate because it must not reach
    the others, the reference so that both sides run their syscalls through the same filter (symmetric cost).
    `namespace`: the candidate's PID namespace as the forker made it ({"kind": ..., "note": ...})."""
    out = {"pdeathsig": _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)}
    if role == "reference":
        out["non_dumpable"] = _prctl(_PR_SET_DUMPABLE, 0)
        signal.pthread_sigmask(signal.SIG_BLOCK, held_signals())
        out["signals_held"] = True
    else:
        out["pid_namespace"] = (namespace or {}).get("kind")
        if (namespace or {}).get("note"):
            out["pid_namespace_note"] = str(namespace["note"])[:300]
    out["seccomp"] = install_filter(protected)
    return out


def _filter_program(arch_id: int, denied: dict, targeted: dict, protected: list[int],
                    signalled: dict | None = None, refused_when: dict | None = None) -> list[tuple]:
    """A classic-BPF seccomp program: (code, jt, jf, k) tuples. Arguments are compared on their low 32 bits."""
    LD, JEQ, RET = 0x20, 0x15, 0x06
    # the protected pids, their process groups (-pid), and -1 (every process the user may signal)
    values = sorted({p & 0xFFFFFFFF for p in protected} | {(-p) & 0xFFFFFFFF for p in protected} | {0xFFFFFFFF})
    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, arch_id), (RET, 0, 0, _RET_ALLOW), (LD, 0, 0, 0)]
    for nr in denied.values():
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, _RET_EPERM)]
    for nr, args in targeted.values():
        # if nr matches: reload each pid argument's low word, compare with each protected value
        body = []
        for arg in args:
            body += [(LD, 0, 0, 16 + 8 * arg)]
            for v in values:
                body += [(JEQ, 0, 1, v), (RET, 0, 0, _RET_EPERM)]
        body += [(LD, 0, 0, 0)]  # back to the syscall number for the next test
        prog += [(JEQ, 0, len(body), nr)] + body
    for nr, arg in (signalled or {}).values():
        # if nr matches: the signal argument's low word; SIGCONT is refused
        body = [(LD, 0, 0, 16 + 8 * arg), (JEQ, 0, 1, int(signal.SIGCONT)), (RET, 0, 0, _RET_EPERM), (LD, 0, 0, 0)]
        prog += [(JEQ, 0, len(body), nr)] + body
    for nr, arg, value in (refused_when or {}).values():
        body = [(LD, 0, 0, 16 + 8 * arg), (JEQ, 0, 1, value), (RET, 0, 0, _RET_EPERM), (LD, 0, 0, 0)]
        prog += [(JEQ, 0, len(body), nr)] + body
    prog.append((RET, 0, 0, _RET_ALLOW))
    return prog


SECCOMP_SWITCH = "KERNELCRAFT_SECCOMP"  # "0": no filter (diagnosis only; the verdict's env.isolation says so)


def install_filter(protected: list[int]) -> bool:
    """Install the candidate's seccomp filter on the calling thread (and so on every thread it starts)."""
    spec = _ARCH.get(platform.machine())
    if spec is None or os.environ.get(SECCOMP_SWITCH) == "0":
        return False
    prog = _filter_program(spec[0], spec[1], spec[2], protected, spec[3], spec[4])
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


# -- the candidate's PID namespace -------------------------------------------------------------------------
# auto (default) | pid | user | off: docs/design/judge-process.md#isolation
PIDNS_SWITCH = "KERNELCRAFT_PIDNS"
_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_SLAVE = 0x2, 0x4, 0x8, 0x4000, 0x80000
NAMESPACE_KINDS = {"pid": _CLONE_NEWPID | _CLONE_NEWNS, "user": _CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS}


def pidns_setting() -> str:
    """`KERNELCRAFT_PIDNS` read and checked: auto, pid, user or off. A ValueError names a bad value."""
    raw = os.environ.get(PIDNS_SWITCH, "")
    v = raw.strip().lower() or "auto"
    v = {"1": "auto", "on": "auto", "0": "off", "no": "off", "false": "off"}.get(v, v)
    if v not in ("auto", "off", *NAMESPACE_KINDS):
        raise ValueError(f"{PIDNS_SWITCH}={raw!r}: expected auto, pid, user or off")
    return v


def namespace_kinds() -> tuple[str, ...]:
    """The kinds of namespace to try for a candidate side, in order (`KERNELCRAFT_PIDNS`)."""
    v = pidns_setting()
    return {"auto": ("pid", "user"), "off": ()}.get(v, (v,))


def _raise_errno(what: str) -> None:
    e = ctypes.get_errno()
    raise OSError(e, f"{what}: {os.strerror(e)}")


def unshare_namespace(kind: str) -> None:
    """In the forker's intermediate process: every process it forks from now on lives in a new PID namespace and
    mount namespace (`kind` "user": in a new user namespace too, mapping only this process's own uid and gid).
    The first one forked is the namespace's pid 1 (`namespace_init`). Raises OSError."""
    uid, gid = os.geteuid(), os.getegid()
    if _libc().unshare(NAMESPACE_KINDS[kind]) != 0:
        _raise_errno(f"unshare ({kind})")
    if kind == "user":
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def setup_namespace() -> None:
    """In the namespace's pid 1, before any other process exists in it: mounts no longer propagate to the host,
    /proc shows this namespace only, and pid numbers start at a random point. Raises OSError."""
    libc = _libc()
    if libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        _raise_errno("mount --make-rslave /")
    if libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        _raise_errno("mount proc on /proc")
    try:  # numbering from 2 where this is refused (a read-only /proc/sys): still a namespace
        with open("/proc/sys/kernel/pid_max") as f:
            top = int(f.read())
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(1000 + secrets.randbelow(max(top - 3000, 1000))))
    except (OSError, ValueError):
        pass


def namespace_init(go_fd: int) -> None:
    """The life of a candidate namespace's pid 1, forked by the forker's intermediate after `setup_namespace`: it
    runs no candidate code and never returns. Non-dumpable; no signal handlers (a namespace's init ignores every
    signal from inside that it has no handler for, SIGKILL included); once `go_fd` says it is the judge's child
    it dies with the judge, and it reaps whatever is orphaned inside until it is killed — which ends every
    process in the namespace."""
    import faulthandler

    faulthandler.disable()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _prctl(_PR_SET_DUMPABLE, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    got = os.read(go_fd, 1)
    os.close(go_fd)
    if not got:  # the forker is gone, and with it the judge
        os._exit(0)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    while True:
        signal.sigwait({signal.SIGCHLD})
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def probe_namespace() -> tuple[str | None, str]:
    """(the first kind of `namespace_kinds()` that works here, or None; what failed on the way): each is tried on a
    throwaway namespace set up as a side's would be. Raises ValueError for a bad `KERNELCRAFT_PIDNS`."""
    why = []
    for kind in namespace_kinds():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                unshare_namespace(kind)
                init = os.fork()
                if init == 0:
                    try:
                        setup_namespace()
                        os.write(w, b"ok" if os.getpid() == 1 else b"not pid 1")
                    except BaseException as e:  # noqa: BLE001 - reported to the prober
                        os.write(w, str(e).encode()[:300])
                    finally:
                        os._exit(0)
                os.waitpid(init, 0)
            except BaseException as e:  # noqa: BLE001
                os.write(w, str(e).encode()[:300])
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            text = f.read().decode(errors="replace")
        os.waitpid(pid, 0)
        if text == "ok":
            return kind, "; ".join(why)
        why.append(f"{kind}: {text or 'the probe died'}")
    return None, "; ".join(why) or f"{PIDNS_SWITCH}=off"


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
def _clamps(tid: int) -> tuple[int, int] | None:
    """A thread's utilisation clamps (min, max) from sched_getattr, or None where the call is unavailable."""
    nr = _SCHED_GETATTR.get(platform.machine())
    if nr is None:
        return None
    buf = ctypes.create_string_buffer(56)  # struct sched_attr, SCHED_ATTR_SIZE_VER1
    if _libc().syscall(nr, tid, buf, 56, 0) != 0:
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


def describe() -> dict:
    """How the candidate's process is fenced off here (recorded in verdicts as `isolation`; the candidate's side
    adds what it got, `candidate.pid_namespace` among it)."""
    try:
        pidns = pidns_setting()
    except ValueError as e:
        pidns = str(e)
    return {"seccomp": platform.machine() in _ARCH and os.environ.get(SECCOMP_SWITCH) != "0",
            "arch": platform.machine(), "pid_namespace": pidns}
