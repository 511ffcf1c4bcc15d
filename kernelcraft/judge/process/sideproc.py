"""The judge's handle on one side process: fork it, freeze and thaw it, time a request, read its reply.

Every request thaws the side, sends, waits and freezes it again, so a side runs only while the judge waits on it;
`timed` is the same round trip under the judge's clock. A reply is trusted only as bad news; bytes sent outside a
request are a violation; a reference's out-of-memory at a size it already ran is the harness's, not the task's.

Rationale: docs/design/judge-process.md#sideproc
"""
from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Callable

from kernelcraft.judge.process import freeze, side as side_mod, tuning
from kernelcraft.judge.speed import timing
from kernelcraft.judge.reject import Reject
from kernelcraft.judge.process.procs import children, descendants, describe_signal
from kernelcraft.judge.process.wire import Closed, JudgeEnd
from kernelcraft.verdict import REASONS

BAD_STATUSES = ("incorrect", "compile_error", "runtime_error", "timeout", "rejected")
RUN = {"cmd": "run"}  # the one request that runs a forward: trials, timed rounds and the weights trial alike
NULL = {"cmd": "null"}  # the empty round trip (`side.Side.cmd_null`)
PREEMPT_POLL_S = 0.02  # how often a running request asks whether a timer waits for the device


def _signal_name(status: int) -> str:
    if os.WIFSIGNALED(status):
        return describe_signal(os.WTERMSIG(status))
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)} (os._exit or sys.exit?)"
    return f"wait status {status}"


class SideProc:
    """The judge's handle on one side process."""

    def __init__(self, role: str, pid: int, sock: socket.socket, log_path: str | None = None):
        self.role, self.pid, self.end = role, pid, JudgeEnd(sock)
        self.log_path = log_path  # where its output goes when not the judge's own log (a warm judge's later job)
        self.frozen = False
        self.preempt = None  # Callable[[SideProc | None], None] while the evaluation shares the device
        self.phase = "start"
        self.build_s = 0.0
        self.ran = False  # the reference: has run a forward at the task's size (its `describe`, or a warm judge's)
        self.init_pid: int | None = None  # a candidate in a PID namespace of its own: that namespace's pid 1
        self.namespace: str | None = None  # its kind (`isolation`), None without one

    @classmethod
    def fork(cls, role: str, protected: list[int], close: list[int]) -> "SideProc":
        """Fork a side. `close`: the judge's descriptors the side must not keep (the result channel, the other
        side's wire). Only those: descriptors the zygote's imports opened (NVML's, CUDA's) stay, since the
        libraries that own them believe them open."""
        mine, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the side: own session, stdin (the job) and the judge's descriptors closed
            try:
                os.setsid()
                for fd in [0, mine.fileno(), *close]:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                side_mod.serve(role, theirs, protected)
            finally:
                os._exit(0)
        theirs.close()
        return cls(role, pid, mine)

    @classmethod
    def from_forker(cls, forker, *, cwd: str, log_path: str | None, tag: str | None,
                    protected: list[int]) -> "SideProc":
        """A candidate side made by the judge's CUDA-free forker (`forker`): the judge's child all the same, in a
        PID namespace of its own where the host allows one."""
        pid, sock, ns = forker.candidate(cwd=cwd, log_path=log_path, tag=tag, protected=protected, close_in_side=[])
        side = cls("candidate", pid, sock, log_path)
        side.init_pid, side.namespace = ns.get("init"), ns.get("kind")
        return side

    def tree(self) -> list[int]:
        """This side and every process below it now (with its namespace init's, where orphans land)."""
        return [self.pid] + descendants(self.pid) + (descendants(self.init_pid) if self.init_pid else [])

    def freeze(self) -> None:
        if not self.frozen:
            freeze.freeze(self.pid)
            self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            freeze.thaw(self.pid)
            self.frozen = False

    def request(self, msg: dict, fds=(), phase: str | None = None, on_ask: Callable[[], None] | None = None) -> dict:
        """Thaw, send, wait for the reply, freeze. `preempt` (set by the evaluation while it shares the device) is
        asked before the side runs and every `PREEMPT_POLL_S` while it runs: it may freeze the side and give the
        device to a timer for a while (`Evaluation.step_aside_if_wanted`). `on_ask` (a first call's, `tuning.py`):
        the side may ask once, mid-request, for the device alone; it is frozen while `on_ask` takes the device,
        then thawed and told. An ask anywhere else is a violation (`check`)."""
        self.phase = phase or self.phase
        try:
            if self.preempt is not None:
                self.preempt(None)
            self.thaw()
            self.end.send(msg, fds)
            reply = self._await_reply()
            if on_ask is not None and reply.get("type") == tuning.ASK:
                self.freeze()
                on_ask()
                self.thaw()
                self.end.send(tuning.GRANTED)
                reply = self._await_reply()
            self.freeze()
        except (Closed, ValueError, freeze.SideGone) as e:
            raise self.death(e) from None
        if self.end.pending():
            raise Reject("rejected", ["forbidden_construct"], f"the {self.role} process wrote to the judge's "
                         "wire outside a request (a reply sent ahead of time)")
        return self.check(reply)

    def _await_reply(self) -> dict:
        while self.preempt is not None and not self.end.wait(PREEMPT_POLL_S):
            self.preempt(self)
        return self.end.recv()

    def timed(self, msg: dict, clock: timing.RoundTripClock) -> tuple[float, float, dict]:
        """(ms from thaw until this side is frozen again and the device is idle, the device work it left
        behind after `done`, the reply). The freeze and one idle probe are in every sample, the null's
        included, so the overhead subtraction removes them; device work that ran while the side was being
        frozen is billed to it, not to the judge's untimed work."""
        clock.flush()
        try:
            t0 = clock.now()
            self.thaw()
            self.end.send(msg)
            reply = self.end.recv()
            self.freeze()
            left = clock.settle()
            t1 = clock.now()
        except (Closed, ValueError, freeze.SideGone) as e:
            raise self.death(e) from None
        except timing.DeviceBusy as e:
            raise Reject("rejected", ["extra_stream"], f"{self.role}: {e}") from None
        if self.end.pending():  # a reply queued ahead of its request would end the next call's clock early
            raise Reject("rejected", ["forbidden_construct"], f"the {self.role} process wrote to the judge's "
                         "wire outside a request (a reply sent ahead of time)")
        return (t1 - t0) / 1e6, left, self.check(reply)

    def check(self, reply: dict) -> dict:
        if isinstance(reply.get("build_s"), (int, float)):
            self.build_s = float(reply["build_s"])  # a failed build's time is still build time
        if reply.get("type") == tuning.ASK:
            raise Reject("rejected", ["forbidden_construct"], f"the {self.role} process asked for the device alone "
                         "outside its first call's benchmarks (or twice)")
        if reply.get("type") != "reject":
            return reply
        message = str(reply.get("message", ""))[:4000]
        if self.role == "reference":
            if self.ran and "out_of_memory" in (reply.get("reasons") or []):
                raise Reject("runtime_error", ["harness_error"], "the reference ran out of device memory after it "
                             "had run at this size: another process crowded the GPU, or the judge's own check held "
                             f"too much (neither the task's fault nor the candidate's): {message}")
            raise Reject("runtime_error", ["task_error"], f"the reference failed: {message}")
        status = reply.get("status") if reply.get("status") in BAD_STATUSES else "runtime_error"
        reasons = [r for r in reply.get("reasons", []) if isinstance(r, str) and r in REASONS][:4] or ["exception"]
        raise Reject(status, reasons, message)

    def death(self, exc: Exception) -> Reject:
        try:
            got, status = os.waitpid(self.pid, os.WNOHANG)
            if got == 0:
                os.kill(self.pid, signal.SIGKILL)
                got, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = getattr(exc, "status", -1)
        what = f"the {self.role} process died from {_signal_name(status)} during {self.phase}"
        if isinstance(exc, ValueError):
            what = f"the {self.role} process broke the wire protocol during {self.phase}: {exc}"
        if self.role == "reference":
            return Reject("runtime_error", ["task_error"], what)
        return Reject("runtime_error", ["crashed"], what + _log_tail(self.log_path))


