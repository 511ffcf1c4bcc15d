"""Isolation between the judge's processes: who may touch whom.

The candidate's side runs in a PID namespace of its own where the host allows one (`KERNELCRAFT_PIDNS`) and under a
seccomp filter (`install_filter`) refusing calls aimed at the judge, the reference and the forker; the judge and the
reference are non-dumpable, and the reference holds blocked the signals only another process sends. `describe` is
what a verdict records of it. Freezing a side is in `freeze`; the audits that look for what got past these fences
are in `audit`. A candidate run as root is outside this model.

Rationale: docs/design/judge-process.md#isolation
"""
from __future__ import annotations

import ctypes
import os
import platform
import secrets
import signal
import struct

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


def describe() -> dict:
    """How the candidate's process is fenced off here (recorded in verdicts as `isolation`; the candidate's side
    adds what it got, `candidate.pid_namespace` among it)."""
    try:
        pidns = pidns_setting()
    except ValueError as e:
        pidns = str(e)
    return {"seccomp": platform.machine() in _ARCH and os.environ.get(SECCOMP_SWITCH) != "0",
            "arch": platform.machine(), "pid_namespace": pidns}