def _log_tail(path: str | None = None, lines: int = 25, max_chars: int = 3000) -> str:
    try:
        text = Path(path or os.readlink("/proc/self/fd/1")).read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.strip().splitlines()[-lines:])[-max_chars:]
    return f"\n--- worker output (tail) ---\n{tail}" if tail else ""


def end_candidate(side: "SideProc | None", keep: set[int], wait_s: float = 2.0) -> None:
    """A candidate side and everything it started, killed and reaped (the end of a job, or a timing block's
    replaced process). In a PID namespace of its own, killing the namespace's init ends every process in it.
    Without one, what it started is re-parented to the judge (a child subreaper) when it dies — an honest
    torch.compile's worker pool, or orphans a cheat detached — so the judge's children outside `keep` (its
    reference side and forker, and a kept candidate's namespace init) are killed with their descendants and reaped
    until none is left: a later audit must not find them, and a warm judge must not carry them into the next
    candidate's job."""
    if side is not None:
        doomed = [side.pid] + descendants(side.pid) + ([side.init_pid] if side.init_pid else [])
        try:
            os.killpg(side.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _kill_all(doomed)
        for pid in (side.pid, side.init_pid):
            try:
                if pid:
                    os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    deadline = time.monotonic() + wait_s
    while True:
        left = [pid for pid in children(os.getpid()) if pid not in keep]
        if not left or time.monotonic() > deadline:
            return
        for pid in left:
            _kill_all([pid] + descendants(pid))
        # reaped without blocking, in whatever order they die: a namespace's init exits only once every process
        # of its namespace is reaped, and a candidate side of that namespace is the judge's child (a blocking wait
        # on the init first would wait forever)
        for pid in left:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.005)


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

